"""``dayzero memory MODEL``: per-device memory of every pipeline stage for a parallel layout."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from dayzero.cli.app import app
from dayzero.cli.common import (
    AcceleratorOpt,
    AttentionKernelOpt,
    ClusterOpt,
    DevicesOpt,
    DevicesPerNodeOpt,
    DocLenOpt,
    InterNodeOpt,
    JsonOpt,
    PowerLimitOpt,
    PrecisionOpt,
    TrustRemoteCodeOpt,
    cluster_from_options,
    console,
    emit_json,
    model_notes,
    print_model_notes,
    takes_layout,
    with_documents,
)
from dayzero.cli.next_steps import Step, cluster_flags, layout_flags, print_next
from dayzero.cli.option_groups import takes_groups
from dayzero.cli.recipe_options import RecipeOptions
from dayzero.cli.render import FitTable, styled
from dayzero.planner.targets import MEMORY_TARGET as TARGET
from dayzero.specs.layout_options import LayoutOptions
from dayzero.units import capacity, gib, gib_number

CATS = ("weights", "gradients", "optimizer", "activations", "temporary", "overhead")
HEADS = ("weights", "grads", "optim", "activ", "temp", "ovhd")  # the per-stage table's column heads


def gb(n: float) -> str:
    """Device memory, in GiB (dayzero.units): the unit is in the column or the sentence."""
    return gib_number(n)


def tb(n: float) -> str:
    """Model states before sharding, in decimal TB (parameters x bytes per parameter)."""
    return f"{n / 1e12:,.2f} TB"


def ranges(layers) -> str:
    """(0, 1, 2, 6, 7) -> '0-2,6-7': a rank's layers (interleaved ranks hold several runs)."""
    runs: list[list[int]] = []
    for i in layers:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs) or "-"


@app.command("memory")
@takes_layout()
@takes_groups(recipe=RecipeOptions)
def memory_cmd(
    model: Annotated[str, typer.Argument(help="Preset name (dayzero models), config.json, or a directory holding "
                                              "one.")],
    cluster: ClusterOpt = None, accelerator: AcceleratorOpt = None, devices: DevicesOpt = None,
    devices_per_node: DevicesPerNodeOpt = None, inter_node_gbps: InterNodeOpt = None,
    power_limit: PowerLimitOpt = None, doc_len: DocLenOpt = None,
    layout: LayoutOptions = LayoutOptions(), precision: PrecisionOpt = "bf16",
    balance: Annotated[bool, typer.Option("--balance", help="Split layers over stages to minimise the peak (vpp "
                                                            "1).")] = False,
    grad_dtype: Annotated[str, typer.Option("--grad-dtype", help="Gradient buffer: fp32 (Megatron main_grad) | bf16 "
                                                                 "(ZeRO paper).")] = "fp32",
    attention_kernel: AttentionKernelOpt = "fused", recipe: RecipeOptions = RecipeOptions(),
    dropout: Annotated[bool, typer.Option("--dropout", help="Keep dropout masks (Korthikanti's GPT).")] = False,
    capacity_factor: Annotated[float, typer.Option("--capacity-factor", help="MoE tokens per expert over the balanced "
                                                                             "share.")] = 1.0,
    fragmentation: Annotated[float | None, typer.Option("--fragmentation", help="Allocator slack budget, fraction "
                                                                                "of the activation and temporary "
                                                                                "bytes (default: the allocator's, "
                                                                                "10 % caching, 1.6 % expandable).")
                             ] = None,
    allocator: Annotated[str, typer.Option("--allocator", help="PyTorch allocator mode: caching | expandable "
                                                               "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)."
                                           )] = "caching",
    simulate: Annotated[bool, typer.Option("--simulate/--no-simulate", help="Replay one step of the busiest stage "
                                                                            "through a caching allocator.")] = True,
    timeline: Annotated[Optional[str], typer.Option("--timeline", help="Write memory over the step by category to "
                                                                       "FILE.png.")] = None,
    exact: Annotated[bool, typer.Option("--exact", help="Also run the runtime's model for one rank per stage under "
                                                        "fake tensors and compare (needs torch).")] = False,
    compute_dtype: Annotated[str, typer.Option("--compute-dtype", help="With --exact: the runtime's compute dtype, "
                                                                       "bf16 | fp32.")] = "bf16",
    trust_remote_code: TrustRemoteCodeOpt = False, json_out: JsonOpt = False,
) -> None:
    """Per-device memory of every pipeline stage: weights, gradients, optimizer, activations, temporary, overhead.

    Shows the model states before sharding, what ZeRO 0-3 leave per device for this layout, a table per stage (red above
    85 % of device memory) and an allocator replay of the busiest stage.

    Example: [bold]dayzero memory dense-3t --cluster ascend910b-8192 --tp 8 --pp 16 --dp 64 --zero 3 --recompute
    full[/bold]
    Ground truth: [bold]dayzero memory llama-3.1-8b --accelerator h100 --devices 8 --tp 2 --dp 4 --seq 4096 --gbs 8
    --exact[/bold]
    """
    from dayzero.outputs import prepare_output

    if timeline:
        prepare_output(timeline, "--timeline")
    from dayzero.planner.memory.memory_breakdown import memory_breakdown, memory_layout
    from dayzero.planner.predict import check_offload_layout
    from dayzero.specs.registry import load_model

    spec = with_documents(load_model(model, trust_remote_code), doc_len)
    cl = cluster_from_options(cluster, accelerator, devices, devices_per_node, inter_node_gbps,
                              power_limit=power_limit)
    par = layout.parallel(cl.devices, precision)
    opts = _memory_options(cl, attention_kernel, grad_dtype, dropout, capacity_factor, fragmentation, allocator,
                           recipe)
    par = memory_layout(spec, par, cl.devices, cl.memory_bytes, opts, balance)
    check_offload_layout(spec, par, recipe.activation_offload)
    where = [model, *cluster_flags(cluster, accelerator, devices, devices_per_node, inter_node_gbps)]
    if exact:
        _exact(spec, par, compute_dtype, json_out, where)
        return
    mb = memory_breakdown(spec, cl, par, opts, simulate, record_timeline=bool(timeline))
    if timeline:  # memory over the step by category, of the replayed stage
        from dayzero.planner.memory.replay import plot_timeline

        plot_timeline(mb.allocator, timeline, f"{spec.name}, {par.describe()}: stage {mb.allocator.rank}")
    print_model_notes(spec)  # after the work: an error stays one line
    if json_out:
        emit_json({**mb.to_dict(), **model_notes(spec)})
        return
    _print(spec, cl, par, mb.report, mb.states, mb.zero_rows, mb.allocator, opts, timeline)
    _print_held(spec, cl, par, mb.report, opts)
    extra = _option_flags(grad_dtype, attention_kernel, dropout, capacity_factor, fragmentation, allocator)
    _next(spec, cl, par, mb.report, opts, where, extra + recipe.switch_flags())


def _memory_options(cl, attention_kernel: str, grad_dtype: str, dropout: bool, capacity_factor: float,
                    fragmentation: float | None, allocator: str, recipe: RecipeOptions):
    """The MemoryOptions of the flags on the cluster's accelerator (--grad-dtype refused one line
    unless fp32 or bf16)."""
    from dayzero.errors import ConfigError
    from dayzero.planner.memory.memory import MemoryOptions

    if grad_dtype not in ("fp32", "bf16"):
        raise ConfigError("--grad-dtype", None, f"must be fp32 or bf16, got {grad_dtype!r}")
    return MemoryOptions.for_run(cl.accelerator, attention_kernel, grad_bytes=4 if grad_dtype == "fp32" else 2,
                                 dropout=dropout, moe_capacity_factor=capacity_factor, fragmentation=fragmentation,
                                 allocator=allocator, **recipe.memory_options())


def _exact(spec, par, compute_dtype: str, json_out: bool, where: list) -> None:
    """--exact: the runtime's model for one rank per stage under fake tensors, compared with the
    analytic model (cli.memory_exact.run_exact), then the analytic model alone as the next step."""
    from dayzero.cli.memory_exact import run_exact
    from dayzero.errors import ConfigError

    if compute_dtype not in ("bf16", "fp32"):
        raise ConfigError("--compute-dtype", None, f"must be bf16 or fp32, got {compute_dtype!r}")
    run_exact(spec, par, compute_dtype, json_out)
    if not json_out:
        print_next(console, [Step.of("dayzero", "memory", *where, *layout_flags(par.to_dict()),
                                     why="the analytic model alone, every stage")])


def _print_held(spec, cl, par, report, opts) -> None:
    """Where the engines that run this layout hold memory otherwise than laid out (FSDP under
    torch.distributed.pipelining, planner.schedule.held_zero), their peak, in one line."""
    from dayzero.planner.engines import ALL_ENGINES, engines_for, pipelined_fsdp
    from dayzero.planner.memory.memory import estimate_memory
    from dayzero.planner.schedule import held_zero

    names = [n for n in engines_for(par) if held_zero(par.zero, par.pp, pipelined_fsdp(n)) != held_zero(
        par.zero, par.pp, opts.pipelined_fsdp)]
    if not names:
        return
    held = estimate_memory(spec, par, cl.memory_bytes, opts.with_(pipelined_fsdp=pipelined_fsdp(names[0])))
    who = " and ".join(ALL_ENGINES[n].title for n in names)
    console.print(f"{who} {'hold' if len(names) > 1 else 'holds'} {gib(held.peak_bytes, 2)} on stage "
                  f"{held.busiest_stage} ({held.utilization:.1%}) here: FSDP under torch.distributed.pipelining keeps "
                  f"the stage's parameters gathered and gradients unsharded until the step's end under pp > 1 "
                  f"(docs/memory.md)", highlight=False)


def _option_flags(grad_dtype: str, attention_kernel: str, dropout: bool, capacity_factor: float,
                  fragmentation: float | None, allocator: str = "caching") -> list[str]:
    """The memory-model options that differ from their defaults, to carry into suggested commands."""
    out = []
    for flag, v, default in (("--grad-dtype", grad_dtype, "fp32"), ("--attention-kernel", attention_kernel, "fused"),
                             ("--capacity-factor", capacity_factor, 1.0), ("--fragmentation", fragmentation, None),
                             ("--allocator", allocator, "caching")):
        if v != default:
            out += [flag, f"{v:g}" if isinstance(v, float) else v]
    return out + (["--dropout"] if dropout else [])


def _next(spec, cl, par, report, opts, where: list[str], extra: list[str]) -> None:
    """Fits: its step time next. Above the target: the one-flag changes that bring it under
    (estimated here), then a search over every layout."""
    if report.utilization <= TARGET:
        # the memory options predict prices too (its time terms read them)
        carry = [f for f, on in (("--fp8-param-gather", opts.fp8_params), ("--optimizer-offload",
                                                                          opts.optimizer_offload)) if on]
        carry += ["--activation-offload", str(opts.activation_offload_layers)] if opts.activation_offload_layers else []
        print_next(console, [Step.of("dayzero", "predict", *where, *layout_flags(par.to_dict()), *carry,
                                     why="step time, MFU and communication of this layout")])
        return
    from dayzero.planner.search.remedies import single_changes

    fixes = single_changes(spec, par, cl.devices, report.capacity_bytes, opts, TARGET)
    if fixes:
        shown = "; ".join(f"{' '.join(f.change)} ({f.utilization:.0%})" for f in fixes[:4])
        console.print(f"Under the {TARGET:.0%} target with one change: {shown}.", highlight=False)
    else:
        console.print(f"No single change of tp, pp, cp, ZeRO, recompute, sequence parallelism, micro-batch or "
                      f"activation or optimizer offload "
                      f"brings the peak under {TARGET:.0%}; search every layout:", highlight=False)
    steps = [Step.of("dayzero", "memory", *where, *layout_flags(fixes[0].parallel.to_dict()), *extra,
                     *(fixes[0].change if fixes[0].option else ()),
                     why=f"with {' '.join(fixes[0].change)}")] if fixes else []
    steps.append(Step.of("dayzero", "plan", *where, "--gbs", par.gbs, "--seq", par.seq,
                         *(["--precision", par.precision] if par.precision != "bf16" else []),
                         why="the fastest layouts that fit"))
    print_next(console, steps)


def _print(spec, cl, par, report, states, zrows, sim, opts, timeline) -> None:
    from dayzero.planner.memory.memory import zero_state_bytes

    cap = report.capacity_bytes
    console.print(f"[bold]{spec.name}[/bold] on [bold]{cl.name}[/bold]: {cl.devices:,} x {cl.accelerator.id}, "
                  f"{capacity(cap)} each")
    console.print(f"layout {par.describe()}, {par.microbatches} micro-batch(es) per step, schedule {par.schedule}, "
                  f"seq {par.seq}, {par.precision}")

    t = FitTable(title=f"Model states before sharding ({states.params:.4g} parameters)", show_header=False)
    t.add_column("state")
    t.add_column("bytes", num=True)
    for name, val, per in (("weights, BF16", states.weights, opts.param_bytes),
                           (f"gradients, {'FP32' if opts.grad_bytes == 4 else 'BF16'}", states.gradients,
                            opts.grad_bytes),
                           ("master weights, FP32", states.master, opts.master_bytes),
                           ("AdamW moments (exp_avg, exp_avg_sq), FP32", states.moments, opts.optim_bytes)):
        t.add_row(f"{name} ({per} B/param)", tb(val))
    t.add_row(styled(f"total ({opts.bytes_per_param} B/param)", "bold"),
              styled(tb(states.total), "bold") + f" = {states.total / cap:,.0f} x {capacity(cap)}")
    console.print(t)

    z = FitTable(title=f"ZeRO on this layout: model states per device (stage with the most; shards over dp*cp = "
                    f"{par.dp * par.cp}{f', experts over edp = {par.edp}' if spec.is_moe else ''})")
    for col in ("zero", "shards", "weights GiB", "grads GiB", "optim GiB", "states GiB", "cut vs 0", "peak GiB",
                "fits"):
        z.add_column(col, num=col != "shards")
    shards = ("none", "optimizer", "+ gradients", "+ parameters")
    for r in zrows:
        mark = "bold" if r["zero"] == par.zero else ""
        z.add_row(*[styled(x, mark) for x in (
            str(r["zero"]), shards[r["zero"]], gb(r["weights"]), gb(r["gradients"]), gb(r["optimizer"]),
            gb(r["model_states"]), f"{r['cut_factor']:.2f}x", gb(r["peak_bytes"]), "yes" if r["fits"] else "no")])
    console.print(z)
    n, o = par.dp * par.cp, opts
    g = o.grad_bytes
    per = {z: zero_state_bytes(1, n, z, o) for z in (1, 2, 3)}  # bytes per dense parameter (ZeRO's rule)
    console.print(f"per dense parameter: ZeRO-0 {o.bytes_per_param} B; ZeRO-1 "
                  f"{o.param_bytes}+{g}+{o.master_bytes + o.optim_bytes}/{n} "
                  f"= {per[1]:.3g} B; ZeRO-2 {o.param_bytes}+"
                  f"{g + o.master_bytes + o.optim_bytes}/{n} = {per[2]:.3g} B "
                  f"([bold]{zrows[2]['cut_factor']:.2f}x[/bold] here; the classic 'about 8x' is (2+2+12)/2 as dp "
                  "grows, "
                  f"with BF16 gradients); ZeRO-3 {o.bytes_per_param}/{n} = {per[3]:.3g} B plus the gathered "
                  f"layers in flight (temporary).")

    s = FitTable(title=f"Per stage, GiB per device (capacity {capacity(cap)}; red above {TARGET:.0%}): weights, "
                       "gradients, optimizer states, activations, temporary buffers, overhead", compact=True)
    for col in ("stage", "layers", *HEADS, "total", "% HBM"):
        s.add_column(col, num=True)
    for st in report.stages:
        util = st.total / cap
        style = "bold red" if util > TARGET else ("bold" if st.stage == report.busiest_stage else "")
        s.add_row(str(st.stage), ranges(st.layers), *[gb(getattr(st, c)) for c in CATS], gb(st.total), f"{util:.1%}",
                  style=style)
    console.print(s)

    busiest = report.stages[report.busiest_stage]
    b = FitTable(title=f"Stage {busiest.stage} (busiest) by term", show_header=False)
    b.add_column("term")
    b.add_column("GiB", num=True)
    for k, v in sorted(busiest.terms.items(), key=lambda kv: -kv[1]):
        if v:
            b.add_row(k, gb(v))
    console.print(b)

    if sim is not None:
        oom = f"; [red]allocator OOM at event {sim.oom_at}[/red]" if sim.oom_at is not None else ""
        console.print(f"Allocator replay of stage {sim.rank} ({sim.microbatches} micro-batches, {sim.events:,} "
                      "events): "
                      f"peak allocated {gib(sim.peak_allocated, 2)}, peak reserved {gib(sim.peak_reserved, 2)}, "
                      f"fragmentation {sim.fragmentation:.1%} (budgeted {opts.fragmentation_budget:.1%} of "
                      "activations and temporaries)"
                      f"{oom}")
        if timeline:
            console.print(f"timeline written to {timeline}")
    verdict = "[green]fits[/green]" if report.fits else "[red]does not fit[/red]"
    target = "within" if report.utilization <= TARGET else "[red]above[/red]"
    console.print(f"Peak {gib(report.peak_bytes, 2)} on stage {report.busiest_stage} = {report.utilization:.1%} of "
                  f"{capacity(cap)}: {verdict}, {target} the {TARGET:.0%} target.")
