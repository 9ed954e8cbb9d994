"""The performance room: step time, throughput and MFU of a layout on a real topology, and the
efficiency constants fitted to measurements.

Reading order: ``topology`` (rank layout, process groups and the tiers they span),
``collectives`` (alpha-beta times of collectives on switches and full meshes), ``calibration``
(efficiency constants and the hardware rates they give), ``minimize`` (derivative-free
minimisation for the fits), ``fp8_scaling`` (what an FP8 scaling recipe costs a GEMM),
``kernel_level`` (the memory-bound bytes an engine's fusion level adds), ``compute`` (per-layer
FLOPs and bytes -> time), ``moe_dispatch``, ``eplb`` and ``moe_imbalance`` (the MoE all-to-all's
bytes, expert placement and routing imbalance), ``overlap`` (the window rules: shared links, the
SMs an overlapped collective takes), ``comm`` (every collective of a step and what hides it),
``scale_effects`` (the wait for the slowest rank) and ``perf``
(:func:`evaluate`: compute + exposed communication + bubble, for whole grids).
"""

from dayzero.planner.exports import lazy_exports

EXPORTS = {
    "process_groups": "topology", "scaleup_domain": "topology",
    "Link": "collectives", "group_collective": "collectives",
    "CLUSTER_KEYS": "calibration", "CONSTANT_BOUNDS": "calibration", "MEASURED_FRACTION_MAX": "calibration",
    "PerfConstants": "calibration", "constants_for": "calibration", "load_calibration": "calibration",
    "rates": "calibration",
    "first_simplex": "minimize", "nelder_mead": "minimize",
    "check_dispatcher": "moe_dispatch",
    "rebalance_loads": "eplb",
    "CommOptions": "comm", "Groups": "comm", "ep_overlapped": "comm", "tp_overlapped": "comm",
    "Evaluation": "perf", "PerfOptions": "perf", "evaluate": "perf", "placement": "perf",
}
__all__ = sorted(EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
