"""Compute model: per-layer FLOPs and bytes by op type, and the time one device spends on them.

For one micro-batch on one device, each decoder layer is split into

* **GEMMs** (projections, MLP/experts, router, output head): ``2 m k n`` FLOPs each, run at the
  precision's peak x the fitted large-GEMM efficiency x ``d / (d + half_dim)``, ``d`` the
  GEMM's smallest dimension (small GEMMs and MoE experts with few tokens run less efficiently).
  FP8/FP4 GEMMs use the FP8/FP4 peak; the router and the output head stay in BF16. Backward =
  2 x forward (data and weight gradients).
* **Attention core** (QK^T and PV, causal): FlashAttention at a fitted fraction of the BF16 peak
  (Transformer Engine keeps attention in BF16 under FP8 recipes); backward = 2.5 x forward (it
  recomputes the scores: 5 matmuls against 2). FlashAttention-2 kernels are capped near their
  Hopper ceiling; unfused attention materialises the scores (see :func:`_attention`).
* **Memory-bound kernels** (norms, residual adds, activation functions, rotary, layout copies,
  MoE permutation, FP8/FP4 casts): counted bytes x a fitted ratio / HBM bandwidth; backward =
  2 x forward bytes.
* A fixed **overhead** per layer and micro-batch (kernel launches, synchronisation), and per local
  expert of a MoE layer (the host sync before a MoE layer's token dispatch is part of its EP
  split-size exchange: :mod:`dayzero.planner.perf.comm`).

Recompute adds the forward again (full), or under selective recompute the forward of each module
it checkpoints (:func:`module_replay`; core_attn alone: the attention core). MoE expert
GEMMs are multiplied by the routing imbalance (the busiest device sets the pace). Sequence
parallelism divides the hidden-size elementwise work by tp.

Everything is vectorised over candidate layouts (``grid``: equal-length integer arrays, the
memory planner's keys plus ``prec`` 0 bf16 / 1 fp8 / 2 fp4); results are (classes, N) arrays,
one row per distinct layer class (dense/MoE x attention window).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dayzero.planner.perf.calibration import PerfConstants, Rates
from dayzero.planner.perf.fp8_scaling import BLOCK_DENSE_RATIO, BLOCK_GROUPED_RATIO
from dayzero.planner.perf.kernel_level import unfused_elements
from dayzero.specs.counting import (
    attention_flops_per_token,
    attention_params,
    mlp_params,
    norm_params,
    recurrent_params,
    recurrent_scan_flops_per_token,
    router_params,
    shared_mlp,
    traced_extra_flops,
)
from dayzero.specs.grid import BF16 as BF16_CODE
from dayzero.specs.grid import MODULE_BIT, SELECTIVE, recompute_modules, replays_layer
from dayzero.specs.model import MLPSpec, ModelSpec, mixer_parts, split_layer_type
from dayzero.specs.parallel import PRECISIONS

BF16 = 2  # bytes per activation element


def single_seq(grid: dict) -> int:
    """The one sequence length of a batch of candidates (the models take it as a scalar)."""
    seq = np.asarray(grid["seq"])
    if seq.min() != seq.max():
        raise ValueError("candidates of one evaluation must share one sequence length")
    return int(seq.flat[0])


def layer_classes(spec: ModelSpec) -> list[tuple[str, int | None, tuple[float, float]]]:
    """Distinct (layer type, window, traced extra FLOPs) triples, in first-appearance order (the type is
    ModelSpec.layer_types: ``dense``/``moe`` for transformer layers, ``mixer+ffn`` for a hybrid's; the
    extra is ModelSpec.layer_flops_extra, zeros but for derived layers the shapes only approximate)."""
    seen: list[tuple[str, int | None, tuple[float, float]]] = []
    for key in _class_keys(spec):
        if key not in seen:
            seen.append(key)
    return seen


def _class_keys(spec: ModelSpec):
    extra = list(spec.layer_flops_extra) + [(0.0, 0.0)] * (spec.layers - len(spec.layer_flops_extra))
    return [(k, w, tuple(x)) for k, w, x in zip(spec.layer_types, spec.layer_windows, extra)]


def layer_class_index(spec: ModelSpec) -> np.ndarray:
    classes = layer_classes(spec)
    return np.array([classes.index(key) for key in _class_keys(spec)])


@dataclass(frozen=True)
class ComputeCosts:
    """Seconds per micro-batch on one device; class arrays are (K, N), the rest (N,)."""

    fwd: np.ndarray  # forward of one layer of each class
    bwd: np.ndarray  # backward (+ recompute) of one layer of each class
    gemm_fwd: np.ndarray  # GEMM share of fwd (what TP communication can overlap with)
    # GEMM seconds the recompute replays in backward (full: gemm_fwd; selective: the GEMMs of the
    # modules it replays, mla_up_proj / mlp / moe / shared_experts): the window a replayed
    # module's own TP collectives overlap with under TP comm overlap (planner.perf.comm._tensor_parallel)
    gemm_replay: np.ndarray
    # forward GEMM seconds of the linears that read the layer's (sequence-parallel gathered) input:
    # QKV (MLA: the Q and KV projections), FC1, the shared experts' FC1; their backward dgrad GEMMs
    # (same FLOPs) are what the re-gather of that input for the weight gradient overlaps with
    gemm_in_fwd: np.ndarray
    attn_fwd: np.ndarray  # attention-core share of fwd (what CP communication overlaps with)
    first_extra: np.ndarray  # embedding, forward+backward (first pipeline stage)
    last_extra: np.ndarray  # final norm, output head and loss, forward+backward (last stage)
    dense_params: np.ndarray  # (K, N) parameters per device replicated over dp x cp
    expert_params: np.ndarray  # (K, N) routed-expert parameters per device (replicated over edp)
    first_params: np.ndarray  # embedding parameters per device
    last_params: np.ndarray  # output head + final norm per device


def _gemm(flops, dims, rate, half_dim):
    """Time of GEMMs with ``flops`` at ``rate`` whose smallest dimension is min(dims)."""
    d = np.asarray(dims[0], dtype=float)
    for x in dims[1:]:
        d = np.minimum(d, x)
    d = np.maximum(d, 1.0)
    return flops / (rate * d / (d + half_dim))


@dataclass(frozen=True)
class _Shard:
    """What one device sees of a micro-batch, per candidate: its tokens and degrees, GEMM rates."""

    T: np.ndarray  # tokens of one micro-batch on this device's CP shard, (N,)
    T_el: np.ndarray  # tokens seen by hidden-size elementwise kernels (T / tp under sequence parallelism)
    tp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    rate_lo: np.ndarray  # the layout's GEMM precision (FP8/FP4 where it runs so)
    rate_expert: np.ndarray  # the same for grouped (routed-expert) GEMMs, before moe_gemm_scale
    rate_bf16: np.ndarray
    d0: float  # PerfConstants.gemm_half_dim
    mbs: np.ndarray | float = 1.0  # sequences per micro-batch (layout copies of (seq, batch) tensors)


def _shard(g: dict, rates: Rates, c: PerfConstants) -> tuple[_Shard, np.ndarray]:
    """What one device sees of a micro-batch of each row of grid ``g`` (:class:`_Shard`), and the
    cast elements per input element of a GEMM (1.5 where it runs in FP8/FP4, else 0)."""
    tp, cp, ep, etp = (g[k].astype(float) for k in ("tp", "cp", "ep", "etp"))
    T = g["mbs"] * single_seq(g) / cp  # tokens of one micro-batch on this device's CP shard, (N,)
    sp = (g["sequence_parallel"] > 0) & (g["tp"] > 1)
    T_el = np.where(sp, T / tp, T)  # tokens seen by hidden-size elementwise kernels
    prec = g["precision"]  # GEMM precision code (dayzero.specs.grid: 0 bf16, 1 fp8, 2 fp4)
    rate_lo = rates.gemm_rate(prec)  # FP8/FP4 GEMMs
    # block-scaled FP8 (1 x 128 / 128 x 128 scales, CUDA-core promotion): DeepGEMM's measured
    # price over per-tensor FP8, dense and grouped GEMMs apart (planner.perf.fp8_scaling)
    block = (prec == PRECISIONS.index("fp8")) & (rates.fp8_scaling == "block")
    rate_expert = np.where(block, rate_lo * BLOCK_GROUPED_RATIO, rate_lo)
    rate_lo = np.where(block, rate_lo * BLOCK_DENSE_RATIO, rate_lo)
    rate_bf16 = rates.gemm_rate(np.full_like(prec, BF16_CODE))
    # FP8/FP4 inputs are cast before each low-precision GEMM: read 2 B + write 1 B per element (in
    # BF16-element units); a card without those units runs the GEMM in BF16 and casts nothing
    low = (prec != BF16_CODE) & np.asarray(rates.native)[prec]
    cast = np.where(low, 1.5, 0.0)
    return _Shard(T, T_el, tp, ep, etp, rate_lo, rate_expert, rate_bf16, c.gemm_half_dim, g["mbs"].astype(float)), cast


@dataclass(frozen=True)
class _MixerCosts:
    """One layer class's token mixer(s) and block edges on one device, forward, per candidate."""

    gemm_s: object  # projection GEMMs
    cast_el: object  # elements cast before low-precision GEMMs
    mem_el: object  # memory-bound elements moved (norms, residual adds, the mixers' sum)
    gemm_in_s: object  # GEMMs reading the layer input
    attn_s: object  # attention core or recurrent scan
    attn_bwd_s: object
    bwd_el: object  # memory-bound elements the backward moves beyond twice the forward's
    core_s: object  # what selective recompute of core_attn replays
    up_gemm_s: object  # MLA up-projections (mla_up_proj), GEMMs
    up_el: object  # and their memory-bound elements
    blocks: int  # pre-norm blocks of the layer (mixer, FFN)


def _mixer_costs(spec: ModelSpec, x: _Shard, index: int, mixer: str, kind: str, seq, mbs, cp, rates: Rates,
                 c: PerfConstants, attention_kernel: str) -> _MixerCosts:
    H = spec.hidden
    parts = mixer_parts(mixer)
    bwd_el = 0.0
    if "attention" in parts:
        t_g, cast_el, mem_el, t_in, (up_g, up_el) = _projections(spec, x)
        # -- attention core (BF16 FlashAttention, causal, heads split by tp, work split by cp)
        attn, attn_bwd = _attention(spec, index, seq, x.T, x.tp, mbs, cp, rates, c, attention_kernel, x.rate_bf16)
        core = attn
    else:
        zero = np.zeros_like(x.T)
        t_g, cast_el, mem_el, t_in, attn, attn_bwd = zero, zero, x.T_el * 10 * H, zero, zero, zero
        core = 0.0  # selective recompute replays softmax attention's core only (Megatron's core_attn)
        up_g, up_el = 0.0, 0.0
    if "recurrent" in parts:  # alone, or beside attention on the same normed input (summed)
        r_g, r_cast, r_mem, r_in, scan, scan_bwd, bwd_el = _recurrent_mixer(spec, x, seq, rates)
        t_g, cast_el, mem_el, t_in = t_g + r_g, cast_el + r_cast, mem_el + r_mem, t_in + r_in
        attn, attn_bwd = attn + scan, attn_bwd + scan_bwd
    if len(parts) > 1:  # the mixers' outputs added (read both, write one; FalconH1DecoderLayer.forward)
        mem_el = mem_el + x.T * 3 * H
    # _projections counts both blocks' pre-norms and residual adds (5 H elements each); a
    # hybrid layer has one block
    blocks = (mixer != "none") + (kind != "none")
    mem_el = mem_el + x.T_el * 5 * H * (blocks - 2)
    return _MixerCosts(t_g, cast_el, mem_el, t_in, attn, attn_bwd, bwd_el, core, up_g, up_el, blocks)


def compute_costs(spec: ModelSpec, grid: dict, rates: Rates, c: PerfConstants, moe_imbalance: float = 1.0,
                  attention_kernel: str = "fused", kernel_level: str = "fused") -> ComputeCosts:
    """Compute seconds per micro-batch of every layer class (module docstring); ``kernel_level``:
    the engine's fusion level of the memory-bound ops (:mod:`dayzero.planner.perf.kernel_level`,
    fused: the reference the constants were fitted on)."""
    g = {k: np.asarray(v) for k, v in grid.items()}
    x, cast = _shard(g, rates, c)
    tp, cp, seq, T, rate_bf16 = x.tp, g["cp"].astype(float), single_seq(g), x.T, x.rate_bf16
    recompute = g["recompute"]
    modules = recompute_modules(g)
    H = spec.hidden

    fwd, bwd, gemm_f, gemm_re, gemm_in, attn_f, dense_p, expert_p = [], [], [], [], [], [], [], []
    keys = _class_keys(spec)
    for key in layer_classes(spec):
        ltype = key[0]
        index = keys.index(key)
        mixer, kind = split_layer_type(ltype)
        m = _mixer_costs(spec, x, index, mixer, kind, seq, g["mbs"], cp, rates, c, attention_kernel)
        t_g, cast_el, mem_el, t_in, attn, attn_bwd = m.gemm_s, m.cast_el, m.mem_el, m.gemm_in_s, m.attn_s, m.attn_bwd_s
        bwd_el, core, up_g, up_el, blocks = m.bwd_el, m.core_s, m.up_gemm_s, m.up_el, m.blocks
        # the engine's unfused bytes beyond the fused count (kernel_level), mixer block and FFN block
        extra = unfused_elements(spec, kernel_level, T, x.T_el, tp, "attention" in mixer_parts(mixer),
                                 *_ffn_rows(spec, kind, x, moe_imbalance))
        mem_el, bwd_el = mem_el + extra.mixer_fwd, bwd_el + extra.mixer_bwd - 2 * extra.mixer_fwd
        mixer_g, mixer_mem, mixer_cast = t_g, mem_el, cast_el
        inside = {}  # forward seconds of parts of the FFN one recompute module replays
        if kind == "moe":
            t_g, mem_el, cast_el, ffn_p, ep_, t_in_ffn, inside = _moe_ffn(spec, x, c, moe_imbalance, t_g, mem_el,
                                                                          cast_el)
        elif kind == "dense":
            t_g, mem_el, cast_el, ffn_p, ep_, t_in_ffn = _dense_ffn(spec, x, t_g, mem_el, cast_el)
        else:
            ffn_p, ep_, t_in_ffn = 0, 0.0, 0.0
        mem_el, bwd_el = mem_el + extra.ffn_fwd, bwd_el + extra.ffn_bwd - 2 * extra.ffn_fwd
        # replicated over dp x cp, split by tp: the mixer, the FFN's non-expert weights, one norm per block
        dp_ = (_mixer_params(spec, mixer) + ffn_p + blocks * norm_params(spec)) / tp
        gemm_in.append(t_in + t_in_ffn)
        dense_p.append(dp_)
        expert_p.append(ep_)
        def mem_s(el):
            return el * BF16 * c.memory_scale / rates.hbm_bw

        t_mem = mem_s(mem_el + cast * cast_el)
        t_mem_bwd = 2 * t_mem + mem_s(bwd_el)
        # what tracing the layer's own code found beyond its shapes (derived specs): BF16 GEMMs of the
        # layer's tokens, not split by tp (such modules' weights are replicated, as memory counts them);
        # an overcount of the shapes (negative extra) is left in the time
        extra = max(traced_extra_flops(spec, index, seq, causal=True), 0.0)
        t_x = _gemm(T * extra, (T, H), rate_bf16, c.gemm_half_dim) if extra else 0.0
        f = t_g + attn + t_mem + t_x
        ffn_f = (t_g - mixer_g) + mem_s(mem_el - mixer_mem + cast * (cast_el - mixer_cast))
        replay = {"core_attn": core, "layernorm": mem_s(x.T_el * 2 * H * blocks),  # each block's norm: r + w
                  "mla_up_proj": up_g + mem_s(up_el),
                  "moe_act": mem_s(inside.get("act_el", 0.0)),
                  "mlp": ffn_f if kind == "dense" else 0.0, "moe": ffn_f if kind == "moe" else 0.0,
                  "shared_experts": inside.get("shared_g", 0.0) + mem_s(inside.get("shared_el", 0.0))}
        re = np.where(replays_layer(g), f, np.where(recompute == SELECTIVE, module_replay(replay, modules), 0.0))
        replay_gemm = {"mla_up_proj": up_g, "mlp": t_g - mixer_g if kind == "dense" else 0.0,
                       "moe": t_g - mixer_g if kind == "moe" else 0.0, "shared_experts": inside.get("shared_g", 0.0)}
        gemm_re.append(np.where(replays_layer(g), t_g, np.where(recompute == SELECTIVE,
                                                                module_replay(replay_gemm, modules), 0.0)))
        ovh = c.layer_overhead_s + (c.moe_expert_overhead_s * spec.moe.experts / x.ep if kind == "moe" else 0.0)
        fwd.append(f + ovh / 3)
        bwd.append(2 * t_g + attn_bwd + t_mem_bwd + 2 * t_x + re + 2 * ovh / 3)
        gemm_f.append(t_g)
        attn_f.append(attn)

    first, last, emb_params, head_params = _edges(spec, x, rates, c)
    n = T.shape
    return ComputeCosts(fwd=_rows(fwd, n), bwd=_rows(bwd, n), gemm_fwd=_rows(gemm_f, n), gemm_replay=_rows(gemm_re, n),
                        gemm_in_fwd=_rows(gemm_in, n), attn_fwd=_rows(attn_f, n),
                        first_extra=first, last_extra=last, dense_params=_rows(dense_p, n),
                        expert_params=_rows(expert_p, n), first_params=np.broadcast_to(emb_params / tp, n),
                        last_params=np.broadcast_to(head_params / tp, n))


def module_replay(replay: dict, modules):
    """Forward seconds selective recompute replays in backward for the module bitmask ``modules``
    (specs.grid.MODULE_BIT), from each module's own forward seconds ``replay``: a module inside
    another that is replayed whole (moe_act and shared_experts inside moe) is not counted twice."""
    modules = np.asarray(modules)
    whole_moe = (modules & MODULE_BIT["moe"]) > 0
    out = 0.0
    for m, seconds in replay.items():
        on = (modules & MODULE_BIT[m]) > 0
        if m in ("moe_act", "shared_experts"):
            on = on & ~whole_moe
        out = out + np.where(on, seconds, 0.0)
    return out


def _projections(spec: ModelSpec, x: _Shard):
    """The attention projections of one layer: (GEMM seconds, elements cast before low-precision
    GEMMs, elements of the layer's memory-bound kernels: norms, residual adds, rope and layout copies,
    GEMM seconds of the projections that read the layer input: all but the output projection)."""
    H, a, T, tp = spec.hidden, spec.attention, x.T, x.tp
    if a.kind == "mla":
        qk = a.heads * a.head_dim
        projs = []  # (flops per token, k, n); MLA down-projections are replicated over tp
        if a.q_lora_rank:
            projs += [(2 * H * a.q_lora_rank, H, a.q_lora_rank), (2 * a.q_lora_rank * qk / tp, a.q_lora_rank,
                                                                  qk / tp)]
        else:
            projs += [(2 * H * qk / tp, H, qk / tp)]
        kv_a = a.kv_lora_rank + a.qk_rope_head_dim
        kv_b = a.heads * (a.qk_nope_head_dim + a.v_head_dim) / tp
        projs += [(2 * H * kv_a, H, kv_a), (2 * a.kv_lora_rank * kv_b, a.kv_lora_rank, kv_b),
                  (2 * a.heads * a.v_head_dim / tp * H, a.heads * a.v_head_dim / tp, H)]
        act_att = (3 * qk + 2 * a.heads * a.v_head_dim) / tp  # rope/split/concat copies per token
    else:
        qkv = (a.heads + 2 * a.kv_heads) * a.head_dim / tp
        projs = [(2 * H * qkv, H, qkv), (2 * a.heads * a.v_head_dim / tp * H, a.heads * a.v_head_dim / tp, H)]
        act_att = (2 * (a.heads + a.kv_heads) * a.head_dim + 2 * (a.heads + 2 * a.kv_heads) * a.head_dim) / tp
    times = [_gemm(T * f, (T, k, n), x.rate_lo, x.d0) for f, k, n in projs]
    t_g = sum(times)
    # the projections that read the layer input: QKV; MLA: Q (or its down-projection) and the KV
    # down-projection (the up-projections read the latents)
    reads_input = ((0, 2) if a.q_lora_rank else (0, 1)) if a.kind == "mla" else (0,)
    t_in = sum(times[i] for i in reads_input)
    cast_el = T * (H + a.heads * a.v_head_dim / tp)
    mem_el = x.T_el * 10 * H + T * act_att  # 2 norms (r+w), 2 residual adds (2r+w)
    # MLA's up-projection and RoPE (Megatron's mla_up_proj recompute): the projections whose outputs
    # are the per-head Q, K, V (Q's up-projection, or Q's projection without a Q latent, and KV's),
    # with the rope/split/concat copies
    up = ((1, 3) if a.q_lora_rank else (0, 2)) if a.kind == "mla" else ()
    return t_g, cast_el, mem_el, t_in, (sum(times[i] for i in up) + 0.0, T * act_att if up else 0.0)


def activation_elements(mlp: MLPSpec) -> float:
    """Elements per row of an MLP's activation kernels in the forward, in units of its width ``f``.

    A fused activation reads its input and writes its output once: ``3 f`` gated (gate and up in,
    product out), ``2 f`` plain. The clamped SwiGLU (gpt-oss) runs eagerly, one kernel per
    operation: Megatron-Bridge's GPT-OSS provider sets ``bias_activation_fusion=False``, so
    Megatron-Core's grouped experts (``TEGroupedMLP``, ``megatron/core/transformer/moe/experts.py``)
    apply ``torch.chunk``, then clamp the gate (read f, write f), clamp the up half (2 f), scale the
    gate by alpha (2 f), sigmoid (2 f), gate x sigmoid (3 f), up + 1 (2 f), the product (3 f) and
    the routing-probability scale the fused kernel folds in (2 f): ``18 f``. The backward moves
    twice the forward's bytes, as for every memory-bound kernel of this model."""
    if mlp.activation == "swiglu_clamped":
        return 18.0
    return 3.0 if mlp.gated else 2.0


def _mixer_params(spec: ModelSpec, mixer: str) -> int:
    """Parameters of a layer's token mixer (0 without one)."""
    parts = mixer_parts(mixer)
    return (attention_params(spec.attention, spec.hidden) * ("attention" in parts)
            + (recurrent_params(spec.recurrent, spec.hidden) if "recurrent" in parts else 0))


def _recurrent_mixer(spec: ModelSpec, x: _Shard, seq: int, rates: Rates):
    """A recurrent mixer: (GEMM seconds, cast elements, memory-bound elements of its own kernels,
    GEMM seconds of the projections reading the layer input, scan forward, scan backward,
    memory-bound elements the backward moves beyond twice the forward's). The layer's norms and
    residual adds are the caller's (as :func:`_projections` counts them for attention).

    Heads split by tp as Megatron-Core's MambaMixer: in_proj column-parallel (T x H x in/tp),
    out_proj row-parallel (T x inner/tp x H). The chunked scan's matmuls
    (:func:`dayzero.specs.counting.recurrent_scan_flops_per_token`, causal) run at the fitted
    attention-kernel rate (SSD and the chunkwise delta rule are blocked matmuls in fused Triton /
    CUDA kernels like FlashAttention's; no separate constant is fitted), backward 2.5 x forward as
    attention (the kernels recompute the within-chunk scores). Memory-bound elements: the mixer's
    kernels (:func:`mamba2_elements` for Mamba-2; Gated DeltaNet: the conv read + write over its channels,
    the gate and gated norm over the inner width (z and y read, product written, norm read +
    write), the chunked scan's passes (values twice and the output once, the key/query-like
    inputs twice each, FP32 chunk states written, passed and read, FP32 within-chunk scores written
    and read), backward twice the forward)."""
    H, T, tp = spec.hidden, x.T, x.tp
    r = spec.recurrent
    n_in = r.in_features / tp
    t_in = _gemm(T * 2 * H * n_in, (T, H, n_in), x.rate_lo, x.d0)
    t_g = t_in + _gemm(T * 2 * r.inner / tp * H, (T, r.inner / tp, H), x.rate_lo, x.d0)
    cast_el = T * (H + r.inner / tp)
    scan = T / tp * recurrent_scan_flops_per_token(r, seq, causal=True) / rates.attention_flops
    if r.kind == "mamba2":
        fwd_el, bwd_el = mamba2_elements(r, seq, x.mbs)
    else:  # no kernel-by-kernel count of the GDN kernels: backward twice the forward
        q = min(r.chunk_size, seq)
        fwd_el = (2 * r.conv_channels + 5 * r.inner + 3 * r.inner + 4 * r.qk_heads * r.qk_dim
                  + 6 * r.heads * r.head_dim * r.qk_dim / q + 4 * q * r.qk_heads)
        bwd_el = 2 * fwd_el
    return t_g, cast_el, T * fwd_el / tp, t_in, scan, 2.5 * scan, T * (bwd_el - 2 * fwd_el) / tp


def mamba2_elements(r, seq: int, mbs=1.0):
    """Memory-bound elements per token (BF16-element units, before the tp split) of one Mamba-2
    mixer in training, (forward, backward), kernel by kernel as Megatron-Core's MambaMixer runs it
    (``_ssm_training``: mamba_ssm's ``mamba_split_conv1d_scan_combined`` without the fused norm,
    then the grouped RMSNorm) over mamba_ssm's SSD kernels (``mamba_ssm/ops/triton/ssd_combined.py``
    ``MambaSplitConv1dScanCombinedFn``, ``_mamba_chunk_scan_combined_fwd/_bwd``). Widths: ``D`` the
    values (heads x head_dim), ``C`` the conv channels (D + 2 G N), ``GN`` one of B / C, ``S`` the
    chunk states per token (heads x head_dim x N / q, q = min(chunk, seq)), ``GQ`` the within-chunk
    score block C B^T per token (G x q); FP32 tensors count 2 units.

    Forward 2C + 7D + 4GN + 6S + 4GQ: causal conv1d (read C, write C); chunk_state (read x, B;
    write FP32 states); state_passing (read FP32, write BF16 states); bmm_chunk (read B, C; write
    FP32 C B^T); chunk_scan (read C B^T, x, C, states, z; write the gated output and out_x); the
    norm (read, write D). Backward 5C + 20D + 5GN + 17S + 12GQ: the norm's (read dy and y, write
    dx); the conv, C B^T, chunk states and state passing recomputed (``backward`` re-runs
    ``causal_conv1d_fwd``, ``_bmm_chunk_fwd``, ``_chunk_state_fwd``, ``_state_passing_fwd``, FP32
    out); ``_chunk_scan_bwd_dz`` (read x, z, out, dout; write dz, dout); ``_chunk_scan_bwd_dstates``
    (read C, dout; write FP32 dstates); ``_state_passing_bwd`` (read both FP32, write both BF16);
    ``_chunk_scan_chunk_state_bwd_dx`` (read x, C B^T, dout, B, dstates; write dx);
    ``_chunk_state_bwd_db`` and ``_chunk_scan_bwd_dC`` (read x or dout, states, B or C; write dB,
    dC); ``_chunk_scan_bwd_dcb`` (read x, dout; write FP32 dCB); two ``_bmm_chunk_bwd`` (read B or
    C, dCB, the residual; write); ``_chunk_scan_bwd_ddAcs_stable`` (read x, dout, C B^T); the conv
    backward (read input and gradient, write dxBC). The per-head dt/dA cumsums (heads per token)
    are negligible and left out.

    With more than one sequence per micro-batch, Megatron-Core's ``_ssm_training`` copies the
    in_proj output ``rearrange(zxBCdt, "l b d -> b l d").contiguous()`` and the output back
    (``"b l d -> l b d"``), and the backward their gradients: 2 (in_features + D) each way (a
    one-sequence batch is contiguous either way, no copy)."""
    D, GN = r.inner, r.n_groups * r.d_state
    C = D + 2 * GN
    q = min(r.chunk_size, seq)
    S, GQ = r.heads * r.head_dim * r.d_state / q, r.n_groups * q
    fwd = 2 * C + 7 * D + 4 * GN + 6 * S + 4 * GQ
    bwd = 5 * C + 20 * D + 5 * GN + 17 * S + 12 * GQ
    copies = np.where(np.asarray(mbs) > 1, 2.0 * (r.in_features + D), 0.0)
    return fwd + copies, bwd + copies


def _moe_ffn(spec: ModelSpec, x: _Shard, c: PerfConstants, moe_imbalance: float, t_g, mem_el, cast_el):
    """A MoE layer's routed experts (at the busiest device's imbalance), router and shared experts,
    added to the layer's GEMM seconds, memory-bound and cast elements; with its non-expert
    parameters (shared experts and router, whole: the caller splits them by tp with the mixer's),
    the routed experts' per device (replicated over edp), the shared FC1's GEMM seconds and what
    module recompute replays: the routed experts' activation-function elements (``act_el``, moe_act)
    and the shared experts' GEMM seconds and elements (``shared_g``, ``shared_el``)."""
    H, T, tp, ep, etp, d0 = spec.hidden, x.T, x.tp, x.ep, x.etp, x.d0
    moe = spec.moe
    k_top = moe.top_k
    fe = moe.expert.intermediate
    m1 = 2 if moe.expert.gated else 1
    routed_tok = T * k_top / tp * moe_imbalance  # token-expert rows per device (busiest)
    m_e = T * k_top * etp * ep / (tp * moe.experts)  # rows per local expert GEMM
    t_g = t_g + _gemm(routed_tok * 2 * H * (m1 + 1) * fe, (m_e, H, fe / etp), x.rate_expert * c.moe_gemm_scale, d0)
    t_g = t_g + _gemm(T / tp * 2 * H * moe.experts, (T / tp, H, moe.experts), x.rate_bf16, d0)  # router
    act_el = routed_tok * activation_elements(moe.expert) * fe
    mem_el = mem_el + act_el + routed_tok * 4 * H + T / tp * 4 * moe.experts
    cast_el = cast_el + routed_tok * (H + fe)
    t_in = np.zeros_like(T)
    inside = {"act_el": act_el}
    if moe.shared_experts:
        fs = moe.shared_intermediate
        shared_g = _gemm(T * 2 * H * (m1 + 1) * fs / tp, (T, H, fs / tp), x.rate_lo, d0)
        t_g = t_g + shared_g
        t_in = _gemm(T * 2 * H * m1 * fs / tp, (T, H, m1 * fs / tp), x.rate_lo, d0)  # the shared FC1
        mem_el = mem_el + T * (m1 + 1) * fs / tp
        cast_el = cast_el + T * (H + fs / tp)
        inside.update(shared_g=shared_g, shared_el=T * (m1 + 1) * fs / tp)
    sm = shared_mlp(moe)
    shared = mlp_params(sm, H) if sm else 0
    experts_p = moe.experts * mlp_params(moe.expert, H) / (ep * etp)
    return t_g, mem_el, cast_el, shared + router_params(moe, H), experts_p, t_in, inside


def _dense_ffn(spec: ModelSpec, x: _Shard, t_g, mem_el, cast_el):
    """A dense layer's MLP (column- then row-parallel over tp), added like :func:`_moe_ffn`'s."""
    H, T, tp, d0 = spec.hidden, x.T, x.tp, x.d0
    m = spec.mlp
    m1 = 2 if m.gated else 1
    f_ = m.intermediate
    t_in = _gemm(T * 2 * H * m1 * f_ / tp, (T, H, m1 * f_ / tp), x.rate_lo, d0)  # FC1
    t_g = t_g + t_in + _gemm(T * 2 * f_ / tp * H, (T, f_ / tp, H), x.rate_lo, d0)
    mem_el = mem_el + T * activation_elements(m) * f_ / tp
    cast_el = cast_el + T * (H + f_ / tp)
    return t_g, mem_el, cast_el, mlp_params(m, H), np.zeros_like(T), t_in


def _edges(spec: ModelSpec, x: _Shard, rates: Rates, c: PerfConstants):
    """The embedding (first stage) and head + loss (last stage): their seconds forward+backward and
    their parameters (before the tp split)."""
    H, V, T, tp = spec.hidden, spec.vocab, x.T, x.tp
    emb_mem = x.T_el * H * 3 * BF16  # lookup write + gradient scatter-add
    first = emb_mem * c.memory_scale / rates.hbm_bw
    head_fwd = _gemm(T * 2 * H * V / tp, (T, H, V / tp), x.rate_bf16, x.d0)
    # logits (T, V/tp): BF16 write, fused softmax + cross-entropy in FP32 (read, write grad)
    loss_bytes = T * V / tp * 10 + x.T_el * H * 2 * BF16
    last = 3 * head_fwd + loss_bytes * c.memory_scale / rates.hbm_bw
    emb_params = V * H + (spec.max_positions * H if spec.position == "learned" else 0)
    head_params = (0 if spec.tie_embeddings else V * H) + norm_params(spec)
    if spec.mtp_layers:
        # each MTP module (DeepSeek-V3 sec. 2.2) on the last stage: eh_proj of [norm(h); norm(emb)]
        # (2H x H, kept in BF16: DeepSeek-V3's checkpoint has no FP8 scales for it), its two norms
        # and the final norm, and another pass through the shared head and loss; its decoder layer
        # is a layer of the last stage (perf.stage_work)
        proj = _gemm(T * 2 * 2 * H * H / tp, (T, 2 * H, H / tp), x.rate_bf16, x.d0)
        norms = x.T_el * H * 3 * 2 * BF16  # three norms, read + write
        last = last * (1 + spec.mtp_layers) + spec.mtp_layers * (3 * proj + 3 * norms * c.memory_scale / rates.hbm_bw)
        head_params = head_params + spec.mtp_layers * (2 * H * H + 3 * norm_params(spec))
    return first, last, emb_params, head_params


def _attention(spec: ModelSpec, index: int, seq: int, T, tp, mbs, cp, rates: Rates, c: PerfConstants,
               kernel: str, rate_bf16):
    """(forward, backward) seconds of one layer's attention core.

    fused / flash2: FlashAttention-style, causal (and windowed) work only, backward 2.5 x forward
    (it recomputes the scores: 5 matmuls against 2). unfused: the score matrix of every query
    against every key is materialised (masking does not skip work): QK^T and PV as batched BF16
    GEMMs plus memory traffic of 8 bytes per score forward (write S, softmax read + write, read
    for PV) and 12 backward (write dP, softmax backward reads P and dP and writes dS, read dS
    for dQ and dK); what Transformer Engine falls back to where the fused kernels lack a feature
    (learnable softmax sinks before cuDNN 9.13.1, https://github.com/NVIDIA/TransformerEngine/issues/2318,
    or with packed THD sequences, https://github.com/NVIDIA/TransformerEngine/issues/2483)."""
    if kernel == "unfused":
        a = spec.attention
        scores = mbs * (a.heads / tp) * (seq / cp) * seq  # per micro-batch on this device
        mm = _gemm(2.0 * scores * (a.head_dim + a.v_head_dim), (seq / cp, a.head_dim, seq), rate_bf16, c.gemm_half_dim)
        mem = scores * 8.0 * c.memory_scale / rates.hbm_bw
        return mm + mem, 2 * mm + 1.5 * mem
    rate = rates.flash2_flops if kernel == "flash2" else rates.attention_flops
    fwd = T / tp * attention_flops_per_token(spec, seq, index, causal=True) / rate
    return fwd, 2.5 * fwd


def _ffn_rows(spec: ModelSpec, kind: str, x: _Shard, moe_imbalance) -> tuple:
    """(rows, per-device width, gated) of a layer's FFN activation, as :func:`_dense_ffn` and
    :func:`_moe_ffn` count it (routed rows at the busiest device's imbalance; a MoE layer's shared
    experts left out: their activation is a small share); (None, 0, False) without an FFN."""
    if kind == "dense":
        return x.T, spec.mlp.intermediate / x.tp, spec.mlp.gated
    if kind == "moe":
        moe = spec.moe
        return x.T * moe.top_k / x.tp * moe_imbalance, moe.expert.intermediate, moe.expert.gated
    return None, 0.0, False


def _rows(rows, shape) -> np.ndarray:
    """Stack per-class arrays (some may be scalars) into a (K, N) float array."""
    return np.stack([np.broadcast_to(np.asarray(r, dtype=float), shape) for r in rows])
