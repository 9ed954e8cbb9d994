"""An expert placement in the expert-parallel dispatcher: slots per EP rank, hot experts replicated.

A placement (:mod:`dayzero.specs.placement`) gives each of the ``ep`` ranks ``S`` slots, each slot
one expert id; an expert in slots on several ranks is replicated (DeepSeek-V3's redundant experts,
arXiv 2412.19437 sec. 3.4). The experts' parameters stay where expert parallelism keeps them: the
DTensor sharded on the expert dim, expert ``e`` at its *home* rank ``e // (E / ep)``, so the
optimizer, gradient clipping and checkpoints (by global expert id) never see the placement, and a
checkpoint saved under one placement resumes under another or under none.

Each forward, every rank fetches its slots' weights from their home ranks (one all-to-all of the
weights, differentiable); in backward the reverse exchange returns every slot's gradient to the home
rank, where the gradients of an expert's replicas are summed. The replicas are copies of one tensor,
so they stay identical by construction. This trades the weight exchange per micro-batch (the size of
the non-home slots) for not keeping a second copy of the optimizer state.

Tokens: the rows a source rank routes to expert ``e`` (c of them, contiguous) are cut into
``n_e`` chunks (sizes c // n_e, the first c % n_e one larger); chunk ``j`` goes to replica
``(j + source rank) % n_e``: deterministic, and the remainders rotate over the replicas.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from dayzero.runtime.parallel.all_to_all import AllToAll, source_major_to_expert_major


class PlacedDispatch:
    """All-to-all dispatch onto placement slots (rank-major physical slots ``rank * S + slot``)."""

    def __init__(self, group, rank: int, slots: tuple[tuple[int, ...], ...], experts: int):
        self.group, self.rank, self.slots = group, rank, slots
        self.ep, self.per_rank, self.experts = len(slots), len(slots[0]), experts
        self.ranks = self.ep
        self.home_local = experts // self.ep  # experts per rank in the parameter's shard
        reps: list[list[int]] = [[] for _ in range(experts)]  # physical slots of each expert, rank order
        for r, ids in enumerate(slots):
            for j, e in enumerate(ids):
                reps[e].append(r * self.per_rank + j)
        width = max(len(r) for r in reps)
        self.n_rep = torch.tensor([len(r) for r in reps])
        self.rep_slots = torch.tensor([r + [r[0]] * (width - len(r)) for r in reps])  # (E, width), padded
        # the weight exchange: what this rank sends each peer (home experts, in the peer's slot
        # order) and where each received slot lands in this rank's slot order
        home = [e // self.home_local for e in range(experts)]
        self.w_send = [[e - rank * self.home_local for e in ids if home[e] == rank] for ids in slots]
        mine = slots[rank]
        recv_order = [j for h in range(self.ep) for j, e in enumerate(mine) if home[e] == h]
        self.w_recv_splits = [sum(home[e] == h for e in mine) for h in range(self.ep)]
        self.w_perm = torch.tensor(recv_order).argsort()  # received (home-major) -> slot order

    def _chunks(self, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(physical slot, rows) of each (expert, chunk): (E, width) each."""
        width = self.rep_slots.shape[1]
        n = self.n_rep.to(counts.device)
        j = torch.arange(width, device=counts.device).unsqueeze(0)  # chunk index
        q, rem = (counts // n).unsqueeze(1), (counts % n).unsqueeze(1)
        sizes = torch.where(j < n.unsqueeze(1), q + (j < rem).long(), torch.zeros_like(q))
        replica = (j + self.rank) % n.unsqueeze(1)
        return self.rep_slots.to(counts.device).gather(1, replica), sizes

    def slot_rows(self, counts: torch.Tensor) -> torch.Tensor:
        """Rows this rank sends to each physical slot: (ep * S,)."""
        phys, sizes = self._chunks(counts)
        return torch.zeros(self.ep * self.per_rank, dtype=counts.dtype, device=counts.device) \
            .index_add_(0, phys.reshape(-1), sizes.reshape(-1))

    def rank_rows(self, counts: torch.Tensor) -> torch.Tensor:
        """(token, slot) rows this rank sends to each EP rank: (ep,)."""
        return self.slot_rows(counts).view(self.ep, self.per_rank).sum(1)

    def slot_weights(self, local: tuple) -> tuple:
        """The expert weights of this rank's slots (S, ...) from the home ranks' ``local`` weights
        (``GroupedExperts.local_weights``, None staying None); differentiable: the gradient returns
        home and sums over replicas."""
        ws = [w for w in local if w is not None]
        flat = torch.cat([w.reshape(w.shape[0], -1) for w in ws], dim=1)  # (home experts, sum of sizes)
        send_idx = torch.tensor([i for ids in self.w_send for i in ids], dtype=torch.long, device=flat.device)
        send = flat.index_select(0, send_idx)
        got = AllToAll.apply(send, self.w_recv_splits, [len(ids) for ids in self.w_send], self.group)
        got = got.index_select(0, self.w_perm.to(flat.device))  # (S, sum of sizes)
        out, start = [], 0
        for w in ws:
            size = w[0].numel()
            out.append(got[:, start:start + size].reshape((self.per_rank,) + tuple(w.shape[1:])))
            start += size
        it = iter(out)
        return tuple(None if w is None else next(it) for w in local)

    def __call__(self, x_sorted: torch.Tensor, counts: torch.Tensor, experts) -> torch.Tensor:
        # x_sorted: (N, H) this rank's rows grouped by global expert; counts: (E,)
        ep, per = self.ep, self.per_rank
        phys, sizes = self._chunks(counts)
        row_slot = torch.repeat_interleave(phys.reshape(-1), sizes.reshape(-1), output_size=x_sorted.shape[0])
        perm = torch.argsort(row_slot, stable=True)  # rows grouped by physical slot
        send_counts = torch.bincount(row_slot, minlength=ep * per)
        recv = torch.empty_like(send_counts)
        dist.all_to_all_single(recv, send_counts, [per] * ep, [per] * ep, group=self.group)
        recv = recv.view(ep, per)  # recv[s, j]: rows rank s sends to my slot j
        send_splits = send_counts.view(ep, per).sum(1).tolist()
        recv_splits = recv.sum(1).tolist()
        xr = AllToAll.apply(x_sorted[perm], recv_splits, send_splits, self.group)  # ordered (source, slot)
        order = source_major_to_expert_major(recv)
        y = experts(xr[order], recv.sum(0).tolist(), remap=self.slot_weights)
        y = torch.empty_like(y).index_copy_(0, order, y)  # back to (source, slot) order
        y = AllToAll.apply(y, send_splits, recv_splits, self.group)
        return torch.empty_like(y).index_copy_(0, perm, y)  # back to this rank's expert order
