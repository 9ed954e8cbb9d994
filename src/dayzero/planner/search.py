"""Search the whole parallel space: enumerate, reject the indivisible, prune by memory, rank by
predicted step time.

The space is the cartesian product of per-dim options (tp, pp, cp, ep, etp, vpp, mbs, zero,
recompute, sequence parallelism; dp = devices / (tp pp cp)). Enumeration is staged with numpy
so a rejected prefix is counted (times the size of the dims not yet expanded) without being
materialised; survivors are checked against device memory in one vectorised call
(:func:`dayzero.planner.memory.peak_memory_batch`), and only layouts that fit are timed, in one
vectorised call of the step-time model (:func:`dayzero.planner.perf.evaluate`). Every layout
considered ends in exactly one bucket: a plan, or rejected as ``indivisible``, ``does not fit``
or ``worse``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dayzero.errors import FitError, LayoutError
from dayzero.planner.perf import PerfOptions, evaluate
from dayzero.planner.topology import scaleup_domain
from dayzero.specs.cluster import Cluster
from dayzero.specs.model import ModelSpec

PREC = {"bf16": 0, "fp8": 1, "fp4": 2}
CHUNK = 100_000  # bases per vectorised batch (bounds memory)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class SearchSpace:
    """Options per dim; None means the default list derived from the model and cluster."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    ep: tuple[int, ...] | None = None
    etp: tuple[int, ...] | None = None
    vpp: tuple[int, ...] | None = None
    mbs: tuple[int, ...] = (1, 2, 4, 8)
    zero: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[int, ...] = (0, 1, 2)  # none, selective, full
    sp: tuple[int, ...] = (1,)  # sequence parallelism with tp > 1 (it only removes work and memory)

    def resolve(self, spec: ModelSpec, devices: int, seq: int, domain: int) -> dict[str, tuple[int, ...]]:
        """Default lists: tp divides the heads and stays inside one scale-up domain (a per-layer
        all-reduce over the scale-out network is never competitive); pp up to layers + 2 (embedding
        and loss may take a stage each); cp up to 32; ep any divisor of the experts; etp up to 8;
        vpp up to 8 or any count splitting the layers evenly."""
        a, L = spec.attention, spec.layers
        tp = self.tp or tuple(d for d in _divisors(a.heads) if d <= min(64, domain) and devices % d == 0)
        pp = self.pp or tuple(d for d in _divisors(devices) if d <= min(L + 2, 128))
        cp = self.cp or tuple(d for d in (1, 2, 4, 8, 16, 32) if devices % d == 0 and (d == 1 or seq % (2 * d) == 0))
        if spec.moe is not None and spec.is_moe:
            ep = self.ep or tuple(d for d in _divisors(spec.moe.experts) if d <= devices)
            etp = self.etp or tuple(d for d in tp if d <= 8)
        else:
            ep, etp = self.ep or (1,), self.etp or (1,)
        vpp = self.vpp or tuple(sorted(set(range(1, 9)) | {v for p in pp for v in range(9, 33)
                                                          if L % (p * v) == 0 or (L + 2) % (p * v) == 0}))
        if self.sp not in ((0,), (1,), (0, 1)):
            raise LayoutError(f"sequence-parallel options must be (0,), (1,) or (0, 1), got {self.sp}")
        return dict(tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, vpp=vpp, mbs=self.mbs, zero=self.zero,
                    recompute=self.recompute, sp=self.sp)


@dataclass
class SearchResult:
    candidates: dict  # grid of the top plans, best first
    evaluation: object  # perf Evaluation of the top plans
    peak_bytes: np.ndarray
    considered: int
    rejected: dict = field(default_factory=dict)
    timed: int = 0  # layouts whose step time was evaluated


def _mesh(**opts) -> dict[str, np.ndarray]:
    names = list(opts)
    grids = np.meshgrid(*[np.asarray(opts[n], dtype=np.int64) for n in names], indexing="ij")
    return {n: g.ravel() for n, g in zip(names, grids)}


def _take(g: dict, mask: np.ndarray) -> dict:
    return {k: v[mask] for k, v in g.items()}


def _cross(g: dict, name: str, values) -> dict:
    """Every row of ``g`` combined with every value of ``values`` for ``name``."""
    vals = np.asarray(values, dtype=np.int64)
    n = len(next(iter(g.values()))) if g else 1
    out = {k: np.repeat(v, len(vals)) for k, v in g.items()}
    out[name] = np.tile(vals, n)
    return out


def enumerate_layouts(spec: ModelSpec, devices: int, gbs: int, seq: int, space: SearchSpace,
                      domain: int = 8) -> tuple[dict, int, int, int]:
    """All divisor-consistent *bases* (every dim but zero and recompute).

    Returns (bases, considered, indivisible, variants): ``considered`` and ``indivisible`` count
    full layouts (a base times its ``variants`` = |zero| x |recompute| options)."""
    o = space.resolve(spec, devices, seq, domain)
    a, L = spec.attention, spec.layers
    later = lambda *names: int(np.prod([len(o[n]) for n in names]))  # noqa: E731
    variants = later("zero", "recompute")
    considered = indivisible = 0

    # sequence parallelism exists only with tp > 1: a tp = 1 layout is one layout, sp off
    g = _mesh(tp=o["tp"], sp=o["sp"])
    g = _take(g, (g["tp"] > 1) | (g["sp"] == np.min(o["sp"])))
    g["sp"] = np.where(g["tp"] > 1, g["sp"], 0)
    g = _cross(_cross(g, "pp", o["pp"]), "cp", o["cp"])
    rest = ("ep", "etp", "vpp", "mbs", "zero", "recompute")
    considered += len(g["tp"]) * later(*rest)
    world = g["tp"] * g["pp"] * g["cp"]
    ok = (devices % world == 0) & (a.heads % g["tp"] == 0) & (L >= g["pp"] - 2)
    ok &= (g["sp"] == 0) | (seq % (g["tp"] * g["cp"]) == 0)  # sequence parallelism splits seq by tp x cp
    if a.kind == "gqa":
        ok &= (a.kv_heads % g["tp"] == 0) | (g["tp"] % a.kv_heads == 0)
    indivisible += int((~ok).sum()) * later(*rest)
    g = _take(g, ok)
    g["dp"] = devices // (g["tp"] * g["pp"] * g["cp"])

    g = _cross(g, "ep", o["ep"])
    ok = (g["ep"] == 1) | ((spec.moe.experts % g["ep"] == 0) if spec.moe is not None else False)
    indivisible += int((~ok).sum()) * later(*rest[1:])
    g = _take(g, ok)

    g = _cross(g, "etp", o["etp"])
    ok = (g["tp"] % g["etp"] == 0) & ((g["tp"] * g["cp"] * g["dp"]) % (g["ep"] * g["etp"]) == 0)
    indivisible += int((~ok).sum()) * later(*rest[2:])
    g = _take(g, ok)

    # virtual stages: up to 8, or any count that splits the layers (with embedding and loss
    # counted as layers, as Megatron's account_for_embedding/loss_in_pipeline_split does) evenly
    g = _cross(g, "vpp", o["vpp"])
    stages = g["pp"] * g["vpp"]
    allowed = (g["vpp"] <= 8) | (L % stages == 0) | ((L + 2) % stages == 0)
    ok = ((g["pp"] > 1) | (g["vpp"] == 1)) & (L >= stages - 2) & allowed
    indivisible += int((~ok).sum()) * later(*rest[3:])
    g = _take(g, ok)

    g = _cross(g, "mbs", o["mbs"])
    per = g["mbs"] * g["dp"]
    m = np.where(gbs % per == 0, gbs // np.maximum(per, 1), 0)
    ok = (m >= 1) & ((g["vpp"] == 1) | (m % g["pp"] == 0))
    indivisible += int((~ok).sum()) * later(*rest[4:])
    g = _take(g, ok)
    n = len(g["tp"])
    g["gbs"] = np.full(n, gbs, dtype=np.int64)
    g["seq"] = np.full(n, seq, dtype=np.int64)
    return g, considered, indivisible, variants


def _with(g: dict, **cols) -> dict:
    n = len(g["tp"])
    return {**g, **{k: np.full(n, v, dtype=np.int64) if np.ndim(v) == 0 else v for k, v in cols.items()}}


def _fitting_variants(spec, bases: dict, zeros, recomputes, memory, limit) -> tuple[list, int]:
    """For each base and ZeRO stage, the least recompute that fits. Memory falls as recompute
    grows (but not always as ZeRO grows: ZeRO-3's gathered layers and ZeRO-2's buckets can cost
    more than they save), so each ZeRO stage is walked down from full recompute and stops at the
    first level that does not fit; the levels above it fit but only add time. Returns
    ([(base indices, zero, recompute per base, peak per base)], number of fitting (base, zero,
    recompute) layouts)."""
    n = len(bases["tp"])
    recomputes = np.asarray(sorted(recomputes))
    out, n_fit = [], 0
    for z in sorted(zeros):
        level = np.full(n, -1, dtype=np.int64)  # least fitting recompute index so far
        peak_at = np.zeros(n)
        alive = np.arange(n)
        for ri in range(len(recomputes) - 1, -1, -1):
            if not len(alive):
                break
            peak = memory(_with({k: v[alive] for k, v in bases.items()}, zero=z, recompute=recomputes[ri]))
            ok = peak <= limit
            level[alive[ok]] = ri
            peak_at[alive[ok]] = peak[ok]
            alive = alive[ok]
        idx = np.nonzero(level >= 0)[0]
        n_fit += int((len(recomputes) - level[idx]).sum())
        out.append((idx, z, recomputes[level[idx]], peak_at[idx]))
    return out, n_fit


def search(spec: ModelSpec, cluster: Cluster, gbs: int, seq: int, precision: str = "bf16",
           options: PerfOptions | None = None, top_k: int = 5, max_memory: float = 0.85,
           space: SearchSpace | None = None, memory_fn=None, memory_options=None) -> SearchResult:
    """Best ``top_k`` layouts by predicted step time among those whose peak memory is at most
    ``max_memory`` x device capacity. Raises FitError when none fits.

    Pruning is exact under the models: for each ZeRO stage only the least recompute that fits is
    timed (more recompute only adds time), and ZeRO-2 only where ZeRO-1 needs more recompute to
    fit (ZeRO-2 adds a reduce-scatter per micro-batch and nothing else)."""
    if memory_fn is None:
        from dayzero.planner.memory import MemoryOptions
        from dayzero.planner.memory import peak_memory_batch as memory_fn  # noqa: N813

        memory_options = memory_options or MemoryOptions.for_accelerator(cluster.accelerator)
    options = options or PerfOptions()
    space = space or SearchSpace()
    devices = cluster.devices
    bases, considered, indivisible, variants = enumerate_layouts(spec, devices, gbs, seq, space, scaleup_domain(cluster))
    n = len(bases["tp"])
    prec = PREC[options.gemm_precision or precision]
    bases["fp8"] = np.full(n, int(prec > 0), dtype=np.int64)
    capacity = cluster.memory_bytes
    limit = max_memory * capacity

    def memory(grid: dict) -> np.ndarray:
        if memory_options is None:
            return np.asarray(memory_fn(spec, grid, capacity), dtype=float)
        return np.asarray(memory_fn(spec, grid, capacity, memory_options), dtype=float)

    zeros, recomputes = space.zero, space.recompute
    best_rows, best_step, best_peak = [], [], []
    n_fit = n_timed = 0
    for start in range(0, n, CHUNK):
        chunk = {k: v[start:start + CHUNK] for k, v in bases.items()}
        found, fit_here = _fitting_variants(spec, chunk, zeros, recomputes, memory, limit)
        n_fit += fit_here
        by_zero = {z: (idx, r, pk) for idx, z, r, pk in found}
        parts = []
        for idx, z, r, pk in found:
            if z == 2 and 1 in by_zero:  # ZeRO-2 only where ZeRO-1 needs more recompute (or does not fit)
                i1, r1, _ = by_zero[1]
                r1_of = np.full(len(chunk["tp"]), 99)
                r1_of[i1] = r1
                keep = r < r1_of[idx]
                idx, r, pk = idx[keep], r[keep], pk[keep]
            parts.append((idx, np.full(len(idx), z), r, pk))
        idx = np.concatenate([p[0] for p in parts])
        if not len(idx):
            continue
        cand = {k: v[idx] for k, v in chunk.items()}
        cand["zero"] = np.concatenate([p[1] for p in parts]).astype(np.int64)
        cand["recompute"] = np.concatenate([p[2] for p in parts]).astype(np.int64)
        peaks = np.concatenate([p[3] for p in parts])
        cand["prec"] = np.full(len(idx), prec, dtype=np.int64)
        n_timed += len(idx)
        ev = evaluate(spec, cand, cluster, options)
        order = np.argsort(ev.step_s, kind="stable")[:top_k]
        best_rows.append({k: v[order] for k, v in cand.items()})
        best_step.append(ev.step_s[order])
        best_peak.append(peaks[order])
    if n_fit == 0:
        raise FitError(f"no layout of {spec.name} fits in {max_memory:.0%} of {capacity / 2**30:.1f} GiB per device on "
                       f"{devices} devices (gbs {gbs}, seq {seq}; {considered:,} layouts considered); add devices, "
                       f"lower --seq, or raise --max-memory")
    allrows = {k: np.concatenate([b[k] for b in best_rows]) for k in best_rows[0]}
    steps, peaks = np.concatenate(best_step), np.concatenate(best_peak)
    order = np.argsort(steps, kind="stable")[:top_k]
    top = {k: v[order] for k, v in allrows.items()}
    ev = evaluate(spec, top, cluster, options)
    rejected = {"indivisible": indivisible, "does not fit": n * variants - n_fit, "worse": n_fit - len(order)}
    return SearchResult(candidates=top, evaluation=ev, peak_bytes=peaks[order], considered=considered,
                        rejected=rejected, timed=n_timed)


def candidate_layouts(result: SearchResult) -> list[dict]:
    """The top plans' layouts as ParallelConfig keyword dicts, best first."""
    g = result.candidates
    rec = ("none", "selective", "full")
    out = []
    for i in range(len(g["tp"])):
        vpp = int(g["vpp"][i])
        out.append(dict(tp=int(g["tp"][i]), pp=int(g["pp"][i]), dp=int(g["dp"][i]), cp=int(g["cp"][i]),
                        ep=int(g["ep"][i]), etp=int(g["etp"][i]), vpp=vpp, mbs=int(g["mbs"][i]),
                        gbs=int(g["gbs"][i]), seq=int(g["seq"][i]), zero=int(g["zero"][i]),
                        recompute=rec[int(g["recompute"][i])], sequence_parallel=bool(g["sp"][i]),
                        precision="bf16" if int(g["prec"][i]) == 0 else "fp8",
                        schedule="interleaved" if vpp > 1 else "1f1b"))
    return out



def plan(spec: ModelSpec, cluster: Cluster, gbs: int, seq: int, precision: str = "bf16",
         options: PerfOptions | None = None, top_k: int = 5, max_memory: float = 0.85,
         space: SearchSpace | None = None, memory_options=None) -> dict:
    """The DESIGN.md plan object: the best layouts as full predictions, best first, with how
    many layouts were considered and why the others were rejected."""
    import time

    from dayzero.planner.predict import predict
    from dayzero.specs.parallel import ParallelConfig

    options = options or PerfOptions()
    t0 = time.perf_counter()
    result = search(spec, cluster, gbs, seq, precision, options, top_k, max_memory, space,
                    memory_options=memory_options)
    t_search = time.perf_counter() - t0
    gemm = options.gemm_precision or precision
    plans = []
    for kw in candidate_layouts(result):
        kw["precision"] = "bf16" if gemm == "bf16" else "fp8"
        plans.append(predict(spec, ParallelConfig(**kw), cluster, options, memory_options))
    return {"model": spec.name, "cluster": cluster.name, "devices": cluster.devices, "gbs": gbs, "seq": seq,
            "precision": gemm, "max_memory": max_memory, "plans": plans, "considered": result.considered,
            "rejected": result.rejected, "timed": result.timed,
            "seconds": {"search": t_search, "total": time.perf_counter() - t0}}
