"""The model zoo: one decoder-only transformer built from any ModelSpec (not one class per model).

    tok_embeddings -> [pos_embeddings] -> layers["0".."L-1"] -> norm -> output

Each layer is pre-norm attention (GQA or MLA) + pre-norm feed-forward (dense MLP or MoE).
``layers`` is a ModuleDict keyed by the global layer index, so a pipeline stage that keeps only
some layers (and drops the embedding or head) keeps the same parameter names as the full model:
checkpoints and HF name mapping never depend on the layout. Built on the meta device; weights
are created by :func:`initial_value` after parallelization (see ``parallelize.materialize``).
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from dayzero.errors import ConfigError
from dayzero.runtime.models.attention import RMSNorm, build_attention, document_ids, rope_cache
from dayzero.runtime.models.mlp import MLP
from dayzero.runtime.models.moe import MoE
from dayzero.specs.model import ModelSpec

INIT_STD = 0.02  # HF ``initializer_range`` default and GPT-2's (Radford et al. 2019)


def norm_layer(spec: ModelSpec, dim: int) -> nn.Module:
    if spec.norm == "layernorm":
        return nn.LayerNorm(dim, eps=spec.norm_eps, bias=spec.norm_bias)
    return RMSNorm(dim, spec.norm_eps)


class TransformerBlock(nn.Module):
    def __init__(self, spec: ModelSpec, index: int):
        super().__init__()
        self.attention_norm = norm_layer(spec, spec.hidden)
        self.attention = build_attention(spec.attention, spec.hidden, spec.norm_eps, spec.layer_windows[index])
        self.ffn_norm = norm_layer(spec, spec.hidden)
        if spec.layer_kinds[index] == "moe":
            self.moe, self.mlp = MoE(spec.hidden, spec.moe), None
        else:
            self.moe, self.mlp = None, MLP(spec.hidden, spec.mlp)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                docs: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin, docs=docs)
        ffn = self.moe if self.moe is not None else self.mlp
        return x + ffn(self.ffn_norm(x))


class Transformer(nn.Module):
    """The full model, or one pipeline stage of it (parts set to None are absent). With a
    ``document_separator`` the sequences are packed documents: attention stays within each document
    (:func:`~dayzero.runtime.models.attention.document_ids`, read from the token ids, so only the stage
    holding the embedding can run it)."""

    def __init__(self, spec: ModelSpec, max_seq: int | None = None, document_separator: int | None = None):
        super().__init__()
        self.document_separator = document_separator
        if spec.is_hybrid:
            raise ConfigError(spec.name, None, "has recurrent (state-space / linear-attention) layers or layers "
                              "without a mixer or FFN; dayzero's model zoo builds transformer layers only (plan it, "
                              "or train a config of its model_type through its own modeling code)")
        self.spec = spec
        self.max_seq = max_seq or spec.max_positions
        self.tok_embeddings = nn.Embedding(spec.vocab, spec.hidden)
        self.pos_embeddings = nn.Embedding(spec.max_positions, spec.hidden) if spec.position == "learned" else None
        self.layers = nn.ModuleDict({str(i): TransformerBlock(spec, i) for i in range(spec.layers)})
        self.norm = norm_layer(spec, spec.hidden)
        self.output = nn.Linear(spec.hidden, spec.vocab, bias=False)
        if spec.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        rope_dim = spec.attention.qk_rope_head_dim if spec.attention.kind == "mla" else spec.attention.head_dim
        self.rope_dim = rope_dim if spec.position == "rope" else 0
        # RoPE tables, fp32, not saved: recomputed by init_buffers() after materialization
        self.register_buffer("rope_cos", torch.empty(self.max_seq, self.rope_dim), persistent=False)
        self.register_buffer("rope_sin", torch.empty(self.max_seq, self.rope_dim), persistent=False)
        # the position of the first token this rank holds of every sequence: context parallelism
        # gives each rank one contiguous slice of it (0: the whole sequence)
        self.position_offset = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # first stage: x = token ids (B, S); later stages: hidden states (B, S, H); S is this
        # rank's slice of the sequence under context parallelism, from position_offset on
        start = self.position_offset
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        if self.pos_embeddings is not None and self.tok_embeddings is not None:
            h = h + self.pos_embeddings(torch.arange(start, start + x.shape[1], device=x.device))
        # the attention layers take the first S rows (their S: sequence parallelism gathers it first)
        cos, sin = (self.rope_cos[start:], self.rope_sin[start:]) if self.rope_dim else (None, None)
        docs = None
        if self.document_separator is not None:
            if self.tok_embeddings is None:
                raise ConfigError("--reset-attention-mask", None, "a pipeline stage after the first has no token "
                                  "ids to read the documents from; run it with pp 1")
            docs = document_ids(x, self.document_separator)
        for layer in self.layers.values():
            h = layer(h, cos, sin) if docs is None else layer(h, cos, sin, docs=docs)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h

    @torch.no_grad()
    def init_buffers(self) -> None:
        if self.rope_dim:
            cos, sin = rope_cache(self.rope_dim, self.max_seq, self.spec.rope_theta)
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)
        for m in self.modules():
            if isinstance(m, MoE):
                m.reset_counts()
                if m.router.e_score_correction_bias is not None:
                    m.router.e_score_correction_bias.zero_()


def initial_value(fqn: str, shape: tuple[int, ...], seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The full initial value of parameter ``fqn``: a pure function of (name, shape, seed), so every
    layout (and every rank computing its shard) starts from exactly the same weights.

    Norm weights 1, biases 0, everything else (attention sinks too) N(0, 0.02), the HF/GPT-2 convention.
    """
    leaf = fqn.rsplit(".", 1)[-1]
    parent = fqn.rsplit(".", 2)[-2] if fqn.count(".") >= 1 else ""
    if leaf == "bias" or leaf.endswith("_bias"):  # incl. the routed experts' w1_bias / w2_bias / w3_bias
        return torch.zeros(shape, device=device)
    if "norm" in parent and leaf == "weight":
        return torch.ones(shape, device=device)
    g = torch.Generator(device=device)
    g.manual_seed(int.from_bytes(hashlib.sha256(f"{seed}:{fqn}".encode()).digest()[:7], "little"))
    return torch.randn(shape, generator=g, device=device) * INIT_STD


def build_model(spec: ModelSpec, max_seq: int | None = None, document_separator: int | None = None) -> Transformer:
    """The whole model on the meta device (no memory); parallelize, then materialize.
    ``document_separator``: the token that ends a packed document (per-document attention)."""
    with torch.device("meta"):
        return Transformer(spec, max_seq, document_separator)
