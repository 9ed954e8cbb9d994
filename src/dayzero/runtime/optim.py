"""AdamW (Loshchilov & Hutter 2019), linear warmup + cosine decay, and gradient-norm clipping that
is correct across every parallel dim.

The global norm is sqrt(sum over unique parameter shards of |g|^2). Each rank sums its local
shards, weighting a shard by 1 / (number of ranks holding a copy of it): copies come from the
Replicate dims of its DTensor placement and from every rank of the stage outside the DTensor's
mesh (e.g. a norm weight that tensor parallelism leaves replicated). One all-reduce over the
world then adds all stages. Single process, it is torch.nn.utils.clip_grad_norm_.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate


def build_optimizer(params, lr: float, weight_decay: float, betas=(0.9, 0.95), eps: float = 1e-8):
    """Decay matrices (and stacked experts), not norms and biases, as GPT-style recipes do.
    ``params``: parameters, or (name, parameter) pairs, which also keep the routed experts' stacked
    biases (``w1_bias``, 2-D) out of the decay.
    betas (0.9, 0.95): the Llama/GPT-3 pretraining setting (Touvron et al. 2023; Brown et al. 2020)."""
    groups: dict[tuple, list] = {}
    for item in params:
        name, p = item if isinstance(item, tuple) else ("", item)
        if p.requires_grad:
            decay = p.ndim >= 2 and not name.endswith("bias")
            # one group per (mesh, decay): DTensor's multi-tensor kernels need every tensor of a
            # call on the same mesh, and parameters live on several (dense, experts, router)
            mesh = p.device_mesh if isinstance(p, DTensor) else None
            groups.setdefault((id(mesh), decay), []).append(p)
    # fused: one kernel per tensor on CPU and CUDA (about 6x the for-loop update on one CPU core)
    return torch.optim.AdamW([{"params": ps, "weight_decay": weight_decay if decay else 0.0}
                              for (_, decay), ps in groups.items()], lr=lr, betas=betas, eps=eps, fused=True)


def lr_lambda(warmup: int, total: int, min_ratio: float):
    """Multiplier of the peak LR at step s (0-based): linear warmup to 1 over ``warmup`` steps, then
    cosine decay to ``min_ratio`` at ``total`` (Loshchilov & Hutter 2017)."""

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def build_scheduler(optimizer, warmup: int, total: int, min_ratio: float):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(warmup, total, min_ratio))


@torch.no_grad()
def clip_grad_norm_(params, max_norm: float, stage_size: int, world_group=None, uncounted=()) -> torch.Tensor:
    """Clip in place to ``max_norm`` (if > 0); returns the global norm before clipping (fp32).
    ``uncounted``: ids of parameters whose gradient another rank's copy already counts (a tied matrix
    held by several pipeline stages): clipped, not summed."""
    params = list(params)
    grads = [p.grad for p in params if p.grad is not None]
    device = grads[0].device if grads else torch.device("cpu")
    total = torch.zeros((), dtype=torch.float64, device=device)
    for g in (p.grad for p in params if p.grad is not None and id(p) not in uncounted):
        if isinstance(g, DTensor):
            mesh = g.device_mesh
            copies = stage_size // mesh.size()
            for dim, pl in enumerate(g.placements):
                if isinstance(pl, Replicate):
                    copies *= mesh.size(dim)
            local = g.to_local()
        else:
            copies, local = stage_size, g
        # one fused pass per tensor (fp32 accumulation inside the kernel), summed in fp64
        total += torch.linalg.vector_norm(local).double().square() / copies
    if dist.is_initialized() and dist.get_world_size(world_group) > 1:
        dist.all_reduce(total, group=world_group)
    norm = total.sqrt().float()
    if max_norm > 0:
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for g in grads:
            (g.to_local() if isinstance(g, DTensor) else g).mul_(coef.to(g.dtype))
    return norm
