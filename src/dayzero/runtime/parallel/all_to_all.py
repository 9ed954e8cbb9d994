"""The token exchange of expert parallelism: ``all_to_all_single`` with explicit split sizes as an
autograd function (its gradient is the reverse exchange), and the row permutation between the
[source rank][expert] order the exchange delivers and the [expert][source rank] order the grouped
expert GEMMs read. Used by the expert-parallel dispatcher and by the placed one."""

from __future__ import annotations

import torch
import torch.distributed as dist


class AllToAll(torch.autograd.Function):
    """all_to_all_single with split sizes; its gradient is the reverse exchange."""

    @staticmethod
    def forward(ctx, x, out_splits: list[int], in_splits: list[int], group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        g = grad.new_empty((sum(in_splits),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(g, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return g, None, None, None


def source_major_to_expert_major(counts: torch.Tensor) -> torch.Tensor:
    """Row permutation taking rows laid out [source][expert] to [expert][source]."""
    ep, local = counts.shape
    flat = counts.reshape(-1)
    starts = torch.cumsum(flat, 0) - flat  # where each (source, expert) run starts
    order = torch.arange(ep * local, device=counts.device).view(ep, local).t().reshape(-1)
    lens, seg_starts = flat[order], starts[order]
    new_starts = torch.cumsum(lens, 0) - lens
    n = int(lens.sum())
    return torch.repeat_interleave(seg_starts - new_starts, lens, output_size=n) + torch.arange(n, device=counts.device)
