"""What one rank holds of each layer: parameters split by how tensor/expert parallelism shards them.

Megatron-style sharding (Shoeybi et al. 2019; Megatron-Core MLA and MoE layers):
- ``tp``: column/row-parallel weights (Q, O, MLP, shared experts, MLA up-projections, vocab-parallel
  embedding and head) are split ``tp`` ways;
- ``kv``: GQA key/value projections are split over ``min(tp, kv_heads)``: when tp > kv_heads each
  rank keeps one whole KV head (they are replicated, as in Megatron);
- ``rep``: norms, the router, row-parallel biases and MLA's down-projections (``q_a_proj``,
  ``kv_a_proj_with_mqa``, "duplicated" in Megatron-Core) are replicated on every TP rank;
- ``expert``: routed experts are split ``ep * etp`` ways (ep experts groups, etp inside an expert).

All per-rank functions are numpy-compatible: degrees may be ints or arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from dayzero.specs.counting import (
    embedding_params,
    head_params,
    layer_count,
    mlp_params,
    norm_params,
    recurrent_params,
    router_params,
    shared_mlp,
)
from dayzero.specs.model import MLPSpec, ModelSpec, mixer_parts, split_layer_type


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one decoder layer kind, by how TP/EP split them (sum = the exact count)."""

    tp: int
    kv: int
    rep: int
    expert: int

    @property
    def total(self) -> int:
        return self.tp + self.kv + self.rep + self.expert

    def local_dense(self, tp, kv_heads: int):
        """Non-expert parameters on one TP rank."""
        return self.tp / tp + self.kv / np.minimum(tp, kv_heads) + self.rep

    def local_expert(self, ep, etp):
        """Routed-expert parameters on one rank."""
        return self.expert / (ep * etp)


def _mlp_split(m: MLPSpec, hidden: int) -> tuple[int, int]:
    """(tp-split, replicated) parameters of an MLP: everything but the row-parallel down bias is split."""
    rep = hidden if m.bias else 0
    return mlp_params(m, hidden) - rep, rep


def attention_split(spec: ModelSpec) -> tuple[int, int, int]:
    a, h = spec.attention, spec.hidden
    tp = kv = rep = 0
    if a.kind == "mla":
        qk = a.heads * a.head_dim
        if a.q_lora_rank is None:
            tp += h * qk
        else:
            rep += h * a.q_lora_rank + a.q_lora_rank  # q_a_proj + q_a_layernorm
            tp += a.q_lora_rank * qk
        rep += h * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank  # kv_a_proj_with_mqa + kv_a_layernorm
        tp += a.kv_lora_rank * a.heads * (a.qk_nope_head_dim + a.v_head_dim)
        if a.qkv_bias:
            rep += (a.q_lora_rank or 0) + a.kv_lora_rank + a.qk_rope_head_dim
    else:
        tp += h * a.heads * a.head_dim + (a.heads * a.head_dim if a.qkv_bias else 0)
        kv += h * a.kv_heads * (a.head_dim + a.v_head_dim)
        kv += a.kv_heads * (a.head_dim + a.v_head_dim) if a.qkv_bias else 0
        rep += 2 * a.head_dim if a.qk_norm else 0
    tp += a.heads * a.v_head_dim * h  # o_proj
    rep += h if a.o_bias else 0
    tp += a.heads if a.sinks else 0
    return tp, kv, rep


def recurrent_split(spec: ModelSpec) -> tuple[int, int]:
    """(tp-split, replicated) parameters of a recurrent mixer. Megatron-Core's MambaMixer shards
    the heads (and B/C groups): in_proj column-parallel, the conv channels, dt_bias, A_log, D and
    the grouped gated norm with them, out_proj row-parallel (its bias replicated). Gated DeltaNet
    likewise, but its gated norm is one value head wide, shared by the heads (replicated)."""
    r, h = spec.recurrent, spec.hidden
    rep = h if r.proj_bias else 0
    if r.kind == "gated_deltanet" and r.gated_norm:
        rep += r.head_dim
    return recurrent_params(r, h) - rep, rep


@lru_cache(maxsize=64)
def layer_params(spec: ModelSpec, kind: str) -> LayerParams:
    """Split of one decoder layer of type ``kind`` (ModelSpec.layer_types); sums to
    counting.layer_count exactly."""
    h = spec.hidden
    mixer, ffn = split_layer_type(kind)
    tp = kv = rep = 0
    if "attention" in mixer_parts(mixer):
        tp, kv, rep = attention_split(spec)
    if "recurrent" in mixer_parts(mixer):  # alone, or beside attention (both split by tp)
        r_tp, r_rep = recurrent_split(spec)
        tp, rep = tp + r_tp, rep + r_rep
    rep += ((mixer != "none") + (ffn != "none")) * norm_params(spec)
    expert = 0
    if ffn == "none":
        pass
    elif ffn == "moe":
        moe = spec.moe
        expert = moe.experts * mlp_params(moe.expert, h)
        rep += router_params(moe, h)
        sm = shared_mlp(moe)
        if sm:
            t, r = _mlp_split(sm, h)
            tp, rep = tp + t, rep + r
    else:
        t, r = _mlp_split(spec.mlp, h)
        tp, rep = tp + t, rep + r
    base = layer_count(spec, 0, kind)
    exact = base.total - base.other
    # a derived spec's extra parameters (ModelSpec.layer_extra): the mean over the layers of this kind,
    # counted as replicated on every TP rank (an upper bound on what a TP rank holds)
    extras = [x for k, x in zip(spec.layer_types, spec.layer_extra) if k == kind]
    rep += sum(extras) / len(extras) if extras and any(extras) else 0
    out = LayerParams(tp=tp, kv=kv, rep=rep, expert=expert)
    assert abs(out.total - exact - (sum(extras) / len(extras) if extras and any(extras) else 0)) < 1e-6, \
        "parameter split must sum to the exact count"
    return out


@dataclass(frozen=True)
class EdgeParams:
    """Parameters outside the decoder layers: embedding (first stage), final norm + head (last)."""

    embed_tp: int  # vocab-parallel token embedding
    embed_rep: int  # learned positions (replicated)
    head_tp: int  # output projection; a tied embedding is kept as a copy on the last stage when pp > 1
    final_norm: int
    tied: bool


@lru_cache(maxsize=64)
def edge_params(spec: ModelSpec) -> EdgeParams:
    v_h = spec.vocab * spec.hidden
    return EdgeParams(embed_tp=v_h, embed_rep=embedding_params(spec) - v_h,
                      head_tp=head_params(spec) if not spec.tie_embeddings else v_h,
                      final_norm=norm_params(spec), tied=spec.tie_embeddings)


def head_local(edge: EdgeParams, tp, pp):
    """Head parameters on the last rank: a tied head shares the embedding only when pp == 1 (Megatron
    keeps a copy on the last stage and all-reduces its gradient with the first)."""
    copy = np.where(np.asarray(pp) > 1, 1, 0) if edge.tied else 1
    return edge.head_tp * copy / tp + edge.final_norm


def embed_local(edge: EdgeParams, tp):
    return edge.embed_tp / tp + edge.embed_rep
