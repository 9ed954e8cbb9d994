"""The dense feed-forward block and its activations: the MLP of every dense layer and of an MoE
layer's shared experts (routed experts use the same activations, as grouped weights in ``moe``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dayzero.specs.model import MLPSpec


def activation(name: str):
    if name == "silu":
        return F.silu
    if name == "gelu":
        return lambda x: F.gelu(x, approximate="tanh")  # GPT-2's "gelu_new"
    if name == "relu2":
        return lambda x: F.relu(x).square()  # Nemotron's squared ReLU
    raise ValueError(f"activation {name!r}")


def gated(spec: MLPSpec):
    """The gate-up product of a gated MLP, ``f(gate, up)``: act(gate) * up (SwiGLU, Shazeer 2020), or
    gpt-oss's clamped SwiGLU (OpenAI gpt-oss model card, 2025; transformers GptOssExperts._apply_gate):
    gate clamped to <= limit, up to [-limit, limit], (up + 1) * gate * sigmoid(alpha * gate)."""
    if spec.activation == "swiglu_clamped":
        alpha, limit = spec.swiglu_alpha, spec.swiglu_limit

        def clamped(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
            gate = gate.clamp(max=limit)
            up = up.clamp(min=-limit, max=limit)
            return (up + 1) * (gate * torch.sigmoid(alpha * gate))

        return clamped
    act = activation(spec.activation)
    return lambda gate, up: act(gate) * up


class MLP(nn.Module):
    """Gated (w2(gated(w1 x, w3 x)), see :func:`gated`) or plain (w2(act(w1 x)))."""

    def __init__(self, hidden: int, spec: MLPSpec, intermediate: int | None = None):
        super().__init__()
        inter = intermediate or spec.intermediate
        self.act = gated(spec) if spec.gated else activation(spec.activation)
        self.w1 = nn.Linear(hidden, inter, bias=spec.bias)
        self.w2 = nn.Linear(inter, hidden, bias=spec.bias)
        self.w3 = nn.Linear(hidden, inter, bias=spec.bias) if spec.gated else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.w1(x), self.w3(x)) if self.w3 is not None else self.act(self.w1(x))
        return self.w2(h)
