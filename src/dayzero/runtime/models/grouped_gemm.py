"""Grouped expert GEMMs: ``x @ w[e].T`` for each expert's block of rows in one call.

Rows arrive grouped by expert (``counts[e]`` rows each). Where the device and dtype support it the
whole group runs as one ``torch.nn.functional.grouped_mm`` (``torch._grouped_mm``; its docstring
in torch 2.13: bf16 on CUDA with SM >= 80, 16-byte aligned strides); elsewhere a Python loop over
experts, one matmul each. Both compute the same products; ``tests/test_grouped_gemm.py`` holds them
equal.
"""

from __future__ import annotations

import torch

from dayzero.runtime.device import has_grouped_gemm

IMPLS = ("auto", "loop", "grouped")


def _grouped_mm():
    import torch.nn.functional as F

    return getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def grouped_mm_supported(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``auto`` takes the grouped kernel for rows ``x`` (N, K) and weights ``w`` (E, O, K)."""
    if _grouped_mm() is None or x.dtype != torch.bfloat16 or w.dtype != torch.bfloat16:
        return False
    if not has_grouped_gemm(x.device):
        return False
    return x.shape[-1] % 8 == 0 and w.shape[-2] % 8 == 0  # 16-byte strides for bf16


class _ContiguousGrad(torch.autograd.Function):
    """Identity; hands its gradient on contiguous (grouped_mm's backward rejects expanded grads)."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


def grouped_linear(x: torch.Tensor, counts: list[int], w: torch.Tensor, impl: str = "auto") -> torch.Tensor:
    """(N, K) rows grouped by expert, ``w`` (E, O, K) -> (N, O): rows of expert e times ``w[e].T``."""
    if impl == "grouped" or (impl == "auto" and grouped_mm_supported(x, w)):
        offs = torch.tensor(counts, dtype=torch.int64, device=x.device).cumsum(0).to(torch.int32)
        return _ContiguousGrad.apply(_grouped_mm()(x.contiguous(), w.transpose(-2, -1), offs=offs))
    outs, start = [], 0
    for e, n in enumerate(counts):
        outs.append(x[start:start + n] @ w[e].t())
        start += n
    return torch.cat(outs) if outs else x.new_zeros(0, w.shape[-2])
