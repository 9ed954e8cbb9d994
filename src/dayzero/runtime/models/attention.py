"""Self-attention for the zoo: grouped-query (MHA/GQA/MQA, optionally with gpt-oss's attention
sinks) and DeepSeek's multi-head latent attention (MLA), both with rotary positions and PyTorch's
fused ``scaled_dot_product_attention``.

Plain PyTorch: nothing here knows about parallelism. Projections are reshaped with
``view(B, S, -1, head_dim)`` so that when tensor parallelism shards a projection's output
columns the local head count follows automatically.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dayzero.specs.model import AttentionSpec


def rope_cache(dim: int, seq: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (seq, dim) in fp32, laid out as cat(freqs, freqs) (Su et al. 2021, as in
    the HF reference implementations)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)  # (S, dim/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool = False) -> torch.Tensor:
    """x: (B, S, heads, d); cos/sin: (S, d). ``interleave`` rotates pairs (x0, x1), (x2, x3), ...
    (DeepSeek's checkpoint layout) instead of the two halves."""
    cos = cos[None, :, None, :].to(x.dtype)
    sin = sin[None, :, None, :].to(x.dtype)
    if interleave:
        half = x.shape[-1] // 2
        c, s = cos[..., :half], sin[..., :half]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class CoreAttention(nn.Module):
    """softmax(q k^T * scale + causal mask) v through the fused SDPA kernel: the part selective
    recompute re-runs in backward (Korthikanti et al. 2022). With ``sinks`` (gpt-oss) each head's
    learned logit joins the softmax denominator and carries no value (OpenAI gpt-oss model card,
    2025, "attention sinks"; transformers modeling_gpt_oss.eager_attention_forward), computed
    explicitly since SDPA has no such term."""

    def __init__(self, scale: float, window: int | None = None):
        super().__init__()
        self.scale = scale
        self.window = window

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                sinks: torch.Tensor | None = None, docs: torch.Tensor | None = None) -> torch.Tensor:
        # q: (B, h, S, d), k: (B, kv_h, S, d), v: (B, kv_h, S, dv), sinks: (h,) -> (B, h, S, dv)
        # docs: (B, S) document ids of packed sequences (document_ids): a query attends within its document only
        if docs is not None:
            spans = document_spans(docs)
            if any(len(s) > 1 for s in spans):
                return self._per_document(q, k, v, sinks, spans)
        return self._window(q, k, v, sinks)

    def _per_document(self, q, k, v, sinks, spans) -> torch.Tensor:
        """Each document of each sequence as a sequence of its own (varlen attention, as FlashAttention's
        cu_seqlens: Megatron --reset-attention-mask): the work is the sum over documents of their
        length squared, not the window's, which is what the planner prices for packed documents."""
        rows = []
        for b, bounds in enumerate(spans):
            parts = [self._window(q[b:b + 1, :, a:e], k[b:b + 1, :, a:e], v[b:b + 1, :, a:e], sinks)
                     for a, e in bounds]
            rows.append(torch.cat(parts, dim=2))
        return torch.cat(rows, dim=0)

    def _window(self, q, k, v, sinks) -> torch.Tensor:
        seq = q.shape[2]
        gqa = k.shape[1] != q.shape[1]
        windowed = self.window is not None and self.window < seq
        if sinks is None and not windowed:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale, enable_gqa=gqa)
        i = torch.arange(seq, device=q.device)
        mask = i[None, :] <= i[:, None]  # (S, S) causal
        if windowed:
            mask = mask & (i[:, None] - i[None, :] < self.window)  # sliding: the last ``window`` keys
        if sinks is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale, enable_gqa=gqa)
        return sink_attention(q, k, v, mask, self.scale, sinks)


def document_ids(tokens: torch.Tensor, separator: int) -> torch.Tensor:
    """(B, S) token ids -> (B, S) document ids of packed sequences: a document ends at (and
    includes) its ``separator`` token and the next one starts after it (Megatron-LM
    ``get_ltor_masks_and_position_ids`` with reset_attention_mask: tokens after an EOD do not
    attend to tokens before it)."""
    ends = (tokens == separator).to(torch.int32)
    return torch.cumsum(ends, dim=1) - ends


def document_spans(docs: torch.Tensor) -> list[list[tuple[int, int]]]:
    """(B, S) document ids -> per sequence, the [start, end) of each of its documents, in order."""
    out = []
    for row in docs.detach().to("cpu"):
        cuts = (torch.nonzero(row[1:] != row[:-1]).flatten() + 1).tolist()
        edges = [0, *cuts, int(row.numel())]
        out.append(list(zip(edges[:-1], edges[1:])))
    return out


def sink_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float,
                   sinks: torch.Tensor) -> torch.Tensor:
    """softmax over [q k^T * scale (masked), sink_h] per row, the sink column dropped, times v; the
    softmax in fp32. q: (B, h, S, d), k/v: (B, kv_h, S, .), mask: (S, S) bool, sinks: (h,)."""
    if k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    logits = (q @ k.transpose(-2, -1)).float() * scale  # (B, h, S, S)
    logits = logits.masked_fill(~mask, float("-inf"))
    sink = sinks.float().view(1, -1, 1, 1).expand(q.shape[0], -1, q.shape[2], 1)
    probs = torch.cat([logits, sink], dim=-1).softmax(dim=-1)[..., :-1]
    return probs.to(v.dtype) @ v


class RMSNorm(nn.Module):
    """Normalise in fp32, cast back, then scale (the HF Llama/DeepSeek order)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


class GroupedQueryAttention(nn.Module):
    """MHA / GQA / MQA: wq, wk, wv -> RoPE -> SDPA -> wo; optional per-head q/k RMSNorm (Qwen3)."""

    def __init__(self, spec: AttentionSpec, hidden: int, eps: float, window: int | None = None):
        super().__init__()
        a = spec
        self.head_dim, self.v_head_dim = a.head_dim, a.v_head_dim
        self.wq = nn.Linear(hidden, a.heads * a.head_dim, bias=a.qkv_bias)
        self.wk = nn.Linear(hidden, a.kv_heads * a.head_dim, bias=a.qkv_bias)
        self.wv = nn.Linear(hidden, a.kv_heads * a.v_head_dim, bias=a.qkv_bias)
        self.wo = nn.Linear(a.heads * a.v_head_dim, hidden, bias=a.o_bias)
        self.q_norm = RMSNorm(a.head_dim, eps) if a.qk_norm else None
        self.k_norm = RMSNorm(a.head_dim, eps) if a.qk_norm else None
        # one learned logit per query head (gpt-oss); tensor parallelism shards it with the heads
        self.sinks = nn.Parameter(torch.empty(a.heads)) if a.sinks else None
        self.core = CoreAttention(a.head_dim ** -0.5, window)

    @property
    def rope_dim(self) -> int:
        return self.head_dim

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                docs: torch.Tensor | None = None) -> torch.Tensor:
        bs, seq, _ = x.shape  # (B, S, H), the full sequence (TP gathers it before attention)
        q = self.wq(x).view(bs, seq, -1, self.head_dim)  # (B, S, h_local, d)
        k = self.wk(x).view(bs, seq, -1, self.head_dim)
        v = self.wv(x).view(bs, seq, -1, self.v_head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if cos is not None:  # (learned absolute positions were added to the embedding instead)
            q, k = apply_rope(q, cos[:seq], sin[:seq]), apply_rope(k, cos[:seq], sin[:seq])
        sinks = None if self.sinks is None else _local(self.sinks)  # (h_local,)
        out = self.core(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), sinks, docs)  # (B, h_local, S, dv)
        return self.wo(out.transpose(1, 2).reshape(bs, seq, -1))


def _local(p: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a tensor-parallel DTensor parameter (autograd flows through)."""
    return p.to_local() if hasattr(p, "to_local") else p


class MultiHeadLatentAttention(nn.Module):
    """DeepSeek-V2/V3 MLA (DeepSeek-AI 2024): queries through an optional low-rank bottleneck, keys
    and values from one compressed latent (kv_lora_rank) plus one shared rotary key per token."""

    def __init__(self, spec: AttentionSpec, hidden: int, eps: float):
        super().__init__()
        a = spec
        self.nope, self.rope, self.v_dim = a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim
        self.kv_lora_rank, self.interleave = a.kv_lora_rank, a.rope_interleave
        qk_dim = self.nope + self.rope
        if a.q_lora_rank is None:
            self.wq = nn.Linear(hidden, a.heads * qk_dim, bias=False)
            self.wq_a = self.q_norm = self.wq_b = None
        else:
            self.wq = None
            self.wq_a = nn.Linear(hidden, a.q_lora_rank, bias=a.qkv_bias)
            self.q_norm = RMSNorm(a.q_lora_rank, eps)
            self.wq_b = nn.Linear(a.q_lora_rank, a.heads * qk_dim, bias=False)
        self.wkv_a = nn.Linear(hidden, a.kv_lora_rank + a.qk_rope_head_dim, bias=a.qkv_bias)
        self.kv_norm = RMSNorm(a.kv_lora_rank, eps)
        self.wkv_b = nn.Linear(a.kv_lora_rank, a.heads * (self.nope + self.v_dim), bias=False)
        self.wo = nn.Linear(a.heads * a.v_head_dim, hidden, bias=a.o_bias)
        # the rotary key shared by every head: a named point so tensor parallelism can sum its
        # gradient over the ranks that hold different heads (no parameters)
        self.shared_key = nn.Identity()
        self.core = CoreAttention(qk_dim ** -0.5)

    @property
    def rope_dim(self) -> int:
        return self.rope

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                docs: torch.Tensor | None = None) -> torch.Tensor:
        bs, seq, _ = x.shape
        q = self.wq(x) if self.wq is not None else self.wq_b(self.q_norm(self.wq_a(x)))
        q = q.view(bs, seq, -1, self.nope + self.rope)  # (B, S, h_local, nope + rope)
        q_nope, q_rot = q.split([self.nope, self.rope], dim=-1)
        latent, k_rot = self.wkv_a(x).split([self.kv_lora_rank, self.rope], dim=-1)
        k_rot = self.shared_key(k_rot)  # (B, S, rope)
        kv = self.wkv_b(self.kv_norm(latent)).view(bs, seq, -1, self.nope + self.v_dim)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)  # (B, S, h_local, nope), (B, S, h_local, dv)
        cos, sin = cos[:seq], sin[:seq]
        q_rot = apply_rope(q_rot, cos, sin, self.interleave)
        k_rot = apply_rope(k_rot.view(bs, seq, 1, self.rope), cos, sin, self.interleave)
        q = torch.cat([q_nope, q_rot], dim=-1)
        k = torch.cat([k_nope, k_rot.expand(-1, -1, k_nope.shape[2], -1)], dim=-1)
        out = self.core(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, docs)  # (B, h_local, S, dv)
        return self.wo(out.transpose(1, 2).reshape(bs, seq, -1))


def build_attention(spec: AttentionSpec, hidden: int, eps: float, window: int | None) -> nn.Module:
    if spec.kind == "mla":
        return MultiHeadLatentAttention(spec, hidden, eps)
    return GroupedQueryAttention(spec, hidden, eps, window)
