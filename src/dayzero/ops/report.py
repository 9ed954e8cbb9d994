"""The mapping report: every traced operator against a backend manifest.

``analyze(MODEL, manifest)`` traces one training step (see :mod:`dayzero.ops.trace`), then for
each operator overload: how often it runs per step (scaled to full depth), its FLOPs and bytes,
whether the manifest supports it (in the dtypes it runs in), and, when not, its decomposition
into supported operators, checked numerically (:mod:`dayzero.ops.decompose`). Operators with no
complete, verified decomposition "need a kernel", with their share of the step's FLOPs and bytes.
Fusion opportunities come from :mod:`dayzero.ops.fusion`. ``OpsReport.to_dict()`` is the
``dayzero ops --json`` contract: ``{"coverage", "ops": [{"op", "count", "flops", "bytes",
"supported", "decomposition"}], "unsupported", "fusions"}`` plus context fields.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from dayzero.ops.decompose import Decomposition, decompose
from dayzero.ops.fusion import Fusion, find_fusions
from dayzero.ops.manifest import DEFAULT_MANIFEST, BackendManifest, load_manifest
from dayzero.ops.trace import Trace, trace_model

MODULES_SHOWN = 8  # module paths listed per operator in the JSON


@dataclass
class OpRow:
    """One operator overload over the whole step."""

    op: str
    count: int  # calls per step, full depth
    flops: int
    bytes: int
    supported: bool  # every call is supported (op listed, dtypes allowed)
    dtypes: tuple[str, ...]
    categories: dict[str, int]
    phases: dict[str, int]
    kinds: dict[str, int]  # calls per step by layer kind ("model": outside decoder layers)
    modules: dict[str, int]  # calls per step by module path (the most frequent few)
    shapes: tuple[tuple[int, ...], ...]  # inputs of its largest call
    kernel: bool
    unsupported_count: int = 0
    reason: str = ""
    decomposition: Decomposition | None = None

    @property
    def needs_kernel(self) -> bool:
        d = self.decomposition
        return not self.supported and (d is None or not d.complete or d.verified is False)

    def to_dict(self, total_flops: int, total_bytes: int) -> dict:
        return {"op": self.op, "count": self.count, "flops": self.flops, "bytes": self.bytes,
                "supported": self.supported,
                "decomposition": self.decomposition.to_dict() if self.decomposition else None,
                "dtypes": list(self.dtypes), "categories": self.categories, "phases": self.phases,
                "layer_kinds": self.kinds, "modules": self.modules,
                "shapes": [list(s) for s in self.shapes], "kernel": self.kernel,
                "flops_share": self.flops / total_flops if total_flops else 0.0,
                "bytes_share": self.bytes / total_bytes if total_bytes else 0.0}


@dataclass
class OpsReport:
    trace: Trace
    manifest: BackendManifest
    rows: list[OpRow]
    fusions: list[Fusion]
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def total_count(self) -> int:
        return sum(r.count for r in self.rows)

    @property
    def total_flops(self) -> int:
        return sum(r.flops for r in self.rows)

    @property
    def total_bytes(self) -> int:
        return sum(r.bytes for r in self.rows)

    @property
    def coverage(self) -> float:
        """Share of calls the backend supports natively."""
        n = self.total_count
        return sum(r.count - r.unsupported_count for r in self.rows) / n if n else 1.0

    @property
    def coverage_flops(self) -> float:
        f = self.total_flops
        return sum(r.flops for r in self.rows if r.supported) / f if f else 1.0

    @property
    def unsupported(self) -> list[OpRow]:
        return [r for r in self.rows if not r.supported]

    def flops_check(self) -> dict | None:
        """Traced FLOPs per token against ``dayzero inspect``'s count (full s x s attention, as
        eager attention computes it; sliding windows are counted as their window by inspect)."""
        spec = self.trace.spec
        if spec is None:
            return None
        from dayzero.specs.counting import flops_per_token

        seq = self.trace.seq
        ref = flops_per_token(spec, seq, causal=False).train
        got = self.total_flops / self.trace.tokens
        return {"traced_per_token": got, "inspect_per_token": ref, "rel_diff": (got - ref) / ref if ref else 0.0,
                "convention": "full attention (inspect --full-attention)",
                "sliding_window": any(w is not None and w < seq for w in spec.layer_windows)}

    def by_category(self) -> dict[str, dict]:
        out: dict[str, dict] = defaultdict(lambda: {"count": 0, "flops": 0, "bytes": 0})
        for c in self.trace.calls:
            m = self.trace.multiplier(c)
            d = out[c.category]
            d["count"] += m
            d["flops"] += c.flops * m
            d["bytes"] += c.bytes * m
        return dict(sorted(out.items(), key=lambda kv: -kv[1]["flops"]))

    def to_dict(self) -> dict:
        tf, tb = self.total_flops, self.total_bytes
        t = self.trace
        unsupported = []
        for r in self.unsupported:
            d = r.to_dict(tf, tb)
            d.update(unsupported_count=r.unsupported_count, reason=r.reason, needs_kernel=r.needs_kernel)
            unsupported.append(d)
        return {
            "model": t.model, "model_type": t.model_type, "manifest": self.manifest.name,
            "seq": t.seq, "batch": t.batch, "tokens": t.tokens, "dtype": t.dtype, "experts": t.experts,
            "layers": t.num_layers,
            "layer_kinds": [{"name": k.name, "layers": k.ranges(), "count": len(k.layers)} for k in t.kinds],
            "coverage": self.coverage, "coverage_flops": self.coverage_flops,
            "calls": self.total_count, "flops": tf, "bytes": tb, "flops_per_token": tf / t.tokens,
            "flops_check": self.flops_check(),
            "ops": [r.to_dict(tf, tb) for r in self.rows],
            "unsupported": unsupported,
            "needs_kernel": [{"op": r.op, "flops_share": r.flops / tf if tf else 0.0,
                              "bytes_share": r.bytes / tb if tb else 0.0} for r in self.unsupported if r.needs_kernel],
            "fusions": [f.to_dict() for f in self.fusions],
            "by_category": self.by_category(),
            "notes": t.notes + self.notes, "seconds": self.seconds,
        }


def map_trace(trace: Trace, manifest: BackendManifest | str = DEFAULT_MANIFEST, check: bool = True) -> OpsReport:
    """Map a trace onto ``manifest``: support, decompositions (numerically checked), fusions."""
    start = time.perf_counter()
    manifest = load_manifest(manifest)
    agg: dict[str, dict] = {}
    for c in trace.calls:
        m = trace.multiplier(c)
        a = agg.setdefault(c.op, {"count": 0, "flops": 0, "bytes": 0, "dtypes": set(), "cats": Counter(),
                                  "phases": Counter(), "kinds": Counter(), "modules": Counter(), "bad": 0,
                                  "bad_dtypes": Counter(),
                                  "shapes": (), "size": -1, "kernel": c.kernel})
        a["count"] += m
        a["flops"] += c.flops * m
        a["bytes"] += c.bytes * m
        a["dtypes"].update(c.dtypes)
        a["cats"][c.category] += m
        a["phases"][c.phase] += m
        a["kinds"]["model" if c.layer is None else trace.kinds[c.layer].name] += m
        a["modules"][trace.module_path(c)] += m
        size = sum(_prod(s) for s in c.shapes)
        if size > a["size"]:
            a["size"], a["shapes"] = size, c.shapes
        if not manifest.supports(c.op, c.dtypes):
            a["bad"] += m
            a["bad_dtypes"][c.dtypes] += m
    rows = []
    for op, a in agg.items():
        row = OpRow(op=op, count=a["count"], flops=a["flops"], bytes=a["bytes"], supported=a["bad"] == 0,
                    dtypes=tuple(sorted(a["dtypes"])), categories=dict(a["cats"].most_common()),
                    phases=dict(a["phases"]), kinds=dict(a["kinds"]),
                    modules=dict(a["modules"].most_common(MODULES_SHOWN)), shapes=a["shapes"], kernel=a["kernel"],
                    unsupported_count=a["bad"])
        if a["bad"]:
            dts = a["bad_dtypes"].most_common(1)[0][0]
            row.reason = manifest.why_not(op, dts)
            row.decomposition = decompose(op, trace.examples[(op, dts)], manifest.supports, check=check)
        rows.append(row)
    rows.sort(key=lambda r: (-r.flops, -r.bytes, -r.count, r.op))
    fusions = find_fusions(trace, manifest)
    return OpsReport(trace=trace, manifest=manifest, rows=rows, fusions=fusions,
                     seconds=time.perf_counter() - start)


def analyze(model: str, manifest: BackendManifest | str = DEFAULT_MANIFEST, seq: int | None = None, batch: int = 1,
            dtype: str = "bfloat16", experts: str = "grouped_mm", trust_remote_code: bool = False,
            check: bool = True) -> OpsReport:
    """Trace MODEL's real modeling code and map it onto ``manifest`` (the ``dayzero ops`` verb)."""
    start = time.perf_counter()
    manifest = load_manifest(manifest)  # fail fast on a bad manifest, before tracing
    trace = trace_model(model, seq=seq, batch=batch, dtype=dtype, experts=experts,
                        trust_remote_code=trust_remote_code)
    report = map_trace(trace, manifest, check=check)
    report.seconds = time.perf_counter() - start
    return report


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
