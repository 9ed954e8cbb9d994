"""Mixture-of-experts layer: top-k router (softmax or sigmoid scoring, optional group-limited
selection and score-correction bias), routed experts stored as grouped weights, shared experts,
and the auxiliary balance loss.

Token movement goes through ``self.dispatcher``: :class:`LocalDispatch` runs every expert here;
expert parallelism swaps in an all-to-all dispatcher (:mod:`dayzero.runtime.parallel.expert_parallel`) without the layer
knowing. ``stats_group`` (set by tensor parallelism) is the process group whose ranks together
hold one micro-batch's tokens, so the balance loss sees the whole micro-batch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dayzero.runtime.models.mlp import MLP, activation
from dayzero.specs.model import MLPSpec, MoESpec


class GroupedExperts(nn.Module):
    """``experts`` SwiGLU experts as three stacked weights: w1, w3 (E, I, H) and w2 (E, H, I).
    Expert parallelism shards dim 0; the forward then sees only its local experts."""

    def __init__(self, experts: int, hidden: int, spec: MLPSpec):
        super().__init__()
        self.act = activation(spec.activation)
        self.w1 = nn.Parameter(torch.empty(experts, spec.intermediate, hidden))
        self.w2 = nn.Parameter(torch.empty(experts, hidden, spec.intermediate))
        self.w3 = nn.Parameter(torch.empty(experts, spec.intermediate, hidden)) if spec.gated else None

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        # x: (N, H) tokens grouped by local expert, counts[e] rows each -> (N, H)
        w1, w2, w3 = (_local(w) for w in (self.w1, self.w2, self.w3))
        outs, start = [], 0
        for e, n in enumerate(counts):
            xe = x[start:start + n]
            h = self.act(xe @ w1[e].t())
            if w3 is not None:
                h = h * (xe @ w3[e].t())
            outs.append(h @ w2[e].t())
            start += n
        return torch.cat(outs) if outs else x.new_zeros(0, x.shape[-1])


def _local(w):
    """The local shard of an expert-parallel DTensor weight (autograd flows through)."""
    return w.to_local() if w is not None and hasattr(w, "to_local") else w


class Router(nn.Module):
    """Scores in fp32 (a bf16 router flips near-tied choices), then top-k of scores + bias."""

    def __init__(self, hidden: int, spec: MoESpec):
        super().__init__()
        self.spec = spec
        self.gate = nn.Linear(hidden, spec.experts, bias=spec.router_bias)
        if spec.score_correction_bias:  # DeepSeek-V3 auxiliary-loss-free balancing (Wang et al. 2024)
            self.register_buffer("e_score_correction_bias", torch.zeros(spec.experts, dtype=torch.float32))
        else:
            self.e_score_correction_bias = None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # x: (T, H) -> weights (T, k) fp32, indices (T, k), probs (T, E) fp32
        s = self.spec
        bias = None if self.gate.bias is None else self.gate.bias.float()
        logits = F.linear(x.float(), self.gate.weight.float(), bias)
        probs = logits.sigmoid() if s.scoring == "sigmoid" else logits.softmax(dim=-1)
        choice = probs if self.e_score_correction_bias is None else probs + self.e_score_correction_bias
        if s.n_group > 1:  # keep only the best topk_group groups (by their top-2 score sum)
            t = choice.shape[0]
            grouped = choice.view(t, s.n_group, -1)
            group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1)[0].sum(-1)  # (T, groups)
            keep = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(s.topk_group, dim=-1)[1], 1.0)
            choice = choice.masked_fill(~keep.bool().unsqueeze(-1).expand_as(grouped).reshape(t, -1), float("-inf"))
        idx = choice.topk(s.top_k, dim=-1)[1]
        weights = probs.gather(1, idx)
        if s.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * s.routed_scaling_factor, idx, probs


class LocalDispatch:
    """Every expert lives here: hand the grouped tokens straight to the experts."""

    def __call__(self, x_sorted: torch.Tensor, counts: torch.Tensor, experts: GroupedExperts) -> torch.Tensor:
        return experts(x_sorted, counts.tolist())


class _InjectAuxGrad(torch.autograd.Function):
    """Identity on ``out``; in backward adds d(aux)/d(router) as if ``aux`` were added to the
    loss (the trick of Megatron's MoEAuxLossAutoScaler), so the balance loss needs no path
    through pipeline stages or the loss function."""

    @staticmethod
    def forward(ctx, out, aux):
        ctx.save_for_backward(aux)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        (aux,) = ctx.saved_tensors
        return grad_out, torch.ones_like(aux)


class MoE(nn.Module):
    def __init__(self, hidden: int, spec: MoESpec):
        super().__init__()
        self.spec = spec
        self.router = Router(hidden, spec)
        self.experts = GroupedExperts(spec.experts, hidden, spec.expert)
        shared = spec.shared_intermediate or (spec.shared_experts * spec.expert.intermediate)
        self.shared = MLP(hidden, spec.expert, shared) if spec.shared_experts else None
        self.shared_gate = nn.Linear(hidden, 1, bias=False) if spec.shared_experts and spec.shared_expert_gate else None
        self.dispatcher = LocalDispatch()
        self.stats_group = None  # ranks that split one micro-batch's tokens (tensor parallel)
        self.aux_loss_scale = 1.0  # set by the train loop: 1 / micro-batches, like the LM loss
        # routed tokens per expert since the last bias update (counts, not trained)
        self.register_buffer("tokens_per_expert", torch.zeros(spec.experts, dtype=torch.float32), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bs, seq, hidden = x.shape  # (B, S_local, H)
        xf = x.reshape(-1, hidden)  # (T, H)
        weights, idx, probs = self.router(xf)
        k = idx.shape[1]
        flat = idx.reshape(-1)  # (T*k,) expert of each (token, slot)
        counts = torch.bincount(flat, minlength=self.spec.experts)
        with torch.no_grad():
            self.tokens_per_expert += counts.float()
        order = torch.argsort(flat, stable=True)
        token_of = order // k
        y = self.dispatcher(xf[token_of], counts, self.experts)  # (T*k, H) grouped by expert
        return self.combine(xf, y, weights, order, probs, counts).view(bs, seq, hidden)

    def combine(self, xf: torch.Tensor, y: torch.Tensor, weights: torch.Tensor, order: torch.Tensor,
                probs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Weight the experts' outputs ``y`` (rows grouped by expert in ``order``), sum each token's
        k rows, add the shared experts, and attach the balance loss's gradient: (T, H)."""
        k = weights.shape[1]
        token_of = order // k
        y = y * weights.reshape(-1)[order].unsqueeze(-1).to(y.dtype)
        out = torch.zeros_like(xf).index_add_(0, token_of, y.to(xf.dtype))
        if self.shared is not None:
            s = self.shared(xf)
            out = out + (s * torch.sigmoid(self.shared_gate(xf)) if self.shared_gate is not None else s)
        if self.training and self.spec.aux_loss_coef > 0 and torch.is_grad_enabled():
            out = _InjectAuxGrad.apply(out, self._balance_loss(probs, counts, k) * self.aux_loss_scale)
        return out

    def _balance_loss(self, probs: torch.Tensor, counts: torch.Tensor, k: int) -> torch.Tensor:
        """Switch-style balance loss coef * E * sum_i f_i * P_i over the micro-batch (Fedus et al.
        2021): f_i the fraction of routed slots to expert i, P_i its mean router probability. When
        tensor parallelism splits the micro-batch's tokens, counts are summed over the group and
        each rank contributes its tokens' share of P, so the gradient is the unsplit one."""
        tokens = torch.tensor(float(probs.shape[0]), device=probs.device)
        counts = counts.float()
        if self.stats_group is not None:
            stats = torch.cat([counts, tokens.view(1)])
            dist.all_reduce(stats, group=self.stats_group)
            counts, tokens = stats[:-1], stats[-1]
        f = counts / (tokens * k)
        return self.spec.aux_loss_coef * self.spec.experts * (f * probs.sum(0)).sum() / tokens
