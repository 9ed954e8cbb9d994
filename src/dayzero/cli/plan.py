"""``dayzero plan [MODEL]``: search every layout for the fastest that fits; with no arguments, the
scenario dayzero exists for: the 3T dense model on 8,192 Ascend 910B NPUs."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.text import Text

from dayzero.cli.app import app
from dayzero.cli.common import (
    DEFAULT_TOKENS,
    AcceleratorOpt,
    ActFp8Opt,
    ActivationOffloadOpt,
    AllocatorOpt,
    ClusterOpt,
    DevicesOpt,
    DevicesPerNodeOpt,
    DocLenOpt,
    ElectricityOpt,
    FailuresOpt,
    HostOverheadOpt,
    InterNodeOpt,
    JsonOpt,
    MoeProbsOpt,
    MomentsOpt,
    PowerLimitOpt,
    PriceOpt,
    PueOpt,
    TokensOpt,
    TrustRemoteCodeOpt,
    cluster_from_options,
    console,
    cost_options,
    emit_json,
    memory_recipe,
    model_notes,
    print_model_notes,
    with_documents,
)
from dayzero.cli.next_steps import cluster_flags, print_next
from dayzero.cli.predict import (
    AttentionKernelOpt,
    CalibrationOpt,
    EpDispatcherOpt,
    EpOverlapOpt,
    ExpertLoadsOpt,
    Fp8DispatchOpt,
    Fp8RecipeOpt,
    ImbalanceOpt,
    KernelLevelOpt,
    OrderOpt,
    OverlapSmOpt,
    PlacementOpt,
    PrecisionOpt,
    SmReservedOpt,
    TpOverlapOpt,
    check_precision,
    describe,
    dispatcher_option,
    next_for_layout,
    print_prediction,
)
from dayzero.cli.render import FitTable, styled
from dayzero.cli.uncertainty import print_uncertainty
from dayzero.planner.targets import MEMORY_TARGET

DEFAULT_MODEL = "dense-3t"
DEFAULT_CLUSTER = "ascend910b-8192"
# 4,096 sequences of 4,096 tokens = 16M tokens per step: Llama 3 405B's final batch size
# (Dubey et al. 2024, "The Llama 3 Herd of Models", sec. 3.4.1).
DEFAULT_GBS = 4096
# the batch of a whole-cluster scenario (plan, day0, compare): sequences and tokens per sequence
ScenarioGbsOpt = Annotated[int, typer.Option("--gbs", "--global-batch-size", min=1,
                                             help="Global batch size, sequences.")]
ScenarioSeqOpt = Annotated[int, typer.Option("--seq", "--seq-length", min=1, help="Sequence length, tokens.")]

# The memory switches the search tries (planner.search.switches): unset, the search decides per layout;
# --X forces it on, --no-X keeps it off
SearchedFp8ParamOpt = Annotated[Optional[bool], typer.Option(
    "--fp8-param-gather/--no-fp8-param-gather",
    help="FP8 parameter storage and FP8 ZeRO all-gathers (Megatron --fp8-param-gather), under --precision fp8/fp4. "
         "Default: searched, on wherever the engine runs it (it only saves memory and time); --no- keeps it off.")]
SearchedOffloadOpt = Annotated[Optional[bool], typer.Option(
    "--optimizer-offload/--no-optimizer-offload",
    help="FP32 master weights and AdamW moments in host memory, Adam on the CPU (Megatron --optimizer-cpu-offload, "
         "ZeRO-Offload). Default: searched, only where a layout does not fit at its recompute level without it (it "
         "adds the host Adam and PCIe to the step); --optimizer-offload forces it on, --no- keeps it off.")]

# activation offload (planner.memory.activation_offload) is searched by default where nothing fits without it;
# --activation-offload N pins it (cli.common), --no-activation-offload keeps it off
NoActivationOffloadOpt = Annotated[bool, typer.Option(
    "--no-activation-offload",
    help="Keep activation offload off. Default: searched, the fewest layers per chunk that fit only where a layout "
         "does not fit without recompute and the engine runs it (Megatron: pp 1, no recompute); "
         "--activation-offload N pins it to N.")]


def ListOpt(name: str, what: str, *aliases: str):  # noqa: N802 (used as a type, like the other *Opt)
    """A pin: the candidate list of one layout dim, under the flag (and Megatron-style aliases) the
    other verbs give that dim's single value (cli.common's layout options)."""
    return Annotated[Optional[str], typer.Option(name, *aliases, help=f"Only these {what} (comma-separated).")]


def _ints(text: str | None, name: str) -> tuple[int, ...] | None:
    from dayzero.errors import ConfigError

    if not text:
        return None
    try:
        vals = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(name, None, f"expected comma-separated integers, got {text!r}") from None
    if any(v < 0 for v in vals):
        raise ConfigError(name, None, f"values must be >= 0, got {text!r}")
    return vals


def _words(text: str | None) -> tuple[str, ...] | None:
    return tuple(w.strip() for w in text.split(",") if w.strip()) if text else None


def _module_sets(text: str | None) -> tuple[tuple[str, ...], ...] | None:
    """``--recompute-modules core_attn,core_attn+moe_act``: the module sets selective recompute is
    tried with (comma between sets, + inside one), each name checked (one line naming the valid ones)."""
    from dayzero.errors import ConfigError
    from dayzero.specs.parallel import RECOMPUTE_MODULES

    words = _words(text)
    if words is None:
        return None
    sets = tuple(tuple(m.strip() for m in w.split("+") if m.strip()) for w in words)
    bad = sorted({m for ms in sets for m in ms if m not in RECOMPUTE_MODULES})
    if bad:
        raise ConfigError("--recompute-modules", None, f"{', '.join(bad)} not among {', '.join(RECOMPUTE_MODULES)}")
    return sets


def _bools(text: str | None, name: str) -> tuple[bool, ...] | None:
    from dayzero.errors import ConfigError

    words = _words(text)
    if words is None:
        return None
    table = {"on": True, "off": False, "true": True, "false": False, "1": True, "0": False}
    if any(w.lower() not in table for w in words):
        raise ConfigError(name, None, f"expected on, off or both (on,off), got {text!r}")
    return tuple(table[w.lower()] for w in words)


@app.command("plan")
def plan_cmd(
    model: Annotated[str, typer.Argument(help="Preset name (dayzero models), config.json, or a directory holding "
                                              "one.")] = DEFAULT_MODEL,
    cluster: ClusterOpt = None, accelerator: AcceleratorOpt = None, devices: DevicesOpt = None,
    devices_per_node: DevicesPerNodeOpt = None, inter_node_gbps: InterNodeOpt = None,
    power_limit: PowerLimitOpt = None, doc_len: DocLenOpt = None,
    gbs: ScenarioGbsOpt = DEFAULT_GBS, seq: ScenarioSeqOpt = 4096,
    precision: PrecisionOpt = "bf16",
    top_k: Annotated[int, typer.Option("--top", min=1, help="Plans to show.")] = 5,
    max_memory: Annotated[float, typer.Option("--max-memory", min=0.05, max=1.0,
                                              help="Peak memory limit, fraction of device memory.")] = MEMORY_TARGET,
    tp: ListOpt("--tp", "tensor-parallel degrees", "--tensor-model-parallel-size") = None,
    pp: ListOpt("--pp", "pipeline degrees", "--pipeline-model-parallel-size") = None,
    dp: ListOpt("--dp", "data-parallel degrees (dp = devices / (tp*pp*cp))") = None,
    cp: ListOpt("--cp", "context-parallel degrees", "--context-parallel-size") = None,
    cp_comm: ListOpt("--cp-comm", "context-parallel exchanges (p2p: ring attention, a2a: Ulysses all-to-all; "
                     "default: every one the engine runs, the faster per layout)", "--cp-comm-type") = None,
    ep: ListOpt("--ep", "expert-parallel degrees", "--expert-model-parallel-size") = None,
    mbs: ListOpt("--mbs", "micro-batch sizes", "--micro-batch-size") = None,
    zero: ListOpt("--zero", "ZeRO stages") = None,
    etp: ListOpt("--etp", "expert tensor-parallel degrees", "--expert-tensor-parallel-size") = None,
    vpp: ListOpt("--vpp", "virtual stages per rank", "--virtual-pipeline-model-parallel-size") = None,
    schedule: ListOpt("--schedule", "pipeline schedules (1f1b: vpp 1, interleaved: vpp > 1, gpipe)") = None,
    recompute: ListOpt("--recompute", "recompute modes (none, selective, full)") = None,
    recompute_modules: Annotated[Optional[str], typer.Option(
        "--recompute-modules", help="Module sets selective recompute is tried with, comma between sets, + inside "
        "one (e.g. core_attn,core_attn+moe_act+layernorm); modules: core_attn, moe_act, layernorm, mla_up_proj, "
        "mlp, moe, shared_experts. Default: core_attn; core_attn+moe_act+layernorm; + mla_up_proj, those that "
        "apply to the model.")] = None,
    moments: MomentsOpt = "fp32", allocator: AllocatorOpt = "caching", moe_probs: MoeProbsOpt = "combine",
    act_fp8: ActFp8Opt = False, fp8_params: SearchedFp8ParamOpt = None,
    optimizer_offload: SearchedOffloadOpt = None, activation_offload: ActivationOffloadOpt = 0,
    no_activation_offload: NoActivationOffloadOpt = False,
    sequence_parallel: ListOpt("--sequence-parallel", "sequence-parallel settings (on, off)") = None,
    tp_overlap: TpOverlapOpt = None, ep_overlap: EpOverlapOpt = None, ep_dispatcher: EpDispatcherOpt = None,
    fp8_scaling: Fp8RecipeOpt = "tensor", fp8_dispatch: Fp8DispatchOpt = False, comm_sm_reserved: SmReservedOpt = False,
    moe_imbalance: ImbalanceOpt = 1.0,
    expert_loads: ExpertLoadsOpt = None, placement: PlacementOpt = None,
    rank_order: OrderOpt = "tp-cp-dp-pp", attention_kernel: AttentionKernelOpt = "fused",
    kernel_level: KernelLevelOpt = "fused", overlap_sm: OverlapSmOpt = False,
    calibration: CalibrationOpt = None, tokens: TokensOpt = DEFAULT_TOKENS, price_per_device_hour: PriceOpt = None,
    pue: PueOpt = None, host_overhead: HostOverheadOpt = None,
    electricity_price: ElectricityOpt = None, failures: FailuresOpt = None,
    trust_remote_code: TrustRemoteCodeOpt = False,
    engine: Annotated[Optional[str], typer.Option("--engine", help="Only layouts this engine runs as laid out: "
                                                  "megatron | torchtitan | deepspeed | dayzero.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Search tp x pp x dp x cp x ep x etp x vpp x schedule x ZeRO x recompute x micro-batch x sequence parallelism for
    the fastest layouts that fit (each flag of a dim pins it to a comma-separated list); memory is checked first, the
    step time of the survivors is predicted in one vectorised pass; each plan with the time, energy and cost of training
    --tokens tokens.

    With no arguments: [bold]dense-3t[/bold] on [bold]ascend910b-8192[/bold] (8,192 Ascend 910B, 8-card HCCS full-mesh
    nodes).

    Example: [bold]dayzero plan[/bold]; [bold]dayzero plan moe-3t --cluster dgx-h100-16384 --json[/bold]; [bold]dayzero
    plan llama-3.1-70b -a h100 -n 64 --gbs 128 --seq 8192 --precision fp8 --tp-overlap[/bold]
    """
    from dayzero.planner.perf.perf import PerfOptions
    from dayzero.planner.search.search import SearchSpace, plan
    from dayzero.planner.training_cost import with_training
    from dayzero.specs.registry import load_model

    copt = cost_options(tokens, price_per_device_hour, pue, host_overhead, electricity_price, failures)
    spec = with_documents(load_model(model, trust_remote_code), doc_len)
    cl = cluster_from_options(cluster, accelerator, devices, devices_per_node, inter_node_gbps, default=DEFAULT_CLUSTER,
                              power_limit=power_limit)
    check_precision(precision, cl)
    if not engine:  # a vendor with an engine of its own (Huawei: MindSpeed) is planned for it
        from dayzero.planner.engines import default_engine

        engine = default_engine(cl.accelerator.vendor)
    opts = PerfOptions.for_run(cl, tp_overlap, ep_overlap, moe_imbalance, calibration, attention_kernel,
                               ep_dispatcher=dispatcher_option(ep_dispatcher, engine), fp8_dispatch=fp8_dispatch,
                               fp8_scaling=fp8_scaling, comm_sm_reserved=comm_sm_reserved,
                               fp8_param_gather=bool(fp8_params),
                               optimizer_offload=bool(optimizer_offload), activation_offload_layers=activation_offload,
                               kernel_level=kernel_level, overlap_sm=overlap_sm)
    opts = opts.with_expert_loads(spec, expert_loads, placement)
    asked = (("fp8_param_gather", fp8_params), ("optimizer_offload", optimizer_offload))
    no_switches = tuple(name for name, on in asked if on is False)  # --no-X: kept off
    if no_activation_offload:  # the searched activation offload kept off (planner.search.search_fit.offloaded_variants)
        if activation_offload:
            from dayzero.errors import ConfigError

            raise ConfigError("--no-activation-offload", None,
                              f"contradicts --activation-offload {activation_offload}; give one of them")
        no_switches += ("activation_offload_layers",)
    kw = {k: v for k, v in (("tp", _ints(tp, "--tp")), ("pp", _ints(pp, "--pp")), ("cp", _ints(cp, "--cp")),
                            ("ep", _ints(ep, "--ep")), ("mbs", _ints(mbs, "--mbs")), ("zero", _ints(zero, "--zero")),
                            ("etp", _ints(etp, "--etp")), ("vpp", _ints(vpp, "--vpp")), ("dp", _ints(dp, "--dp")),
                            ("schedule", _words(schedule.lower() if schedule else None)),
                            ("recompute", _words(recompute)), ("recompute_modules", _module_sets(recompute_modules)),
                            ("cp_comm", _words(cp_comm)),
                            ("sequence_parallel", _bools(sequence_parallel, "--sequence-parallel")))
          if v is not None}
    if placement:  # a placement is for one EP size: search only that one
        placed = opts.comm.moe_measured.by_ep[0].ep
        if kw.get("ep") not in (None, (placed,)):
            from dayzero.errors import ConfigError

            raise ConfigError("--placement", None, f"is for ep {placed}, but --ep asks for {list(kw['ep'])}; "
                              f"drop --ep or pass --ep {placed}")
        kw["ep"] = (placed,)
    if engine:
        from dayzero.planner.engines import get_engine

        engine = get_engine(engine).name
    recipe = memory_recipe(moments, act_fp8, bool(fp8_params), bool(optimizer_offload), activation_offload,
                           allocator, moe_probs)
    if activation_offload:  # per layout the search caps it at a chunk's layers - 1 (planner.memory.activation_offload)
        from dayzero.planner.memory.activation_offload import check_activation_offload

        check_activation_offload(activation_offload, spec.layers)
    mopts = None
    if recipe:
        from dayzero.planner.memory.memory_options import MemoryOptions

        mopts = MemoryOptions.for_run(cl.accelerator, attention_kernel, **recipe)
    from dayzero.errors import FitError

    try:
        obj = plan(spec, cl, gbs, seq, precision, opts, top_k, max_memory,
                   SearchSpace(rank_order=(rank_order,), engine=engine, no_switches=no_switches, **kw),
                   memory_options=mopts, uncertainty=True)
    except FitError as e:  # this verb alone has the memory limit as a flag
        raise FitError(f"{e}; or raise --max-memory (now {max_memory:.0%})") from None
    obj = with_training(obj, cl, copt)
    if calibration and obj.get("error_band"):  # a calibrated plan's band: its runs' residuals (calibrate --runs)
        from dayzero.planner.search.error_band import band_for

        obj["error_band"] = band_for(spec, cl, precision, obj["error_band"]["mfu"], engine, calibration).to_dict()
    print_model_notes(spec)  # after the work: an error stays one line
    if json_out:
        emit_json({**obj, **model_notes(spec)})
        return
    console.print(f"[bold]{spec.name}[/bold] on [bold]{cl.name}[/bold] ({cl.devices:,} x {cl.accelerator.id}), gbs "
                  f"{gbs} x "
                  f"seq {seq}, {obj['precision']}: {obj['considered']:,} layouts considered in "
                  f"{obj['seconds']['search']:.2f} s ({obj['timed']:,} timed)")
    rej = ", ".join(f"{k} {v:,}" for k, v in obj["rejected"].items())
    console.print(f"rejected: {rej}")
    if "assumption" in obj["host"] and "host_assumption" not in obj["plans"][0]["memory"]:
        console.print(obj["host"]["assumption"], highlight=False)  # the search priced offload with it
    t = FitTable(title=f"Best {len(obj['plans'])} plans, one per family of tp, pp, ep, ZeRO and recompute "
                       f"(peak memory <= {max_memory:.0%})", compact=True)
    for col in ("layout", "step s", "vs best", "tok/s per dev", "MFU", "comm", "bubble", "mem"):
        t.add_column(col, num=col != "layout")
    for i, p in enumerate(obj["plans"], 1):
        tm, th = p["time"], p["throughput"]
        ok = {c["metric"]: c["pass"] for c in p["checks"]}

        def mark(text: str, metric: str) -> Text:
            return styled(text, "green" if ok[metric] else "red")

        t.add_row(describe(p["parallel"]), f"{tm['step_s']:.4g}", "best" if i == 1 else f"{p['vs_best']:+.1%}",
                  _per_device(th["tokens_per_s_per_device"]),
                  mark(f"{th['mfu']:.0%}", "mfu"), mark(f"{p['comm_ratio']:.0%}", "comm_ratio"),
                  f"{tm['bubble_s'] / tm['step_s']:.0%}", mark(f"{p['memory']['utilization']:.0%}",
                                                               "peak_memory_fraction"))
    console.print(t)
    print_prediction(obj["plans"][0], title="[bold]Best plan[/bold]")
    if "binding" in obj["plans"][0]:
        console.print(f"what binds it: {obj['plans'][0]['binding']['detail']}", highlight=False)
    for line in obj["plans"][0].get("memory_switches", []):
        console.print(f"memory switch: {line}", highlight=False)
    print_uncertainty(console, obj)
    where = [model, *cluster_flags(cluster, accelerator, devices, devices_per_node, inter_node_gbps, DEFAULT_CLUSTER)]
    print_next(console, next_for_layout(obj["plans"][0], model, where, cl))


def _per_device(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"
