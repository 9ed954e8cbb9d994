"""Search the whole parallel space: enumerate, reject the indivisible, prune by memory, rank by
predicted step time.

The space is the cartesian product of per-dim options (tp, pp, cp, ep, etp, vpp, pipeline schedule,
mbs, zero, recompute, sequence parallelism, rank order; dp = devices / (tp pp cp), kept only where it
is one of the pinned dp degrees when those are given), held as the planner's grid
(:mod:`dayzero.specs.grid`). Enumeration is staged with numpy so a rejected prefix is counted
(times the size of the dims not yet expanded) without being materialised: after each dim is
expanded, every layout rule (:mod:`dayzero.specs.layout_rules`, the rules layout_rules.problems
reports) whose columns are now present is ANDed into a mask, together with the few limits that
define the space itself (:func:`space_mask`). Survivors are checked against device memory in one
vectorised call (:func:`dayzero.planner.memory.memory.peak_memory_batch`), and only layouts that fit are
timed, in one vectorised call of the step-time model (:func:`dayzero.planner.perf.perf.evaluate`).
Every layout considered ends in exactly one bucket: a plan, or rejected as ``indivisible``,
``does not fit`` or ``worse``. When no layout passes the rules, the error names the rules (and
pins) that rejected them, with how many layouts each rejected (:func:`why_none`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dayzero.errors import FitError
from dayzero.planner.engines import (
    default_engine,
    engine_mask,
    get_engine,
    pipelined_fsdp,
    runs_on_vendor,
    with_engine_overlaps,
)
from dayzero.planner.memory.activation_offload import COLUMN as OFFLOAD
from dayzero.planner.perf.perf import PerfOptions, evaluate
from dayzero.planner.perf.topology import scaleup_domain
from dayzero.planner.search.cp_choice import open_rows, with_cp_comm
from dayzero.planner.search.cp_choice import runs as runs_cp
from dayzero.planner.search.explain import binding, family
from dayzero.planner.search.search_fit import (  # noqa: F401  (the search's parts, importable from here as before)
    SwitchPlan,
    _fitting_variants,
    chunk_layers,
    fewer_layers_up_the_ladder,
    fewest_recomputed_layers,
    offloaded_variants,
    smallest_chunk,
    switch_plan,
)
from dayzero.planner.search.search_space import (  # noqa: F401
    STAGES,
    VARIANT_COLUMNS,
    VARIANTS,
    SearchSpace,
    _take,
    _with,
    dropped_terms,
    enumerate_layouts,
    level_order,
    searched_schedules,
    space_mask,
    why_none,
)
from dayzero.planner.search.switches import SWITCHES as SWITCH_REGISTRY
from dayzero.planner.targets import MEMORY_TARGET
from dayzero.specs.cluster import Cluster
from dayzero.specs.grid import A2A, CP_OPEN, decode
from dayzero.specs.grid import SWITCHES as SWITCH_COLUMNS
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import ParallelConfig

CHUNK = 100_000  # bases per vectorised batch (bounds memory)

def searched_memory(memory_options, space: SearchSpace | None):
    """``memory_options`` as the search's engine holds memory (:func:`dayzero.planner.engines.
    pipelined_fsdp`; unpinned, as the engines that run the layouts it changes)."""
    return memory_options.with_(pipelined_fsdp=pipelined_fsdp(space.engine if space else None))


@dataclass
class SearchResult:
    candidates: dict  # grid of the top plans, best first
    evaluation: object  # perf Evaluation of the top plans
    peak_bytes: np.ndarray
    considered: int
    rejected: dict = field(default_factory=dict)
    timed: int = 0  # layouts whose step time was evaluated


def search(spec: ModelSpec, cluster: Cluster, gbs: int, seq: int, precision: str = "bf16",
           options: PerfOptions | None = None, top_k: int = 5, max_memory: float = MEMORY_TARGET,
           space: SearchSpace | None = None, memory_fn=None, memory_options=None) -> SearchResult:
    """Best ``top_k`` layouts by predicted step time among those whose peak memory is at most
    ``max_memory`` x device capacity, with GEMMs in ``precision`` (bf16 | fp8 | fp4). Raises
    FitError when none fits.

    Pruning is exact under the models: for each ZeRO stage only the recompute levels that fit with
    no fitting level below them are timed (:func:`level_order`: a level above recomputes more and
    only adds time), the fastest of them ranked, and ZeRO-2 only at levels where ZeRO-1 does not fit
    (ZeRO-2 adds a reduce-scatter per micro-batch and nothing else). The memory switches
    (:mod:`dayzero.planner.search.switches`) are set per row: FP8 parameter gather wherever an engine runs
    it (it only saves), optimizer offload only at the (base, ZeRO, level)s where nothing at or below
    that level fits without it (it only adds time), and, for a row under full recompute of N
    layers, offloaded with fewer replayed layers (:func:`fewer_layers_up_the_ladder`). The
    context-parallel exchange is set per row too (:mod:`dayzero.planner.search.cp_choice`): the only one
    the engine runs, else the faster of the ring and the all-to-all where the heads split over cp
    and the all-to-all's buffers fit."""
    default_memory = memory_fn is None
    if memory_fn is None:
        memory_fn, options, memory_options = _default_memory(cluster, options, memory_options, space)
    space = space or SearchSpace()
    options = with_engine_overlaps(options or PerfOptions(), space.engine)
    devices, domain = cluster.devices, scaleup_domain(cluster)
    bases, considered, indivisible, variants, engine_bases = _searched_bases(spec, devices, gbs, seq, space, domain,
                                                                             precision, options)
    engine_zero = 0  # full layouts the engine cannot run by their ZeRO stage (engine_bases: by their base)
    n = len(bases["tp"])
    codes = space.resolve(spec, devices, seq, domain)
    capacity = cluster.memory_bytes
    limit = max_memory * capacity
    switches = switch_plan(spec, cluster, options, memory_options, space)
    probe = _MemoryProbe(spec, memory_fn, capacity, memory_options, limit, switches, default_memory)
    memory, memory_less = probe.peak, (probe.less if default_memory else None)
    zeros, levels = codes["zero"], _levels(spec, space, options)
    # activation offload (planner.memory.activation_offload): pinned by the run's --activation-offload N, kept off
    # by --no-activation-offload (SearchSpace.no_switches), else tried where nothing fits without it
    pinned = max(options.activation_offload_layers, getattr(memory_options, "activation_offload_layers", 0) or 0)
    offload_searched = not pinned and OFFLOAD not in space.no_switches
    below = level_order(spec, levels)
    best = []  # per chunk: (its top rows, their step times, their peaks)
    n_fit = n_timed = 0
    for start in range(0, n, CHUNK):
        chunk = {k: v[start:start + CHUNK] for k, v in bases.items()}
        found, fit_here, engine_here = _fitting_variants(spec, chunk, zeros, levels, memory, limit, space.engine,
                                                         searched_dual=space.schedule is None, below=below,
                                                         switches=switches, memory_less=memory_less,
                                                         run_switches=options.switches())
        n_fit += fit_here
        engine_zero += engine_here
        off = None
        if offload_searched:  # activation offload where no recompute does not fit (offloaded_variants)
            off, off_peaks, _, rescued = offloaded_variants(spec, chunk, zeros, levels, memory, limit, switches,
                                                            space.engine, options.switches())
            n_fit += rescued
        found = [p for p in found if len(p[0])]
        if not found and (off is None or not len(off_peaks)):
            continue
        if found:
            cand, peaks = _variant_rows(spec, chunk, found, levels, pinned, memory, limit, switches, space,
                                        options.switches())
            if off is not None and len(off_peaks):
                cand = {k: np.concatenate([cand[k], off[k]]) for k in cand}
                peaks = np.concatenate([peaks, off_peaks])
        else:
            cand, peaks = off, off_peaks
        n_timed += len(peaks)
        best.append(_fastest(spec, cand, peaks, probe, limit, space, cluster, options, top_k))
    if n_fit == 0:
        raise _no_fit(spec, cluster, gbs, seq, max_memory, space, considered, engine_bases + engine_zero,
                      probe.host_short)
    allrows = {k: np.concatenate([b[0][k] for b in best]) for k in best[0][0]}
    steps, peaks = np.concatenate([b[1] for b in best]), np.concatenate([b[2] for b in best])
    order = np.argsort(steps, kind="stable")[:top_k]
    top = {k: v[order] for k, v in allrows.items()}
    ev = evaluate(spec, top, cluster, options)
    rejected = _rejected(space, indivisible, n * variants, n_fit, len(order), engine_bases, engine_zero)
    return SearchResult(candidates=top, evaluation=ev, peak_bytes=peaks[order], considered=considered,
                        rejected=rejected, timed=n_timed)


def _default_memory(cluster: Cluster, options: PerfOptions | None, memory_options, space: SearchSpace | None):
    """The default memory model (:func:`peak_memory_batch`), the options it runs with, and its memory
    options: the run's accelerator and attention kernel, held as the search's engine holds memory."""
    from dayzero.planner.memory.memory import MemoryOptions, peak_memory_batch

    options = options or PerfOptions()
    memory_options = searched_memory(memory_options or MemoryOptions.for_run(cluster.accelerator,
                                                                             options.attention_kernel), space)
    return peak_memory_batch, options, memory_options


def _searched_bases(spec: ModelSpec, devices: int, gbs: int, seq: int, space: SearchSpace, domain: int,
                    precision: str, options: PerfOptions) -> tuple[dict, int, int, int, int]:
    """The bases the search climbs (:func:`enumerate_layouts`), with each base's cp exchange set (the only
    one the engine runs, else the ring, opened later: planner.search.cp_choice) and, with an engine, only
    the bases it runs (its limits on every column but zero, with the run's switches: engines.RUN_SWITCHES;
    zero is applied per ZeRO stage). Returns (bases, considered, indivisible, variants per base, full
    layouts the engine cannot run by their base)."""
    bases, considered, indivisible, variants = enumerate_layouts(spec, devices, gbs, seq, space, domain, precision)
    engine_bases = 0
    bases, left_out = with_cp_comm(spec, bases, devices, space.engine, options.switches(), space.cp_comm)
    if runs_cp(space.engine, options.switches())[0]:  # the engine runs the ring: left out by the --cp-comm pin
        considered -= left_out * variants
    else:  # by what the engine runs
        engine_bases += left_out * variants
    if space.engine:
        runs = engine_mask(space.engine, bases, options.switches())
        engine_bases += int((~runs).sum()) * variants
        bases = _take(bases, runs)
    return bases, considered, indivisible, variants, engine_bases


def _levels(spec: ModelSpec, space: SearchSpace, options: PerfOptions) -> list:
    """The recompute levels searched (SearchSpace.levels), refused with a one-line ConfigError where the
    engine runs none of the recompute modes asked for with the run's switches."""
    levels = space.levels(spec, options.switches())
    if not levels:
        from dayzero.errors import ConfigError

        raise ConfigError("--engine", None, f"{space.engine} runs none of the recompute modes "
                          f"{', '.join(space.recompute)} with "
                          f"{', '.join(f'{k} {v}' for k, v in options.switches().items() if v)}; widen --recompute")
    return levels


def _fastest(spec: ModelSpec, cand: dict, peaks: np.ndarray, probe: _MemoryProbe, limit: float, space: SearchSpace,
             cluster: Cluster, options: PerfOptions, top_k: int) -> tuple[dict, np.ndarray, np.ndarray]:
    """The ``top_k`` fastest rows of ``cand`` (their grid, step times and peaks), timed with the cp
    exchange each open row is faster with (comm.choose_cp_comm) and that exchange's peak."""
    cand, a2a_peaks = _open_cp(spec, cand, peaks, probe.a2a, limit, space, options.switches())
    ev = evaluate(spec, cand, cluster, options)
    if CP_OPEN in cand:
        peaks = np.where(cand[CP_OPEN] & (ev.cp_comm == A2A), a2a_peaks, peaks)
        cand = {k: v for k, v in cand.items() if k != CP_OPEN}
        cand["cp_comm"] = np.asarray(ev.cp_comm, dtype=np.int64)
    order = np.argsort(ev.step_s, kind="stable")[:top_k]
    return {k: v[order] for k, v in cand.items()}, ev.step_s[order], peaks[order]


def _rejected(space: SearchSpace, indivisible: int, full: int, n_fit: int, kept: int, engine_bases: int,
              engine_zero: int) -> dict:
    """Why the layouts not kept were rejected (``full``: the full layouts of the searched bases). A
    fitting layout can be timed in several rows (a switch, fewer replayed or offloaded layers): never
    fewer worse than none."""
    rejected = {"indivisible": indivisible, "does not fit": full - n_fit - engine_zero,
                "worse": max(0, n_fit - kept)}
    if space.engine:
        rejected["engine"] = engine_bases + engine_zero
    elif engine_zero:  # searched DualPipeV rows at ZeRO stages no engine runs them with
        rejected["no engine"] = engine_zero
    return rejected


@dataclass
class _MemoryProbe:
    """The search's memory calls: ``memory_fn``'s peaks (with ``memory_options``) capped by what the host
    holds (a row whose switches keep more in host memory than the device's share fits nowhere), the
    term-dropping switches priced in the same call (:meth:`less`, the default memory model only), and
    the peaks of ring rows exchanged by all-to-all instead (:meth:`a2a`). ``host_short``: some memory
    check fit the device but not what the host holds (for the FitError)."""

    spec: ModelSpec
    memory_fn: object
    capacity: float
    memory_options: object
    limit: float
    switches: SwitchPlan
    default_memory: bool
    host_short: bool = False

    def peak(self, grid: dict) -> np.ndarray:
        if self.memory_options is None:
            return np.asarray(self.memory_fn(self.spec, grid, self.capacity), dtype=float)
        return self.host_capped(grid, np.asarray(self.memory_fn(self.spec, grid, self.capacity,
                                                                self.memory_options), dtype=float))

    def host_capped(self, grid: dict, peaks: np.ndarray) -> np.ndarray:
        # only the rows that fit the device are asked: the others fit nowhere anyway
        fits = np.flatnonzero(peaks <= self.limit)
        if not len(fits):
            return peaks
        ok = self.switches.on_host({k: np.asarray(v)[fits] for k, v in grid.items()})
        self.host_short = self.host_short or not ok.all()
        out = peaks.copy()
        out[fits[~ok]] = np.inf
        return out

    def less(self, grid: dict, without):
        """The peaks, and those with each term set of ``without`` dropped (peak_memory_batch prices the
        term-dropping switches in the same call); the later passes' peaks are read only where those
        switches fit the host (_fitting_variants)."""
        peaks, less = self.memory_fn(self.spec, grid, self.capacity, self.memory_options, without=without)
        # each set's peaks are those of the rows with the switches that drop those terms on
        ons = [{s.name: 1 for s in SWITCH_REGISTRY if s.drops and set(s.drops) <= set(dropped)}
               for dropped in without]
        return self.host_capped(grid, peaks), [self.host_capped(_with(grid, **on), pk) for on, pk in zip(ons, less)]

    def a2a(self, grid: dict, p2p_peaks: np.ndarray) -> np.ndarray:
        """The peaks of ring rows exchanged by all-to-all instead (planner.search.cp_choice): with the
        default memory model their peaks plus the a2a buffers' difference (memory.a2a_extra_batch,
        exact), else the memory function's own."""
        if self.default_memory:
            from dayzero.planner.memory.memory import a2a_extra_batch

            return p2p_peaks + a2a_extra_batch(self.spec, grid, self.memory_options)
        return self.peak({**grid, "cp_comm": np.full(len(p2p_peaks), A2A)})


def _variant_rows(spec: ModelSpec, chunk: dict, found: list, levels, pinned: int, memory, limit: float,
                  switches: SwitchPlan, space: SearchSpace, run_switches: dict) -> tuple[dict, np.ndarray]:
    """The grid rows and peaks of the fitting variants ``found`` (_fitting_variants) of the bases
    ``chunk``: their ZeRO stage, recompute level and switches set, the fewest recomputed layers that
    fit, fewer replayed layers up the switch ladder, and the user's pinned offloaded layers."""
    level_rc = np.array([rc for rc, _ in levels], dtype=np.int64)
    level_modules = np.array([m for _, m in levels], dtype=np.int64)
    idx = np.concatenate([p[0] for p in found])
    cand = {k: v[idx] for k, v in chunk.items()}
    cand["zero"] = np.concatenate([np.full(len(p[0]), p[1]) for p in found]).astype(np.int64)
    level = np.concatenate([p[2] for p in found]).astype(np.int64)
    cand["recompute"], cand["recompute_modules"] = level_rc[level], level_modules[level]
    peaks = np.concatenate([p[3] for p in found])
    for s in SWITCH_COLUMNS:
        cand[s] = np.concatenate([p[4][s] for p in found]).astype(np.int64)
    rung = np.concatenate([np.full(len(p[0]), p[5]) for p in found]).astype(np.int64)
    cand["recompute_layers"], peaks = fewest_recomputed_layers(spec, cand, peaks, memory, limit)
    cand, peaks = fewer_layers_up_the_ladder(spec, cand, peaks, rung, switches, memory, limit, space.engine,
                                             run_switches)
    # the layout's own offloaded layers: the user's pin (capped per layout at its chunk's layers - 1,
    # planner.memory.activation_offload.offloaded_layers), else 0 (the searched rows are off's)
    cand[OFFLOAD] = np.minimum(pinned, np.maximum(smallest_chunk(spec, cand["pp"], cand["vpp"]) - 1, 0))
    return cand, peaks


def _no_fit(spec: ModelSpec, cluster: Cluster, gbs: int, seq: int, max_memory: float, space: SearchSpace,
            considered: int, engine_left_out: int, host_short: bool) -> FitError:
    """The FitError of a search where no layout fits: the memory asked, the layouts considered, those
    the engine cannot run, the pins, and whether the host's memory was what ruled some out."""
    capacity = cluster.memory_bytes
    left_out = f" ({engine_left_out:,} layouts {space.engine} cannot run were left out)"
    return FitError(f"no layout of {spec.name} fits in {max_memory:.0%} of {capacity / 2**30:.1f} GiB per device on "
                    f"{cluster.devices} devices (gbs {gbs}, seq {seq}; {considered:,} layouts considered); lower --seq "
                    "or add devices" + (left_out if space.engine else "")
                    + (f"; or change the pinned {space.pins()}" if space.pins() else "")
                    + ("; some fit the device only with more in host memory than the "
                       f"{cluster.host.memory_text()}" if host_short else ""))


def _open_cp(spec: ModelSpec, cand: dict, peaks: np.ndarray, a2a_memory, limit: float, space: SearchSpace,
             switches: dict):
    """``cand`` with the ring rows that could run a2a instead and still fit marked
    :data:`~dayzero.specs.grid.CP_OPEN` (planner.search.cp_choice.open_rows), and those rows' a2a peaks
    (``a2a_memory(rows, their ring peaks)``; inf elsewhere); unchanged without such rows."""
    rows = open_rows(spec, cand, space.engine, switches, space.cp_comm)
    a2a_peaks = np.full(len(rows), np.inf)
    if not rows.any():
        return cand, a2a_peaks
    idx = np.flatnonzero(rows)
    a2a_peaks[idx] = a2a_memory({k: v[idx] for k, v in cand.items()}, peaks[idx])
    return {**cand, CP_OPEN: rows & (a2a_peaks <= limit)}, a2a_peaks


FAMILY_POOL = 20  # layouts timed per plan shown, so that the runner-ups can come from other families


def best_of_families(layouts: list[ParallelConfig], k: int) -> list[int]:
    """Indices of the best layout of each of the ``k`` best families (:func:`explain.family`),
    best first; when fewer families exist, the next best layouts fill the list."""
    chosen, seen = [], set()
    for i, p in enumerate(layouts):
        if family(p) not in seen:
            seen.add(family(p))
            chosen.append(i)
            if len(chosen) == k:
                return chosen
    rest = [i for i in range(len(layouts)) if i not in chosen]
    return sorted(chosen + rest[:k - len(chosen)], key=lambda i: i)


def candidate_layouts(result: SearchResult) -> list[ParallelConfig]:
    """The top plans' layouts, best first."""
    return decode(result.candidates)


def plan(spec: ModelSpec, cluster: Cluster, gbs: int, seq: int, precision: str = "bf16",
         options: PerfOptions | None = None, top_k: int = 5, max_memory: float = MEMORY_TARGET,
         space: SearchSpace | None = None, memory_options=None, cloud: int = 0, uncertainty: bool = False,
         smallest_fit: bool = True) -> dict:
    """The ``dayzero plan --json`` object: the best layouts as full predictions, best first, with how
    many layouts were considered and why the others were rejected. With ``cloud`` > 0 it also
    holds ``candidates``: the step time and peak memory of the best ``cloud`` fitting layouts
    (the search's own vectorised figures, no extra prediction), the plans among them. With
    ``uncertainty`` it also holds ``error_band`` (the backtest's cross-source error for the best
    plan's family and precision, :mod:`dayzero.planner.search.error_band`) and ``sensitivity`` (the best
    plan under perturbed inputs, :mod:`dayzero.planner.search.sensitivity`). When nothing fits, the
    FitError says the smallest device count that does (:func:`smallest_fitting`; not with
    ``smallest_fit=False``)."""
    import time

    from dayzero.planner.memory.memory_options import MemoryOptions
    from dayzero.planner.predict import predict
    from dayzero.planner.search.sensitivity import POOL

    space, options = _engine_of(space or SearchSpace(), options, cluster)
    options = with_engine_overlaps(options or PerfOptions(), space.engine)
    t0 = time.perf_counter()
    want = max(top_k * FAMILY_POOL, cloud)
    try:
        result = search(spec, cluster, gbs, seq, precision, options, max(want, POOL) if uncertainty else want,
                        max_memory, space, memory_options=memory_options)
    except FitError as e:
        if not smallest_fit:
            raise
        found, searched = smallest_fitting(spec, cluster, gbs, seq, precision, options, max_memory, space,
                                           memory_options)
        raise FitError(f"{e}; {fit_text(found, searched, cluster)}") from None
    t_search = time.perf_counter() - t0
    pool = candidate_layouts(result)
    layouts = pool[:want]
    chosen = best_of_families(layouts, top_k)
    mopts = searched_memory(memory_options or MemoryOptions.for_run(cluster.accelerator, options.attention_kernel),
                            space)
    plans = [predict(spec, layouts[i], cluster, options, mopts) for i in chosen]
    best = plans[0]["time"]["step_s"]
    from dayzero.planner.search.switches import why_words

    for p, i in zip(plans, chosen):
        p["family"] = family(layouts[i])
        p["memory_switches"] = why_words(layouts[i])  # the memory switches on, and why (planner.search.switches)
        p["vs_best"] = p["time"]["step_s"] / best - 1.0
    plans[0]["binding"] = binding(plans[0], max_memory)
    rejected = dict(result.rejected)
    rejected["worse"] += max(0, len(pool) - len(plans))  # timed (runner-ups of a family, the cloud), not plans
    extra = {}
    if uncertainty:
        extra.update(_uncertainty(spec, cluster, options, precision, space, plans[0], result))
    if cloud:
        extra["candidates"] = [{"layout": p.to_dict(), "step_s": float(t), "peak_bytes": float(m)}
                               for p, t, m in zip(layouts, result.evaluation.step_s, result.peak_bytes)]
    return {"model": spec.name, "cluster": cluster.name, "devices": cluster.devices,
            # whose accelerators: an export leaves out the features their stack lacks (planner.engines.FEATURES)
            "vendor": cluster.accelerator.vendor, "gbs": gbs, "seq": seq,
            "precision": precision, "max_memory": max_memory, "plans": plans, "considered": result.considered,
            "rejected": rejected, "timed": result.timed,
            # the host figures offload was priced and capped with (specs/host.py), and which were assumed
            "host": {**cluster.host.to_dict(), **({"assumption": cluster.host.assumption()}
                                                   if cluster.host.assumed else {})},
            "seconds": {"search": t_search, "total": time.perf_counter() - t0}, **extra}


def _engine_of(space: SearchSpace, options: PerfOptions | None, cluster: Cluster) -> tuple[SearchSpace,
                                                                                        PerfOptions | None]:
    """The engine a plan searches and prices: the pinned one, refused with a one-line ConfigError
    where it does not run on the cluster's accelerators; else a vendor's own engine where it has one
    (Huawei: MindSpeed, planner.engines.default_engine), with its expert dispatcher."""
    if space.engine and not runs_on_vendor(space.engine, cluster.accelerator.vendor):
        from dayzero.errors import ConfigError

        e, own = get_engine(space.engine), default_engine(cluster.accelerator.vendor)
        raise ConfigError("--engine", None, f"{e.title} runs on {', '.join(e.vendors)} accelerators, not "
                          f"{cluster.accelerator.vendor}'s; plan with --engine {own or 'NAME'} or without --engine")
    if space.engine is None and default_engine(cluster.accelerator.vendor):
        from dataclasses import replace as _replace

        space = _replace(space, engine=default_engine(cluster.accelerator.vendor))
        options = options or PerfOptions()  # and its dispatcher: the caller named no engine to price
        options = _replace(options, comm=_replace(options.comm, ep_dispatcher=get_engine(space.engine).ep_dispatcher))
    return space, options


def _uncertainty(spec: ModelSpec, cluster: Cluster, options: PerfOptions, precision: str, space: SearchSpace,
                 best: dict, result: SearchResult) -> dict:
    """``error_band`` (the backtest's cross-source error for the best plan's family and precision,
    :mod:`dayzero.planner.search.error_band`) and ``sensitivity`` (the best plan under perturbed inputs,
    :mod:`dayzero.planner.search.sensitivity`)."""
    from dayzero.planner.search.error_band import error_band, load_table
    from dayzero.planner.search.sensitivity import sensitivity
    from dayzero.specs.counting import params_total

    kind = "moe" if spec.is_moe else "dense"
    band = error_band(load_table(), kind, precision, best["throughput"]["mfu"], cluster.accelerator.id,
                      cluster.devices, params_total(spec), engine=space.engine if space else None,
                      vendor=cluster.accelerator.vendor)
    return {"error_band": band.to_dict(), "sensitivity": sensitivity(spec, cluster, options, result.candidates)}


FIT_DOUBLINGS = 10  # a cluster too small is searched up to 2**10 times its nodes (then: none found)


def smallest_fitting(spec: ModelSpec, cluster: Cluster, gbs: int, seq: int, precision: str, options: PerfOptions,
                     max_memory: float, space: SearchSpace | None = None,
                     memory_options=None) -> tuple[int | None, tuple[int, ...]]:
    """The smallest device count, of the cluster's shape doubled node by node (its card, fabrics
    and host: :func:`dayzero.specs.cluster.with_nodes`), at which some layout of the scenario fits
    by the search's own memory check; and the counts searched. None when none up to
    :data:`FIT_DOUBLINGS` doublings (or the largest cluster) fits."""
    from dayzero.errors import ConfigError, LayoutError
    from dayzero.specs.cluster import with_nodes

    searched: list[int] = []
    nodes = cluster.nodes
    for _ in range(FIT_DOUBLINGS):
        nodes *= 2
        try:
            bigger = with_nodes(cluster, nodes)
        except ConfigError:  # past the largest cluster, or no scale-out rate to add nodes with
            break
        searched.append(bigger.devices)
        try:
            search(spec, bigger, gbs, seq, precision, options, 1, max_memory, space, memory_options=memory_options)
        except (FitError, LayoutError):  # nothing fits, or no layout of gbs passes the rules there
            continue
        return bigger.devices, tuple(searched)
    return None, tuple(searched)


def fit_text(found: int | None, searched: tuple[int, ...], cluster: Cluster) -> str:
    """:func:`smallest_fitting`'s answer in words, saying what was searched."""
    how = (f"searched {', '.join(f'{d:,}' for d in searched)} devices, doubling the "
           f"{cluster.devices_per_node}-device nodes" if searched else "no larger cluster of this shape to search")
    if found is None:
        return f"no larger cluster fits either ({how})"
    return f"the smallest device count that fits is {found:,} ({how})"
