"""What to change when a layout does not fit: every single-flag change of the layout, checked.

``dayzero memory`` ends a layout whose peak is above the target with the changes that bring it
under, each estimated with the same memory model, so the advice is a measurement rather than a
rule of thumb. Changes, in the order they cost step time (cheapest first, roughly): shard more
with ZeRO, recompute activations, sequence parallelism, smaller micro-batches, then more tensor,
pipeline or context parallelism at the same device count (data parallelism shrinks in step).
Two memory options come with them: FP8 parameter storage under an FP8/FP4 recipe first (it costs
no step time: MemoryOptions.fp8_params), then the saved activations of the fewest layers per
model chunk that bring it under offloaded to the host (PCIe copies per micro-batch that compute may
hide: MemoryOptions.activation_offload_layers; only where an engine runs it, planner.engines), the
optimizer offloaded to the host last (it adds the host Adam and PCIe to every step:
MemoryOptions.optimizer_offload).
"""

from __future__ import annotations

from dataclasses import dataclass

from dayzero.planner.memory.memory import MemoryOptions, estimate_memory
from dayzero.specs import layout_rules
from dayzero.specs.grid import module_mask, module_names
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import ParallelConfig


@dataclass(frozen=True)
class Remedy:
    change: tuple[str, ...]  # the flags that change, as typed: ("--zero", "3")
    parallel: ParallelConfig
    peak_bytes: int
    utilization: float
    option: bool = False  # a memory option (its flag added to the command), not a layout change


def _candidates(p: ParallelConfig, spec: ModelSpec | None = None) -> list[tuple[tuple[str, ...], ParallelConfig]]:
    out: list[tuple[tuple[str, ...], ParallelConfig]] = []
    for z in range(p.zero + 1, 4):
        out.append((("--zero", str(z)), p.with_(zero=z)))
    if p.recompute == "none":
        out.append((("--recompute", "selective"), p.with_(recompute="selective")))
    if p.recompute != "full" and spec is not None:  # the search's module sets beyond the current one
        from dayzero.planner.search.search import SearchSpace

        have = set(p.recompute_modules)
        for _, mask in SearchSpace(recompute=("selective",)).levels(spec):
            ms = module_names(mask)
            if set(ms) > have and ms != ("core_attn",):
                out.append((("--recompute-modules", ",".join(ms)),
                            p.with_(recompute="selective", recompute_modules=ms)))
    if p.recompute != "full" or p.recompute_layers is not None:
        out.append((("--recompute", "full"), p.with_(recompute="full", recompute_layers=None)))
    if p.tp > 1 and not p.sequence_parallel:
        out.append((("--sequence-parallel",), p.with_(sequence_parallel=True)))
    if p.mbs > 1:
        out.append((("--mbs", str(p.mbs // 2)), p.with_(mbs=p.mbs // 2)))
    if p.dp % 2 == 0:  # the same devices: the new degree takes its factor 2 from dp
        for name in ("tp", "pp", "cp"):
            q = p.with_(**{name: 2 * getattr(p, name)}, dp=p.dp // 2, layer_split=None)
            out.append(((f"--{name}", str(getattr(q, name)), "--dp", str(q.dp)), q))
    return out


def single_changes(spec: ModelSpec, parallel: ParallelConfig, devices: int, capacity_bytes: int,
                   options: MemoryOptions, target: float) -> list[Remedy]:
    """The valid one-flag changes of ``parallel`` whose peak is at most ``target`` of capacity,
    cheapest first."""
    found = []
    tried = [(change, q, options, False) for change, q in _candidates(parallel, spec)]
    if parallel.precision != "bf16" and not options.fp8_params:
        tried.insert(0, (("--fp8-param-gather",), parallel, options.with_(fp8_params=True), True))
    n = fewest_offloaded_layers(spec, parallel, capacity_bytes, options, target)
    if n:
        tried.append((("--activation-offload", str(n)), parallel, options.with_(activation_offload_layers=n), True))
    if not options.optimizer_offload:
        tried.append((("--optimizer-offload",), parallel, options.with_(optimizer_offload=True), True))
    for change, q, opts, option in tried:
        if layout_rules.problems(q, spec, devices):
            continue
        rep = estimate_memory(spec, q, capacity_bytes, opts)
        if rep.utilization <= target:
            found.append(Remedy(change, q, rep.peak_bytes, rep.utilization, option))
    return _least_module_sets(spec, found)


def fewest_offloaded_layers(spec: ModelSpec, parallel: ParallelConfig, capacity_bytes: int, options: MemoryOptions,
                            target: float) -> int:
    """The fewest layers per model chunk whose saved activations, offloaded to the host, bring
    ``parallel``'s peak to at most ``target`` of capacity (more than ``options`` offloads already);
    0 when none does, or when no engine runs the layout with activation offload (planner.engines).
    The bisection is :func:`dayzero.planner.memory.activation_offload.fewest_offloaded_layers`, on this
    one layout as laid out (its own layer split)."""
    import numpy as np

    from dayzero.planner.engines import engines_for
    from dayzero.planner.memory.activation_offload import COLUMN
    from dayzero.planner.memory.activation_offload import fewest_offloaded_layers as bisect
    from dayzero.specs.parallel import model_split

    if layout_rules.problems(parallel, spec) or not engines_for(parallel, {"activation_offload_layers": 1}):
        return 0
    split = parallel.layer_split or model_split(spec.layers, parallel.pp * parallel.vpp, spec.mtp_layers)
    floor = max(options.activation_offload_layers, parallel.activation_offload_layers)  # the layout's own too

    def memory(g: dict) -> np.ndarray:
        return np.array([estimate_memory(spec, parallel, capacity_bytes,
                                         options.with_(activation_offload_layers=max(int(k), floor))).peak_bytes
                         for k in g[COLUMN]], dtype=float)

    n = int(bisect(memory, {"tp": np.array([parallel.tp])}, target * capacity_bytes,
                   np.array([min(x for x in split if x > 0)]))[0])
    return max(n, floor + 1) if n else 0


def _least_module_sets(spec: ModelSpec, found: list[Remedy]) -> list[Remedy]:
    """``found`` without the --recompute-modules changes whose set drops every tensor another found
    set drops (search.level_order): they fit too but replay more, so are never the cheaper fix."""
    from dayzero.planner.search.search import dropped_terms

    sets = [(i, dropped_terms(spec, module_mask(r.parallel.recompute_modules))) for i, r in enumerate(found)
            if r.change[0] == "--recompute-modules"]
    worse = {i for i, a in sets for j, b in sets if j != i and b <= a and (b < a or j < i)}
    return [r for i, r in enumerate(found) if i not in worse]
