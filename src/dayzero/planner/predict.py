"""One layout's prediction as the ``dayzero predict --json`` object: memory, time, throughput, checks.

The checks are the targets a Day-0 adaptation is judged by (:mod:`dayzero.planner.targets`): MFU
above 50 %, peak memory below 85 % of device capacity, exposed communication below 15 % of the step.
"""

from __future__ import annotations

from dayzero.planner.engines import engines_for, pipelined_fsdp
from dayzero.planner.perf.perf import Evaluation, PerfOptions, evaluate
from dayzero.planner.perf.topology import process_groups
from dayzero.planner.schedule import held_zero
from dayzero.planner.targets import MEMORY_TARGET, Targets
from dayzero.specs import layout_rules
from dayzero.specs.cluster import Cluster
from dayzero.specs.counting import flops_per_token, mtp_flops_per_token
from dayzero.specs.grid import encode
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import ParallelConfig, model_split, with_even_split

__all__ = ["MEMORY_TARGET", "Targets", "checks", "predict", "prediction", "with_even_split"]


def checks(mfu: float, memory_utilization: float, comm_ratio: float, targets: Targets = Targets()) -> list[dict]:
    return [
        {"metric": "mfu", "target": f"> {targets.mfu:.0%}", "value": mfu, "pass": bool(mfu > targets.mfu)},
        {"metric": "peak_memory_fraction", "target": f"< {targets.memory:.0%}", "value": memory_utilization,
         "pass": bool(memory_utilization < targets.memory)},
        {"metric": "comm_ratio", "target": f"< {targets.comm_ratio:.0%}", "value": comm_ratio,
         "pass": bool(comm_ratio < targets.comm_ratio)},
    ]


def prediction(spec: ModelSpec, parallel: ParallelConfig, cluster: Cluster, ev: Evaluation, i: int,
               memory: dict, options: PerfOptions, engines: list[str] | None = None) -> dict:
    """Assemble the contract object for candidate ``i`` of an evaluation (``engines``: the
    engines label, :func:`fitting_engines`; default the engines that run the layout)."""
    f = lambda name: float(getattr(ev, name)[i])  # noqa: E731
    mfu, ratio = f("mfu"), f("comm_ratio")
    groups = process_groups(parallel, cluster)
    return {
        "model": spec.name, "cluster": cluster.name, "devices": cluster.devices, "vendor": cluster.accelerator.vendor,
        "parallel": {**parallel.to_dict(), "gemm_precision": parallel.precision},
        "fits": bool(memory["fits"]),
        "memory": memory,
        "time": {"step_s": f("step_s"), "compute_s": f("compute_s"), "comm_exposed_s": f("comm_exposed_s"),
                 "bubble_s": f("bubble_s"), "optimizer_s": f("optimizer_s"),
                 "straggler_s": f("straggler_s"),
                 # activation-offload copies no compute hides (in compute's micro-batches; memory.activation_offload)
                 **({"activation_offload_s": float(ev.offload_s[i])}
                    if max(options.activation_offload_layers, parallel.activation_offload_layers) else {})},
        "throughput": {"tokens_per_s": f("tokens_per_s"), "tokens_per_s_per_device": f("tokens_per_s_per_device"),
                       "model_tflops_per_device": f("model_tflops_per_device"), "mfu": mfu,
                       "model_flops_per_token": flops_per_token(spec, parallel.seq, causal=True).train
                       + mtp_flops_per_token(spec, parallel.seq, causal=True)},
        "comm_ratio": ratio,
        "checks": checks(mfu, memory["utilization"], ratio),
        "communication": ev.inventory_of(i),
        "groups": {k: g.to_dict() for k, g in groups.items() if g.size > 1},
        # the engines that run this layout as laid out with the run's switches (planner.engines), in
        # their memory where it fits
        "engines": engines_for(parallel, options.switches()) if engines is None else engines,
        # the run's switches the engine labels read, where one is on (planner.engines.RUN_SWITCHES)
        **({"switches": options.switches()} if any(options.switches().values()) else {}),
        # the routing imbalance the MoE terms used, and where it came from (planner.perf.moe_imbalance)
        **({"moe_imbalance": options.comm.describe_imbalance(parallel.ep, spec.moe.experts),
            # how tokens reach their experts: dedup (once per rank and remote node) or all_to_all (every copy)
            "moe_dispatch": {"dispatcher": options.comm.ep_dispatcher, "fp8": options.comm.fp8_dispatch,
                             # the EP all-to-all overlapped with another micro-batch (planner.perf.comm.ep_overlapped)
                             "ep_overlap": bool(ev.ep_overlap[i]) if ev.ep_overlap is not None else False}}
           if spec.is_moe else {}),
    }


def check_offload_layout(spec: ModelSpec, parallel: ParallelConfig, layers: int) -> None:
    """``--activation-offload layers`` (or the layout's own, if more: ParallelConfig.
    activation_offload_layers) fits the layout: fewer than the smallest model chunk's layers
    (planner.memory.activation_offload.check_activation_offload)."""
    from dayzero.planner.memory.activation_offload import check_activation_offload

    layers = max(layers, parallel.activation_offload_layers)
    if layers:
        split = parallel.layer_split or model_split(spec.layers, parallel.pp * parallel.vpp, spec.mtp_layers)
        check_activation_offload(layers, min(x for x in split if x > 0))


def predict(spec: ModelSpec, parallel: ParallelConfig, cluster: Cluster, options: PerfOptions | None = None,
            memory_options=None) -> dict:
    """Predict one layout (raises LayoutError when it is impossible)."""
    from dayzero.planner.memory.memory import MemoryOptions, estimate_memory

    options = options or PerfOptions()
    parallel = layout_rules.validate(with_even_split(spec, parallel), spec, cluster.devices)
    memory_options = memory_options or MemoryOptions.for_run(cluster.accelerator, options.attention_kernel)
    report = estimate_memory(spec, parallel, cluster.memory_bytes, memory_options)
    ev = evaluate(spec, encode([parallel]), cluster, options, layer_split=parallel.layer_split)
    engines = fitting_engines(spec, parallel, cluster.memory_bytes, memory_options, report.fits, options.switches(),
                              cluster.accelerator.vendor)
    memory = {**report.to_dict(), **host_memory(spec, parallel, cluster, memory_options, report)}
    return prediction(spec, parallel, cluster, ev, 0, memory, options, engines)


def host_memory(spec: ModelSpec, parallel: ParallelConfig, cluster: Cluster, memory_options, report) -> dict:
    """What the host holds per device for an offloading layout (empty without offload): the offloaded
    optimizer's FP32 master, moments and gradient copy (:func:`dayzero.planner.memory.offload.host_bytes`) plus
    the saved activations offloaded layers send down (the busiest stage's activations without offload
    less with it), against the device's share of the cluster's host memory
    (:attr:`dayzero.specs.host.HostSpec.memory_bytes`, the same cap the search puts on offload), with
    the host figures the cluster assumed (``host_assumed``: the DGX H100's, where no document states one)."""
    from dayzero.planner.memory.memory import estimate_memory
    from dayzero.planner.memory.offload import host_bytes

    opt = bool(parallel.optimizer_offload or memory_options.optimizer_offload)
    act = bool(parallel.activation_offload_layers or memory_options.activation_offload_layers)
    if not (opt or act):
        return {}
    capacity_bytes, host = cluster.memory_bytes, cluster.host
    total = 0.0
    if opt:
        on_device = estimate_memory(spec, parallel.with_(optimizer_offload=False), capacity_bytes,
                                    memory_options.with_(optimizer_offload=False))
        total += host_bytes([s.optimizer for s in on_device.stages], memory_options.master_bytes,
                            memory_options.optim_bytes)
    if act:
        kept = estimate_memory(spec, parallel.with_(activation_offload_layers=0), capacity_bytes,
                               memory_options.with_(activation_offload_layers=0))
        total += max(max(a.activations - b.activations for a, b in zip(kept.stages, report.stages)), 0)
    return {"host_bytes": total, "host_limit_bytes": host.memory_bytes, "host_fits": bool(total <= host.memory_bytes),
            "host_system": host.system if "memory_bytes" not in host.given else "the cluster file",
            "host_assumed": list(host.assumed),
            # one line naming the figures taken from the DGX H100's, where the cluster's host states none
            **({"host_assumption": host.assumption()} if host.assumed else {})}


def fitting_engines(spec: ModelSpec, parallel: ParallelConfig, capacity_bytes: int, memory_options,
                    fits: bool, switches: dict | None = None, vendor: str | None = None) -> list[str]:
    """The engines that run ``parallel`` as laid out (:func:`dayzero.planner.engines.engines_for`),
    less, when it ``fits`` under ``memory_options``, those that hold its memory otherwise and do
    not fit it: FSDP under torch.distributed.pipelining keeps ZeRO-3's parameters gathered and
    gradients unsharded under pp > 1 (MemoryOptions.pipelined_fsdp, planner.schedule.held_zero),
    so a ZeRO-3 + pp layout priced as laid out can fit where torchtitan and the runtime cannot run it."""
    from dayzero.planner.memory.memory import estimate_memory

    out = []
    # with the run's switches (planner.engines.RUN_SWITCHES), on the cluster's vendor (engines.runs_on_vendor)
    for name in engines_for(parallel, switches, vendor):
        mine = memory_options.with_(pipelined_fsdp=pipelined_fsdp(name))
        same = held_zero(parallel.zero, parallel.pp, mine.pipelined_fsdp) == held_zero(
            parallel.zero, parallel.pp, memory_options.pipelined_fsdp)
        if same or not fits or estimate_memory(spec, parallel, capacity_bytes, mine).fits:
            out.append(name)
    return out
