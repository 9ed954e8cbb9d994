"""Expert parallelism (GShard, Lepikhin et al. 2020): routed experts sharded over the ``ep`` dim of
the expert mesh view, tokens sent to their experts' ranks with ``all_to_all_single`` and explicit
split sizes, and sent back the same way.

Inside an MoE layer every rank of a stage holds different tokens (data parallel ranks hold
different sequences, tensor parallel ranks different sequence shards), so the routed experts are
data parallel over the ``edp`` ranks that hold the same experts, and the router and shared
experts are data parallel over the whole stage (``data_parallel.py`` reduces them accordingly).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import Shard, distribute_tensor

from dayzero.runtime.models.model import Transformer
from dayzero.runtime.parallel.all_to_all import AllToAll, source_major_to_expert_major


class AllToAllDispatch:
    """Send each token to the rank holding its expert, run the local experts, send results back."""

    def __init__(self, group, ep: int, experts: int):
        self.group, self.ep, self.local = group, ep, experts // ep
        self.ranks = ep

    def rank_rows(self, counts: torch.Tensor) -> torch.Tensor:
        """(token, slot) rows this rank sends to each EP rank: (ep,)."""
        return counts.view(self.ep, self.local).sum(1)

    def __call__(self, x_sorted: torch.Tensor, counts: torch.Tensor, experts) -> torch.Tensor:
        # x_sorted: (N, H) this rank's (token, slot) rows grouped by global expert; counts: (E,)
        ep, local = self.ep, self.local
        recv = torch.empty_like(counts)
        dist.all_to_all_single(recv, counts, [local] * ep, [local] * ep, group=self.group)
        recv = recv.view(ep, local)  # recv[s, j]: rows rank s sends to my local expert j
        send_splits = counts.view(ep, local).sum(1).tolist()
        recv_splits = recv.sum(1).tolist()
        xr = AllToAll.apply(x_sorted, recv_splits, send_splits, self.group)  # ordered (source, expert)
        perm = source_major_to_expert_major(recv)
        y = experts(xr[perm], recv.sum(0).tolist())  # grouped by local expert
        y = torch.empty_like(y).index_copy_(0, perm, y)  # back to (source, expert) order
        return AllToAll.apply(y, send_splits, recv_splits, self.group)


def apply_expert_parallel(model: Transformer, ep_mesh, placement=None) -> None:
    """Turn routed-expert weights into DTensors sharded on dim 0 (the expert index) over
    ``ep_mesh`` (also at ep 1, so checkpoints always see global expert tensors), and swap in
    the all-to-all dispatcher when experts are split, or the placed dispatcher
    (:mod:`~dayzero.runtime.parallel.expert_placement`) for a ``dayzero.specs.placement.Placement``."""
    ep = ep_mesh.size()
    for key, block in model.layers.items():  # keyed by global layer index
        if block.moe is None:
            continue
        experts = block.moe.experts
        for name, p in list(experts.named_parameters(recurse=False)):
            dt = distribute_tensor(p.data, ep_mesh, [Shard(0)], src_data_rank=None)
            experts.register_parameter(name, nn.Parameter(dt, requires_grad=p.requires_grad))
        if placement is not None:
            from dayzero.runtime.parallel.expert_placement import PlacedDispatch

            block.moe.dispatcher = PlacedDispatch(ep_mesh.get_group(), ep_mesh.get_local_rank(),
                                                  placement.slots(int(key)), block.moe.spec.experts)
        elif ep > 1:
            block.moe.dispatcher = AllToAllDispatch(ep_mesh.get_group(), ep, block.moe.spec.experts)
