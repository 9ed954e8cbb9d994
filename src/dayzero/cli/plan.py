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
    takes_pins,
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
from dayzero.specs.layout_fields import BY_NAME

DEFAULT_MODEL = "dense-3t"
DEFAULT_CLUSTER = "ascend910b-8192"
# 4,096 sequences of 4,096 tokens = 16M tokens per step: Llama 3 405B's final batch size
# (Dubey et al. 2024, "The Llama 3 Herd of Models", sec. 3.4.1).
DEFAULT_GBS = 4096
# the batch of a whole-cluster scenario (plan, day0, compare): sequences and tokens per sequence
ScenarioGbsOpt = Annotated[int, typer.Option("--gbs", "--global-batch-size", min=1,
                                             help="Global batch size, sequences.")]
ScenarioSeqOpt = Annotated[int, typer.Option("--seq", "--seq-length", min=1, help="Sequence length, tokens.")]

# The memory switches the search tries (planner.search.switches), under their declared flags
# (specs.layout_fields): unset, the search decides per layout; --X forces it on, --no-X keeps it off
SearchedFp8ParamOpt = Annotated[Optional[bool], typer.Option(
    *BY_NAME["fp8_param_gather"].flag.names,
    help="FP8 parameter storage and FP8 ZeRO all-gathers (Megatron --fp8-param-gather), under --precision fp8/fp4. "
         "Default: searched, on wherever the engine runs it (it only saves memory and time); --no- keeps it off.")]
SearchedOffloadOpt = Annotated[Optional[bool], typer.Option(
    *BY_NAME["optimizer_offload"].flag.names,
    help="FP32 master weights and AdamW moments in host memory, Adam on the CPU (Megatron --optimizer-cpu-offload, "
         "ZeRO-Offload). Default: searched, only where a layout does not fit at its recompute level without it (it "
         "adds the host Adam and PCIe to the step); --optimizer-offload forces it on, --no- keeps it off.")]

# activation offload (planner.memory.activation_offload) is searched by default where nothing fits without it;
# --activation-offload N pins it (cli.common), --no-activation-offload keeps it off
NoActivationOffloadOpt = Annotated[bool, typer.Option(
    BY_NAME["activation_offload_layers"].keep_off,
    help="Keep activation offload off. Default: searched, the fewest layers per chunk that fit only where a layout "
         "does not fit without recompute and the engine runs it (Megatron: pp 1, no recompute); "
         "--activation-offload N pins it to N.")]


@app.command("plan")
@takes_pins()
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
    pins: dict = {},  # noqa: B006  (takes_pins: one comma-separated option per searched field)
    moments: MomentsOpt = "fp32", allocator: AllocatorOpt = "caching", moe_probs: MoeProbsOpt = "combine",
    act_fp8: ActFp8Opt = False, fp8_params: SearchedFp8ParamOpt = None,
    optimizer_offload: SearchedOffloadOpt = None, activation_offload: ActivationOffloadOpt = 0,
    no_activation_offload: NoActivationOffloadOpt = False,
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
    from dayzero.planner.search.scenario import Scenario, Switches, plan_scenario, scenario_engine
    from dayzero.specs.registry import load_model

    copt = cost_options(tokens, price_per_device_hour, pue, host_overhead, electricity_price, failures)
    spec = with_documents(load_model(model, trust_remote_code), doc_len)
    cl = cluster_from_options(cluster, accelerator, devices, devices_per_node, inter_node_gbps, default=DEFAULT_CLUSTER,
                              power_limit=power_limit)
    check_precision(precision, cl)
    engine = scenario_engine(engine, cl)  # a vendor with an engine of its own (Huawei: MindSpeed) is planned for it
    opts = PerfOptions.for_run(cl, tp_overlap, ep_overlap, moe_imbalance, calibration, attention_kernel,
                               ep_dispatcher=dispatcher_option(ep_dispatcher, engine), fp8_dispatch=fp8_dispatch,
                               fp8_scaling=fp8_scaling, comm_sm_reserved=comm_sm_reserved,
                               fp8_param_gather=bool(fp8_params),
                               optimizer_offload=bool(optimizer_offload), activation_offload_layers=activation_offload,
                               kernel_level=kernel_level, overlap_sm=overlap_sm)
    recipe = memory_recipe(moments, act_fp8, bool(fp8_params), bool(optimizer_offload), activation_offload,
                           allocator, moe_probs)
    switches = Switches(fp8_params, optimizer_offload, activation_offload, no_activation_offload)
    sc = Scenario(spec, cl, gbs, seq, precision, {**pins, "rank_order": rank_order}, switches, engine, recipe,
                  attention_kernel, placement)
    obj = plan_scenario(sc, opts, top_k, max_memory, copt, expert_loads, calibration)
    print_model_notes(spec)  # after the work: an error stays one line
    if json_out:
        emit_json({**obj, **model_notes(spec)})
        return
    print_plans(obj, spec, cl, gbs, seq, max_memory)
    where = [model, *cluster_flags(cluster, accelerator, devices, devices_per_node, inter_node_gbps, DEFAULT_CLUSTER)]
    print_next(console, next_for_layout(obj["plans"][0], model, where, cl))


def print_plans(obj: dict, spec, cl, gbs: int, seq: int, max_memory: float) -> None:
    """The plan object as tables: what was searched, the best plans, the best one in full."""
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


def _per_device(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"
