"""``dayzero predict MODEL``: step time, throughput, MFU, memory and communication of one layout."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from dayzero.cli.app import app
from dayzero.cli.common import (
    DEFAULT_TOKENS,
    AcceleratorOpt,
    ActFp8Opt,
    ActivationOffloadOpt,
    AllocatorOpt,
    AttentionKernelOpt,
    ClusterOpt,
    DevicesOpt,
    DevicesPerNodeOpt,
    DocLenOpt,
    ElectricityOpt,
    FailuresOpt,
    Fp8ParamOpt,
    HostOverheadOpt,
    InterNodeOpt,
    JsonOpt,
    KernelLevelOpt,
    MoeProbsOpt,
    MomentsOpt,
    OptimizerOffloadOpt,
    OverlapSmOpt,
    PowerLimitOpt,
    PriceOpt,
    PueOpt,
    TokensOpt,
    TrustRemoteCodeOpt,
    cluster_from_options,
    console,
    cost_options,
    emit_json,
    field_option,
    human,
    memory_recipe,
    model_notes,
    print_model_notes,
    takes_layout,
    with_documents,
)
from dayzero.cli.next_steps import Step, cluster_flags, layout_flags, print_next, run_step
from dayzero.cli.render import FitTable, styled
from dayzero.report.layout_text import describe  # plan uses it from here too
from dayzero.specs.layout_options import LayoutOptions
from dayzero.units import capacity, gib

PrecisionOpt = Annotated[str, typer.Option("--precision", help="GEMM precision: bf16 | fp8 | fp4 (NVFP4/MXFP4 GEMMs; "
                                                               "memory as fp8).")]
TpOverlapOpt = Annotated[Optional[bool], typer.Option(
    "--tp-overlap/--no-tp-overlap", help="Pin the overlap of the TP collectives with the GEMMs (Megatron "
    "--tp-comm-overlap) on or off (default: on wherever Megatron-Core runs it, tp > 1 with sequence "
    "parallelism; a search pinned to an --engine without it prices none).")]
EpOverlapOpt = Annotated[Optional[bool], typer.Option(
    "--ep-overlap/--no-ep-overlap", help="Pin the overlap of the EP all-to-all with another micro-batch on or off "
                                         "(default: wherever the layout's schedule runs it: DualPipe/DualPipeV, "
                                         "Megatron's --overlap-moe-expert-parallel-comm conditions).")]
EpDispatcherOpt = Annotated[Optional[str], typer.Option("--ep-dispatcher", help="How MoE tokens reach their experts: "
                                                      "dedup (once per rank and remote node: DeepEP, Megatron's flex "
                                                      "dispatcher) | all-to-all (every routed copy: Megatron's "
                                                      "alltoall, torchtitan, DeepSpeed, dayzero's runtime). Default: "
                                                      "the --engine's, else dedup.")]
Fp8RecipeOpt = Annotated[str, typer.Option("--fp8-scaling", help="FP8 GEMM scaling: tensor (per-tensor, Transformer "
                                                                  "Engine) | block (DeepSeek-V3's 1x128 / 128x128 "
                                                                  "scales, priced from DeepGEMM on H800).")]
Fp8DispatchOpt = Annotated[bool, typer.Option("--fp8-dispatch", help="Send the MoE dispatch in FP8 (combine in BF16), "
                                                                   "as DeepSeek-V3 under FP8 recipes.")]
SmReservedOpt = Annotated[bool, typer.Option("--comm-sm-reserved", help="Overlapped compute runs on the SMs the "
                                                                      "communication kernels leave for the whole "
                                                                      "window (DeepSeek-V3's DualPipe: 112 of 132).")]
ImbalanceOpt = Annotated[float, typer.Option("--moe-imbalance", help="Busiest device's routed tokens over the average "
                                                                     "(1.0: balanced).")]
ExpertLoadsOpt = Annotated[Optional[str], typer.Option("--expert-loads", help="Measured expert loads (a run's "
                                                        "metrics.jsonl or a layer x expert JSON matrix): the MoE "
                                                        "imbalance is derived from them per EP size instead of "
                                                        "--moe-imbalance.")]
PlacementOpt = Annotated[Optional[str], typer.Option("--placement", help="Expert placement file (dayzero moe place "
                                                     "--out) the imbalance is computed under (default: contiguous; "
                                                     "without --expert-loads: uniform loads).")]
OrderOpt = field_option("rank_order")
CalibrationOpt = Annotated[Optional[str], typer.Option("--calibration", help="JSON/YAML of efficiency constants (see "
                                                                             "docs/performance.md).")]


def check_precision(precision: str, cluster=None) -> None:
    """``--precision`` names one of ParallelConfig's GEMM precisions, one the cluster's card has units for."""
    from dayzero.errors import ConfigError
    from dayzero.specs.parallel import PRECISIONS

    if precision not in PRECISIONS:
        from dayzero.names import did_you_mean

        raise ConfigError("--precision", None, f"must be {', '.join(PRECISIONS)}, got {precision!r}"
                          f"{did_you_mean(precision, PRECISIONS)}")
    if cluster is not None:
        cluster.accelerator.require_native(precision)


@app.command("predict")
@takes_layout()
def predict_cmd(
    model: Annotated[str, typer.Argument(help="Preset name (dayzero models), config.json, or a directory holding "
                                              "one.")],
    cluster: ClusterOpt = None, accelerator: AcceleratorOpt = None, devices: DevicesOpt = None,
    devices_per_node: DevicesPerNodeOpt = None, inter_node_gbps: InterNodeOpt = None,
    power_limit: PowerLimitOpt = None, doc_len: DocLenOpt = None,
    layout: LayoutOptions = LayoutOptions(), precision: PrecisionOpt = "bf16", tp_overlap: TpOverlapOpt = None,
                ep_overlap: EpOverlapOpt = None, ep_dispatcher: EpDispatcherOpt = None,
    fp8_scaling: Fp8RecipeOpt = "tensor", fp8_dispatch: Fp8DispatchOpt = False, comm_sm_reserved: SmReservedOpt = False,
    moe_imbalance: ImbalanceOpt = 1.0, expert_loads: ExpertLoadsOpt = None, placement: PlacementOpt = None,
    rank_order: OrderOpt = "tp-cp-dp-pp",
                attention_kernel: AttentionKernelOpt = "fused", kernel_level: KernelLevelOpt = "fused",
    overlap_sm: OverlapSmOpt = False,
    moments: MomentsOpt = "fp32", allocator: AllocatorOpt = "caching", moe_probs: MoeProbsOpt = "combine",
    act_fp8: ActFp8Opt = False, fp8_params: Fp8ParamOpt = False,
    optimizer_offload: OptimizerOffloadOpt = False, activation_offload: ActivationOffloadOpt = 0,
    calibration: CalibrationOpt = None, tokens: TokensOpt = DEFAULT_TOKENS, price_per_device_hour: PriceOpt = None,
    pue: PueOpt = None, host_overhead: HostOverheadOpt = None,
    electricity_price: ElectricityOpt = None, failures: FailuresOpt = None,
    trust_remote_code: TrustRemoteCodeOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Predict one layout: step time (compute, exposed communication, bubble, optimizer), tokens/s, MFU, peak memory,
    every collective of the step, the Day-0 checks (MFU > 50 %, memory < 85 %, communication < 15 %), and the time,
    energy and cost of training --tokens tokens.

    Example: [bold]dayzero predict llama-3.1-70b --accelerator h100 --devices 64 --tp 4 --pp 4 --vpp 5 --gbs 128 --seq
    8192 --sequence-parallel --precision fp8 --tp-overlap[/bold]
    """
    from dayzero.planner.perf.perf import PerfOptions
    from dayzero.planner.predict import predict
    from dayzero.planner.training_cost import with_training
    from dayzero.specs.registry import load_model

    copt = cost_options(tokens, price_per_device_hour, pue, host_overhead, electricity_price, failures)
    spec = with_documents(load_model(model, trust_remote_code), doc_len)
    cl = cluster_from_options(cluster, accelerator, devices, devices_per_node, inter_node_gbps,
                              power_limit=power_limit)
    check_precision(precision, cl)
    from dayzero.planner.engines import default_engine, with_engine_overlaps

    own = default_engine(cl.accelerator.vendor)  # Huawei: priced as MindSpeed runs it (dispatcher, overlaps)
    opts = PerfOptions.for_run(cl, tp_overlap, ep_overlap, moe_imbalance, calibration, attention_kernel,
                               ep_dispatcher=dispatcher_option(ep_dispatcher, own), fp8_dispatch=fp8_dispatch,
                               fp8_scaling=fp8_scaling, comm_sm_reserved=comm_sm_reserved,
                               fp8_param_gather=fp8_params,
                               optimizer_offload=optimizer_offload, activation_offload_layers=activation_offload,
                               kernel_level=kernel_level, overlap_sm=overlap_sm)
    opts = with_engine_overlaps(opts, own)
    opts = opts.with_expert_loads(spec, expert_loads, placement)
    par = layout.parallel(cl.devices, precision, rank_order)
    # the memory switches as the layout's own (planner.search.switches), so its engines are those that run them
    par = par.with_(fp8_param_gather=bool(fp8_params) and precision != "bf16",
                    optimizer_offload=bool(optimizer_offload), activation_offload_layers=activation_offload)
    recipe = memory_recipe(moments, act_fp8, fp8_params, optimizer_offload, activation_offload,
                           allocator, moe_probs)
    mopts = None
    if recipe:
        from dayzero.planner.memory.memory_options import MemoryOptions

        mopts = MemoryOptions.for_run(cl.accelerator, attention_kernel, **recipe)
    from dayzero.planner.predict import check_offload_layout, with_even_split

    check_offload_layout(spec, with_even_split(spec, par), activation_offload)
    obj = with_training(predict(spec, par, cl, opts, mopts), cl, copt)
    from dayzero.planner.search.error_band import ErrorBand, band_for

    obj["error_band"] = band_for(spec, cl, precision, obj["throughput"]["mfu"], None, calibration).to_dict()
    print_model_notes(spec)  # after the work: an error stays one line
    if json_out:
        emit_json({**obj, **model_notes(spec)})
        return
    print_prediction(obj)
    console.print(f"error band: {ErrorBand(**obj['error_band']).text()}", highlight=False)
    where = [model, *cluster_flags(cluster, accelerator, devices, devices_per_node, inter_node_gbps)]
    print_next(console, next_for_layout(obj, model, where, cl))


def next_for_layout(obj: dict, model: str, where: list[str], cl) -> list[Step]:
    """After a prediction (or a plan's best layout): its memory per stage, then training it, or,
    when its memory check fails, what to change and a search for layouts that fit."""
    p = obj["parallel"]
    memory = Step.of("dayzero", "memory", *where, *layout_flags(p), why="memory of every stage")
    if all(c["pass"] for c in obj["checks"] if c["metric"] == "peak_memory_fraction"):
        return [memory, run_step(model, p, obj.get("engines"), cl.devices, cl.devices_per_node, why="train it")]
    prec = p.get("gemm_precision", p["precision"])
    return [Step.of(*memory.argv, why="above the memory target: what to change"),
            Step.of("dayzero", "plan", *where, "--gbs", p["gbs"], "--seq", p["seq"],
                    *(["--precision", prec] if prec != "bf16" else []), why="the fastest layouts that fit")]


def print_prediction(obj: dict, title: str | None = None, inventory: bool = True) -> None:
    p, t, th = obj["parallel"], obj["time"], obj["throughput"]
    head = title or f"[bold]{obj['model']}[/bold] on [bold]{obj['cluster']}[/bold] ({obj['devices']:,} devices)"
    console.print(head)
    console.print(f"layout {describe(p)}; {p['microbatches']} micro-batch(es) of {p['mbs']} x {p['seq']} tokens, "
                  f"gbs {p['gbs']}, {p['gemm_precision']} GEMMs, schedule {p['schedule']}")
    s = FitTable(show_header=False, title="Step")
    s.add_column("term")
    s.add_column("seconds", num=True)
    s.add_column("share", num=True)
    for k in ("compute_s", "comm_exposed_s", "bubble_s", "optimizer_s", "straggler_s", "activation_offload_s"):
        if k in ("straggler_s", "activation_offload_s") and not t.get(k):
            continue
        s.add_row(k[:-2].replace("_", " "), f"{t[k]:.3f}", f"{t[k] / t['step_s']:.1%}")
    s.add_row(styled("step", "bold"), styled(f"{t['step_s']:.3f}", "bold"), "")
    console.print(s)
    console.print(f"tokens/s {human(th['tokens_per_s'])} ({th['tokens_per_s_per_device']:,.0f} per device); "
                  f"model {th['model_tflops_per_device']:.0f} TFLOP/s per device; MFU {th['mfu']:.1%}; "
                  f"peak memory {gib(obj['memory']['peak_bytes'])} of {capacity(obj['memory']['capacity_bytes'])}"
                  + (f"; host memory {obj['memory']['host_bytes'] / 1e9:.1f} GB per device for what is offloaded, "
                     + ("within" if obj["memory"]["host_fits"] else "[red]beyond[/red]") + " the "
                     + host_limit_words(obj["memory"]) if "host_bytes" in obj["memory"] else ""),
                  highlight=False)
    if obj["memory"].get("host_assumption"):  # the host figures the offload was priced with, where assumed
        console.print(obj["memory"]["host_assumption"], highlight=False)
    if inventory and obj["communication"]:
        c = FitTable(title="Communication per step (busiest stage)", compact=True)
        for col in ("collective", "size", "tier", "MB/op", "ops", "busy s", "exposed", "hidden by"):
            c.add_column(col, num=col not in ("collective", "tier", "hidden by"))
        for r in obj["communication"]:
            tier = r["tier"].replace("scale-up", "up").replace("scale-out", "out")
            c.add_row(r["name"], str(r["group_size"]), tier, f"{r['bytes'] / 1e6:,.0f}", f"{r['count']:,.0f}",
                      f"{r['total_s']:.3g}", f"{r['exposed_s']:.3g}", r["hidden_by"])
        console.print(c)
    if "engines" in obj:
        print_engines(obj)
    for ch in obj["checks"]:
        mark = "[green]pass[/green]" if ch["pass"] else "[red]fail[/red]"
        console.print(f"  {mark}  {ch['metric']} {ch['value']:.1%} (target {ch['target']})")
    if obj.get("training"):
        print_training(obj["training"])


def host_limit_words(memory: dict) -> str:
    """The device's share of host memory an offloading layout is held to, and whose it is."""
    limit = f"{memory['host_limit_bytes'] / 1e9:.0f} GB"
    if "memory_bytes" in memory.get("host_assumed", []):
        return f"assumed {limit} (a DGX H100's 2 TB for 8 GPUs)"
    return f"{limit} per device of host memory ({memory['host_system'] or 'the cluster file'})"


def dispatcher_option(flag: str | None, engine: str | None = None) -> str:
    """``--ep-dispatcher`` as the planner names it; unset: the engine's dispatcher, else the planner's default."""
    from dayzero.errors import ConfigError, DayzeroError
    from dayzero.planner.engines import get_engine
    from dayzero.planner.perf.comm import CommOptions
    from dayzero.planner.perf.moe_dispatch import check_dispatcher

    if flag is None:
        return get_engine(engine).ep_dispatcher if engine else CommOptions().ep_dispatcher
    try:
        return check_dispatcher(flag.strip().lower().replace("-", "_"))
    except DayzeroError:
        raise ConfigError("--ep-dispatcher", None, f"{flag!r}: one of dedup, all-to-all") from None


def print_engines(obj: dict) -> None:
    """Which engines run the layout as laid out, and why each other one does not."""
    from dayzero.planner.engines import ALL_ENGINES, engine_problems, runs_on_vendor
    from dayzero.specs.parallel import ParallelConfig

    p = ParallelConfig.from_dict(obj["parallel"])
    runs = [ALL_ENGINES[n].title for n in obj["engines"] if n in ALL_ENGINES]
    console.print(f"runs on: {', '.join(runs) or 'none of the engines dayzero knows as laid out'}", highlight=False)
    vendor = obj.get("vendor")
    for name, e in ALL_ENGINES.items():
        if name not in obj["engines"]:
            if not runs_on_vendor(e, vendor):  # planner.engines: the vendors each engine runs on
                if vendor and vendor.lower().startswith("huawei"):  # the engine Ascend users would ask about
                    console.print(f"  not {e.title}: runs on {', '.join(e.vendors)} accelerators, not {vendor}'s "
                                  "(on Ascend the Megatron stack is MindSpeed)", highlight=False)
                continue
            why = engine_problems(e, p, obj.get("switches")) or [
                f"zero {p.zero}, pp {p.pp}: does not fit as it holds memory (FSDP under torch.distributed.pipelining "
                "keeps the stage's parameters gathered and gradients unsharded until the step's end; docs/memory.md)"]
            console.print(f"  not {e.title}: {'; '.join(why)}", highlight=False)


def print_training(tr: dict) -> None:
    from dayzero.report.training import training_rows

    t = FitTable(show_header=False, title="Training", compact=True)
    t.add_column("quantity", wrap=False)
    t.add_column("value")
    for label, value in training_rows(tr):
        t.add_row(label, value)
    console.print(t)
