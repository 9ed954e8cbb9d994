"""Context parallelism by all-to-all (DeepSpeed-Ulysses, Jacobs et al. 2023, arXiv:2309.14509;
Megatron-LM ``--cp-comm-type a2a``): the planner's ``cp_comm`` "a2a".

Each of the cp ranks of a group holds one contiguous slice of every sequence of its micro-batch
(S / cp tokens: :meth:`dayzero.runtime.data.TokenStream.batch`), and everything outside the
attention core works on that slice alone; positions (RoPE, learned) start at the slice's offset
(``Transformer.position_offset``). Around each attention core, one all-to-all per q, k, v trades the
sequence for heads and one trades them back:

    q, k, v  (B, h, S/cp, d)  --all-to-all-->  (B, h/cp, S, d)   heads scattered, sequence gathered
    core over the whole sequence (causal, windowed, sinks: unchanged)
    out      (B, h/cp, S, dv) --all-to-all-->  (B, h, S/cp, dv)

``h`` is the heads one tensor-parallel rank holds (tp splits them first); query and key/value
heads must both divide by cp (``specs.layout_rules.ulysses_heads_ok``: with GQA, query chunk i uses
exactly key/value chunk i). The exchanges are autograd functions whose gradient is the reverse
exchange, so a rank's parameter gradients hold the contributions of every rank's loss through its
tokens; FSDP2 then reduces them over dp x cp (``mesh.Meshes.dp``). The exchanges sit outside the
core's module call (forward hooks), so selective recompute re-runs the core, not the exchanges.
Ring attention (``cp_comm`` p2p) is not here.
"""

from __future__ import annotations

import torch
from torch import nn

from dayzero.runtime.models.attention import CoreAttention
from dayzero.runtime.models.model import Transformer
from dayzero.runtime.models.moe import MoE
from dayzero.runtime.parallel.all_to_all import AllToAll


def sequence_to_heads(x: torch.Tensor, group, cp: int) -> torch.Tensor:
    """(B, h, S/cp, d) on each rank -> (B, h/cp, S, d): rank j receives head chunk j of every
    rank's sequence slice, in slice order."""
    return unpack_heads(_exchange(pack_heads(x, cp), group, cp), cp)


def heads_to_sequence(x: torch.Tensor, group, cp: int) -> torch.Tensor:
    """The inverse of :func:`sequence_to_heads`: (B, h/cp, S, d) -> (B, h, S/cp, d)."""
    return unpack_sequence(_exchange(pack_sequence(x, cp), group, cp), cp)


def _exchange(send: torch.Tensor, group, cp: int) -> torch.Tensor:
    """Block i of dim 0 goes to rank i; block i received came from rank i (its gradient: the reverse)."""
    n = send.shape[0] // cp
    return AllToAll.apply(send, [n] * cp, [n] * cp, group)


def pack_heads(x: torch.Tensor, cp: int) -> torch.Tensor:
    """(B, h, s, d) -> (cp * B, h/cp, s, d), block j holding head chunk j (sent to rank j)."""
    b, h, s, d = x.shape
    return x.reshape(b, cp, h // cp, s, d).transpose(0, 1).reshape(cp * b, h // cp, s, d)


def unpack_heads(recv: torch.Tensor, cp: int) -> torch.Tensor:
    """(cp * B, h/cp, s, d), block i rank i's slice -> (B, h/cp, cp * s, d), slices in order."""
    n, hc, s, d = recv.shape
    b = n // cp
    return recv.reshape(cp, b, hc, s, d).permute(1, 2, 0, 3, 4).reshape(b, hc, cp * s, d)


def pack_sequence(x: torch.Tensor, cp: int) -> torch.Tensor:
    """(B, h/cp, S, d) -> (cp * B, h/cp, S/cp, d), block j holding slice j (sent to rank j)."""
    b, hc, s_full, d = x.shape
    s = s_full // cp
    return x.reshape(b, hc, cp, s, d).permute(2, 0, 1, 3, 4).reshape(cp * b, hc, s, d)


def unpack_sequence(recv: torch.Tensor, cp: int) -> torch.Tensor:
    """(cp * B, h/cp, s, d), block i rank i's head chunk -> (B, h, s, d), chunks in order."""
    n, hc, s, d = recv.shape
    b = n // cp
    return recv.reshape(cp, b, hc, s, d).transpose(0, 1).reshape(b, cp * hc, s, d)


def head_chunk(t: torch.Tensor, rank: int, cp: int) -> torch.Tensor:
    """This rank's chunk of a per-head tensor (dim 0: heads), e.g. gpt-oss's attention sinks."""
    n = t.shape[0] // cp
    return t[rank * n:(rank + 1) * n]


def apply_context_parallel(model: Transformer, meshes, seq: int) -> int:
    """Make ``model`` (a whole model or one pipeline stage) run on slices of sequences of ``seq``
    tokens over the cp dim of ``meshes`` (:class:`~dayzero.runtime.parallel.mesh.Meshes`):
    positions from the slice's offset, every attention core between the two exchanges, and MoE
    routing statistics over the tp x cp ranks that hold one micro-batch. Returns how many cores
    were wrapped."""
    group, cp, rank = meshes.cp.get_group(), meshes.cp.size(), meshes.cp.get_local_rank()
    model.position_offset = rank * (seq // cp)
    for m in model.modules():
        if isinstance(m, MoE):
            m.stats_group, m.share_scale = meshes.micro_batch_group, cp
    cores = [m for m in model.modules() if isinstance(m, CoreAttention)]
    for core in cores:
        _exchange_around(core, group, cp, rank)
    return len(cores)


def _exchange_around(core: nn.Module, group, cp: int, rank: int) -> None:
    def before(_mod, args):
        q, k, v, *rest = args  # (q, k, v, sinks, docs) as the attention modules call the core
        if rest and rest[0] is not None:
            rest[0] = head_chunk(rest[0], rank, cp)
        return (*(sequence_to_heads(t, group, cp) for t in (q, k, v)), *rest)

    def after(_mod, _args, out):
        return heads_to_sequence(out, group, cp)

    core.register_forward_pre_hook(before)
    core.register_forward_hook(after)
