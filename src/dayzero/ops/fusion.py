"""Fusion opportunities in the traced forward graph, and what fusing each would save.

Between two GEMMs (or other non-elementwise operators) of one decoder layer, the elementwise
operators, reductions over a row and views that run back to back can become one kernel: every
intermediate tensor then stays in registers/SRAM instead of going to memory and back. We take
maximal runs of such operators in execution order (a run never spans a GEMM, so fusing it cannot
create a cycle), split each run into connected pieces along the dataflow, and name each piece by
what it computes:

    attention           softmax with its scale/mask/casts, merged with the GEMM before it
                        (Q K^T) and the GEMM after it (P V): what FlashAttention computes
    rms_norm            square, mean, rsqrt, scale (with a residual add before it, if any)
    layer_norm          a LayerNorm with the ops around it (e.g. a residual add)
    swiglu              SiLU(gate) * up (or a clamped sigmoid gate, gpt-oss)
    rotary_embedding    rotate-half (neg + cat, or strided halves) and the cos/sin multiply-adds
    elementwise_chain   anything else with two or more kernels
    a+b                 a piece holding several patterns (e.g. MLA: rms_norm+rotary_embedding);
                        "provided" only when the manifest has all of them

Saved per occurrence: kernel launches (kernels - 1) and memory traffic (bytes every kernel
reads and writes, minus what the fused kernel must read from outside and write for later use).
Later use counts the backward, except for attention, whose fused kernels recompute the
probabilities in the backward (FlashAttention). Only the forward is analysed; fused kernels
usually come with a fused backward that saves about as much again.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from dayzero.ops.manifest import BackendManifest
from dayzero.ops.trace import OpCall, Trace

_GEMMS = {"aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default",
          "aten._grouped_mm.default", "aten._scaled_mm.default"}
_SOFTMAX = {"aten._softmax.default", "aten._safe_softmax.default"}
# row reductions and data movement a fused elementwise kernel can absorb
_FUSABLE_EXTRA = {"aten.sum.dim_IntList", "aten.sum.default", "aten.mean.dim", "aten.amax.default",
                  "aten.amin.default", "aten._softmax.default", "aten._safe_softmax.default",
                  "aten._log_softmax.default", "aten.var_mean.correction", "aten.native_layer_norm.default",
                  "aten._to_copy.default", "aten.clone.default", "aten.copy_.default", "aten.cat.default",
                  "aten.where.self", "aten.masked_fill.Scalar", "aten.masked_fill.Tensor", "aten.fill_.Scalar",
                  "aten.zeros_like.default", "aten.ones_like.default", "aten.full_like.default",
                  "aten.constant_pad_nd.default", "aten.native_dropout.default", "aten.bernoulli_.float"}


@dataclass(frozen=True)
class Fusion:
    """One fusion opportunity, aggregated over its occurrences in a training step's forward."""

    pattern: str
    where: str  # layer kind, or "model" outside decoder layers
    category: str
    ops: tuple[str, ...]  # kernels it fuses, in order
    occurrences: int  # per step, scaled to the full depth
    kernels: int  # per occurrence
    bytes_unfused: int  # per step
    bytes_fused: int  # per step
    provided_by: str | None  # the manifest's fused kernel that covers it, if any

    @property
    def launches_saved(self) -> int:
        return (self.kernels - 1) * self.occurrences

    @property
    def bytes_saved(self) -> int:
        return max(0, self.bytes_unfused - self.bytes_fused)

    def to_dict(self) -> dict:
        return {"pattern": self.pattern, "kernel": self.pattern, "where": self.where, "category": self.category,
                "ops": list(self.ops), "occurrences": self.occurrences, "kernels": self.kernels,
                "launches_saved": self.launches_saved, "bytes_unfused": self.bytes_unfused,
                "bytes_fused": self.bytes_fused, "bytes_saved": self.bytes_saved,
                "provided": self.provided_by is not None, "provided_by": self.provided_by}


def _fusable(call: OpCall) -> bool:
    if not call.kernel:
        return True
    if call.op in _FUSABLE_EXTRA:
        return True
    ns, name, overload = call.op.split(".")
    op = getattr(getattr(getattr(torch.ops, ns), name), overload)
    return torch.Tag.pointwise in op.tags


def find_fusions(trace: Trace, manifest: BackendManifest | None = None) -> list[Fusion]:
    calls = trace.calls
    consumers: dict[int, list[int]] = defaultdict(list)
    for i, c in enumerate(calls):
        for p in c.producers:
            consumers[p].append(i)
    fusable_cache: dict[str, bool] = {}

    def fusable(c: OpCall) -> bool:
        key = c.op if c.kernel else "<view>"
        if key not in fusable_cache:
            fusable_cache[key] = _fusable(c)
        return fusable_cache[key]

    groups: dict[tuple, list] = {}
    for members in _pieces(calls, fusable, consumers):
        chain = sorted(members)
        pattern = _classify(calls, chain)
        if pattern == "attention":
            chain = _with_gemms(calls, chain, consumers)
            if chain is None:
                pattern = "elementwise_chain"
                chain = sorted(members)
        kernels = [i for i in chain if calls[i].kernel]
        if len(kernels) < 2:
            continue
        unfused = sum(calls[i].bytes for i in kernels)
        fused = _boundary_bytes(trace, chain, consumers, keep_for_backward=(pattern != "attention"))
        first = calls[chain[0]]
        where = "model" if first.layer is None else trace.kinds[first.layer].name
        cats = defaultdict(int)
        for i in kernels:
            cats[calls[i].category] += 1
        key = (pattern, where, tuple(calls[i].op for i in kernels))
        g = groups.setdefault(key, [0, 0, 0, max(cats, key=cats.get), len(kernels)])
        mult = trace.multiplier(first)
        g[0] += mult
        g[1] += unfused * mult
        g[2] += fused * mult
    out = []
    for (pattern, where, ops), (occ, unfused, fused, category, kernels) in groups.items():
        out.append(Fusion(pattern=pattern, where=where, category=category, ops=ops, occurrences=occ, kernels=kernels,
                          bytes_unfused=unfused, bytes_fused=fused, provided_by=_provided(pattern, manifest)))
    return sorted(out, key=lambda f: (-f.bytes_saved, -f.launches_saved, f.pattern))


def _provided(pattern: str, manifest: BackendManifest | None) -> str | None:
    """The manifest's fused kernel(s) covering ``pattern`` (all of its parts), else None."""
    if manifest is None:
        return None
    parts = pattern.split("+")
    if all(p in manifest.fused for p in parts):
        return pattern
    if "attention" not in parts and "elementwise_chain" in manifest.fused:
        return "elementwise_chain"
    return None


def _pieces(calls: list[OpCall], fusable, consumers: dict[int, list[int]]) -> list[set[int]]:
    """Groups of fusable forward calls of one layer that can run as one kernel: merged along
    producer -> consumer edges unless the merge would put a non-member on a path from the group
    back into it (the fused kernel would then wait on its own output)."""
    group: dict[int, int] = {}
    members: dict[int, set[int]] = {}

    def find(i: int) -> int:
        while group[i] != i:
            group[i] = group[group[i]]
            i = group[i]
        return i

    for i, c in enumerate(calls):
        if c.phase == "forward" and fusable(c):
            group[i], members[i] = i, {i}
    for i in sorted(group):
        for p in calls[i].producers:
            if p not in group or calls[p].layer != calls[i].layer:
                continue
            a, b = find(p), find(i)
            if a == b:
                continue
            merged = members[a] | members[b]
            if _closed(calls, merged, consumers):
                group[b] = a
                members[a] = merged
                del members[b]
    return [m for m in members.values() if len(m) > 1]


def _closed(calls: list[OpCall], nodes: set[int], consumers: dict[int, list[int]]) -> bool:
    """True when no call outside ``nodes`` is both reachable from and reaching ``nodes``."""
    lo, hi = min(nodes), max(nodes)
    down, stack = set(), [j for i in nodes for j in consumers[i] if j not in nodes and j <= hi]
    while stack:
        j = stack.pop()
        if j in down:
            continue
        down.add(j)
        stack.extend(k for k in consumers[j] if k <= hi and k not in down)
    if not down:
        return True
    up, stack = set(), [p for i in nodes for p in calls[i].producers if p not in nodes and p >= lo]
    while stack:
        j = stack.pop()
        if j in up:
            continue
        if j in down:
            return False
        up.add(j)
        stack.extend(p for p in calls[j].producers if p >= lo and p not in up)
    return True


def _classify(calls: list[OpCall], chain: list[int]) -> str:
    """Named patterns the piece contains, joined by '+' (e.g. MLA's latent RMSNorm next to its
    rotary part), or ``elementwise_chain``."""
    ops = {calls[i].op.split(".")[1] for i in chain if calls[i].kernel}
    cats = {calls[i].category for i in chain if calls[i].kernel}
    if {"_softmax", "_safe_softmax"} & ops:
        return "attention"
    found = []
    if "native_layer_norm" in ops or "var_mean" in ops:
        found.append("layer_norm")
    if "rsqrt" in ops and ({"mean", "pow"} & ops):
        found.append("rms_norm")
    if ("silu" in ops and "mul" in ops) or ({"sigmoid", "clamp", "mul"} <= ops and "mlp" in cats):
        found.append("swiglu")
    if "attention" in cats and "cat" in ops and "mul" in ops and ({"neg", "sub"} & ops):
        found.append("rotary_embedding")
    return "+".join(found) or "elementwise_chain"


def _with_gemms(calls: list[OpCall], chain: list[int], consumers: dict[int, list[int]]) -> list[int] | None:
    """Add the scores GEMM feeding the softmax piece and the context GEMM consuming it."""
    members = set(chain)
    before = {p for i in chain for p in calls[i].producers if p not in members and calls[p].op in _GEMMS}
    after = {c for i in chain for c in consumers[i] if c not in members and calls[c].op in _GEMMS
             and calls[c].phase == "forward"}
    if not before or not after:
        return None
    return sorted(members | {max(before), min(after)})


def _boundary_bytes(trace: Trace, chain: list[int], consumers: dict[int, list[int]], keep_for_backward: bool) -> int:
    """Bytes a fused kernel must move: tensors it reads from outside + tensors it writes that are
    used outside (later in the forward, and in the backward when ``keep_for_backward``). A view
    moves no data: reading through it reads its base; a view used outside needs its base written."""
    calls = trace.calls
    members = set(chain)
    memo: dict[int, bool] = {}

    def escapes(i: int) -> bool:
        if i not in memo:
            memo[i] = False
            out = False
            for j in consumers[i]:
                if j in members:
                    out |= not calls[j].kernel and escapes(j)
                elif keep_for_backward or calls[j].phase == "forward":
                    out = True
            memo[i] = out
        return memo[i]

    reads, writes = set(), set()
    for i in chain:
        c = calls[i]
        internal = {t for p in c.producers if p in members for t in calls[p].outputs}
        reads |= {t for t in c.inputs if t not in internal}
        if c.kernel and escapes(i):
            writes |= set(c.outputs)
    return sum(trace.tensor_bytes.get(t, 0) for t in reads | (writes - reads))
