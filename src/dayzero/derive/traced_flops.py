"""FLOPs the shapes cannot give, measured by tracing the model's own code at two sequence lengths.

A derived description maps most layers onto shapes the planner prices exactly (linears, softmax
attention, a recurrent scan whose weights it reads). Where it can only approximate a layer (a token
mixer it does not recognise, modelled as a window of attention; a feed-forward block with no MLP
shape; or weights beyond the shapes worth more than ``EXTRA_SHARE`` of the layer: an indexer, a
gate, a mixer's own projections), the layer's forward is traced on the meta device with dayzero's
ATen recorder (:mod:`dayzero.ops.trace`: exact matmul FLOPs, no data) at ``SEQS`` tokens, and what it
computes beyond the shapes is fitted as ``linear + quadratic x keys`` from the two lengths (one
token's work is a constant plus a term proportional to the keys it meets: exact for attention-like
and chunked-scan code whose chunk divides both lengths). The fit goes into
``ModelSpec.layer_flops_extra``, which FLOPs per token (``inspect``, MFU) and step time add.

What the reference computes and the planner's kernels do not is taken out before the difference:
transformers' eager attention scores every key of a sliding-window, chunked or sparse layer and
masks afterwards, so a recognised softmax layer is compared with full attention, not with its
window (the planner keeps pricing the window; a sparse layer's indexer stays in the difference).
The quadratic term is halved under causal masking, as attention is (``counting.traced_extra_flops``).

The same forwards count the bytes autograd saves for backward in each traced layer
(:mod:`dayzero.derive.traced_act`: ``ModelSpec.layer_act_extra`` / ``layer_act_reference``).

The traces are forward-only (training counts 3x forward, as everywhere in dayzero) and bounded by
``BUDGET_S`` seconds together: modeling code that loops per token on CPU (a reference selective
scan without its CUDA kernel) is abandoned with a note and the shapes' figure kept.
"""

from __future__ import annotations

import time
from dataclasses import replace

from dayzero.derive.describe import ModelDescription
from dayzero.derive.to_spec import ranges
from dayzero.derive.traced_act import act_extra, act_notes, fit_extra, traced_sides
from dayzero.errors import DayzeroError
from dayzero.specs.counting import layer_forward_flops, layer_matmul_params
from dayzero.specs.model import ModelSpec

SEQS = (256, 512)  # multiples of the chunk and block sizes of the chunked mixers seen (64, 128, 256)
BUDGET_S = 8.0  # both traces together; derive_speed.py measures inspect well under its 10 s with it
# norm weights are a few hidden-widths per layer (< 0.1 % of the weights a token multiplies through);
# above 1 % of those, the weights the shapes do not express belong to a module whose compute matters
EXTRA_SHARE = 0.01


def approximated_layers(desc: ModelDescription, spec: ModelSpec) -> list[int]:
    """Layers whose FLOPs the shapes only approximate (see the module docstring)."""
    out = []
    for i, k in enumerate(desc.kind_of()):
        m, f = k.mixer, k.ffn
        unread_mixer = m is not None and m.kind == "recurrent" and m.recurrent is None
        no_mlp = f.kind == "dense" and f.dense is None
        active = layer_matmul_params(spec, spec.layer_types[i])  # the weights a token multiplies through
        if unread_mixer or no_mlp or abs(spec.layer_extra[i]) > EXTRA_SHARE * max(active, 1):
            out.append(i)
    return out


def reference_spec(desc: ModelDescription, spec: ModelSpec) -> ModelSpec:
    """The spec as the reference code computes it: recognised softmax layers over every key (eager
    attention masks a window after scoring all keys); an unrecognised mixer keeps its stand-in."""
    windows = tuple(w if k.mixer is not None and k.mixer.kind == "recurrent" and k.mixer.recurrent is None else None
                    for k, w in zip(desc.kind_of(), spec.layer_windows))
    return replace(spec, layer_windows=windows)


def trace_lengths(max_positions: int) -> tuple[int, int]:
    """SEQS, halved (powers of two) until the longer fits the model's positions."""
    s1, s2 = SEQS
    while s2 > max(max_positions, 4) and s1 > 1:
        s1, s2 = s1 // 2, s2 // 2
    return s1, s2


def with_traced_flops(model: str, desc: ModelDescription, spec: ModelSpec, trust_remote_code: bool = False,
                      budget_s: float = BUDGET_S) -> tuple[ModelSpec, list[str]]:
    """``spec`` with ModelSpec.layer_flops_extra measured for its approximated layers, and the
    sentences that say so (or why the shapes' figure was kept)."""
    layers = approximated_layers(desc, spec)
    if not layers:
        return spec, []
    from dayzero.ops.hf_model import _quiet_transformers, build_meta_model
    from dayzero.ops.trace import TraceTimeout, _run

    deadline = time.monotonic() + budget_s
    where = f"layers {ranges(tuple(layers))}"
    seqs = trace_lengths(spec.max_positions)
    try:
        meta = build_meta_model(model, trust_remote_code=trust_remote_code)
        per_kind, saved = [], []
        for s in seqs:
            with _quiet_transformers():  # its notes on reference kernels concern running, not counting
                tr = _run(meta, s, 1, "bfloat16", deadline=deadline, backward=False, saved=True)
            f = [0.0] * len(meta.kinds)
            for c in tr.calls:
                if c.layer is not None and c.phase == "forward":
                    f[c.layer] += c.flops / tr.tokens
            per_kind.append(f)
            ffn = [desc.kind_of()[kind.layers[0]].ffn.modules for kind in meta.kinds]
            saved.append([traced_sides(tr.saved_bytes, k, ffn[k], tr.tokens) for k in range(len(meta.kinds))])
    except TraceTimeout:
        return spec, [f"{where}: FLOPs from the shapes only: tracing the model's code at {seqs[0]} and {seqs[1]} "
                      f"tokens took over {budget_s:.0f} s (it loops per token on this machine)"]
    except DayzeroError as e:
        return spec, [f"{where}: FLOPs from the shapes only: {e}"]
    traced, traced_act = [None] * spec.layers, [None] * spec.layers
    for k, kind in enumerate(meta.kinds):
        for i in kind.layers:
            traced[i] = (per_kind[0][k], per_kind[1][k])
            traced_act[i] = (saved[0][k], saved[1][k])
    ref = reference_spec(desc, spec)
    extra = list(spec.layer_flops_extra)
    for i in layers:
        if traced[i] is None:
            continue
        modelled = tuple(layer_forward_flops(ref, i, s, causal=False) for s in seqs)
        extra[i] = fit_extra(traced[i], modelled, seqs)
    out = act_extra(desc, replace(spec, layer_flops_extra=tuple(extra)), layers, traced_act, seqs)
    return out, _notes(out, layers, seqs) + act_notes(desc, out, layers, seqs)


def _notes(spec: ModelSpec, layers: list[int], seqs: tuple[int, int]) -> list[str]:
    groups: dict[tuple[float, float], list[int]] = {}
    for i in layers:
        groups.setdefault(spec.layer_flops_extra[i], []).append(i)
    notes = []
    for (lin, quad), idx in groups.items():
        seq = min(spec.max_positions, 4096)
        at = lin + quad * (seq + 1) / 2
        shapes = layer_forward_flops(spec, idx[0], seq, causal=True)
        notes.append(f"layers {ranges(tuple(idx))}: FLOPs measured by tracing the model's own code at {seqs[0]} and "
                     f"{seqs[1]} tokens: {at / 1e6:+,.1f} MFLOPs per token per layer beyond the shapes' "
                     f"{shapes / 1e6:,.1f} at {seq} tokens causal ({lin / 1e6:+,.2f} M {quad:+,.1f} x keys); "
                     "counted in FLOPs and step time as BF16 GEMMs not split by tensor parallelism, not in memory")
    return notes
