"""Mixture-of-experts layer: top-k router (softmax or sigmoid scoring, optional group-limited
selection and score-correction bias), routed experts stored as grouped weights, shared experts,
and the router's auxiliary losses.

Token movement goes through ``self.dispatcher``: :class:`LocalDispatch` runs every expert here;
expert parallelism swaps in an all-to-all dispatcher (:mod:`dayzero.runtime.parallel.expert_parallel`,
or :mod:`~dayzero.runtime.parallel.expert_placement` with a placement) without the layer knowing.
``stats_group`` (set by tensor and context parallelism) is the process group whose ranks together
hold one micro-batch's tokens, so the balance losses see the whole micro-batch; ``batch_group`` (set
by the train loop) holds every rank of the stage, for the global-batch balance loss.

:class:`Routing` holds the run's routing options (``dayzero train --moe-*``): the auxiliary loss,
the router z-loss and the capacity factor. Routed slots per expert, dropped slots and rows per EP
rank accumulate in the layer's counters until the train loop reads them after the step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dayzero.runtime.models.grouped_gemm import grouped_linear
from dayzero.runtime.models.mlp import MLP, activation, gated
from dayzero.specs.model import MLPSpec, MoESpec

AUX_LOSSES = ("none", "seq", "global", "micro")


@dataclass(frozen=True)
class Routing:
    """How a layer balances and caps its routing (``dayzero train --moe-aux-loss ...``).

    aux_loss: ``seq`` DeepSeek-V3's sequence-wise balance loss (arXiv 2412.19437, eq. 17-20);
    ``micro`` the Switch balance loss over each micro-batch (Fedus et al. 2021, eq. 4); ``global``
    the same with the expert fractions counted over every rank of the stage (the global-batch
    balance loss of Qiu et al. 2025, arXiv 2501.11873); ``none``. z_loss: the router z-loss
    coefficient (ST-MoE, Zoph et al. 2022, arXiv 2202.08906, eq. 5). capacity_factor: None is
    dropless; else each expert takes at most ceil(T k / E * factor) of a micro-batch's T tokens
    (Megatron-Core ``get_capacity``), keeping its highest-probability slots."""

    aux_loss: str = "none"
    aux_coef: float = 0.0
    z_loss: float = 0.0
    capacity_factor: float | None = None

    @classmethod
    def of_spec(cls, spec: MoESpec) -> "Routing":
        """What the model's config asks for: a micro-batch balance loss with its coefficient."""
        return cls("micro", spec.aux_loss_coef) if spec.aux_loss_coef > 0 else cls()


class GroupedExperts(nn.Module):
    """``experts`` gated experts as stacked weights: w1 (gate), w3 (up) (E, I, H) and w2 (down) (E, H, I),
    with per-expert biases w1_bias, w3_bias (E, I) and w2_bias (E, H) when the spec has them (gpt-oss).
    Expert parallelism shards dim 0 of every one; the forward then sees only its local experts."""

    def __init__(self, experts: int, hidden: int, spec: MLPSpec):
        super().__init__()
        self.act = gated(spec) if spec.gated else activation(spec.activation)
        inter = spec.intermediate
        self.w1 = nn.Parameter(torch.empty(experts, inter, hidden))
        self.w2 = nn.Parameter(torch.empty(experts, hidden, inter))
        self.w3 = nn.Parameter(torch.empty(experts, inter, hidden)) if spec.gated else None
        self.w1_bias = nn.Parameter(torch.empty(experts, inter)) if spec.bias else None
        self.w2_bias = nn.Parameter(torch.empty(experts, hidden)) if spec.bias else None
        self.w3_bias = nn.Parameter(torch.empty(experts, inter)) if spec.bias and spec.gated else None
        self.impl = "auto"  # grouped_gemm.IMPLS: grouped kernel where supported, else the loop

    def local_weights(self) -> tuple:
        """(w1, w2, w3, w1_bias, w2_bias, w3_bias) of the experts this rank holds (None where absent)."""
        return tuple(_local(w) for w in (self.w1, self.w2, self.w3, self.w1_bias, self.w2_bias, self.w3_bias))

    def forward(self, x: torch.Tensor, counts: list[int], remap=None) -> torch.Tensor:
        # x: (N, H) tokens grouped by expert, counts[e] rows each -> (N, H). ``remap`` maps the local
        # weights to the weights the rows' groups use (a placement's slots); it runs here, inside
        # the module's forward, where FSDP has gathered the weights
        w1, w2, w3, b1, b2, b3 = self.local_weights() if remap is None else remap(self.local_weights())

        def linear(h, w, b):
            y = grouped_linear(h, counts, w, self.impl)
            return y if b is None else y + _rows_bias(b, counts, y.shape[0])

        g = linear(x, w1, b1)
        h = self.act(g, linear(x, w3, b3)) if w3 is not None else self.act(g)
        return linear(h, w2, b2)


def _rows_bias(b: torch.Tensor, counts: list[int], rows: int) -> torch.Tensor:
    """Per-expert biases ``b`` (E, O) repeated over each expert's ``counts[e]`` rows: (rows, O)."""
    reps = torch.tensor(counts, dtype=torch.long, device=b.device)
    return torch.repeat_interleave(b, reps, dim=0, output_size=rows)


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

    def forward(self, x: torch.Tensor, with_logits: bool = False) -> tuple[torch.Tensor, ...]:
        # x: (T, H) -> weights (T, k) fp32, indices (T, k), probs (T, E) fp32 [, logits (T, E) fp32]
        # (called as the module, not a method: FSDP gathers the gate's weight in its forward hook)
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
        out = weights * s.routed_scaling_factor, idx, probs
        return out + (logits,) if with_logits else out


class LocalDispatch:
    """Every expert lives here: hand the grouped tokens straight to the experts."""

    ranks = 1

    def __call__(self, x_sorted: torch.Tensor, counts: torch.Tensor, experts: GroupedExperts) -> torch.Tensor:
        return experts(x_sorted, counts.tolist())

    def rank_rows(self, counts: torch.Tensor) -> torch.Tensor:
        """(token, slot) rows this rank sends to each EP rank: (ranks,)."""
        return counts.sum().view(1)


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
        self.routing = Routing.of_spec(spec)
        self.stats_group = None  # ranks that split one micro-batch's tokens (tensor x context parallel)
        # context parallelism: each cp rank's LM loss is the mean over its slice and the gradient
        # reduction divides by dp x cp, so a rank's share of a micro-batch's router loss counts cp
        # times to match (set by context parallelism; the global loss scales by grad_divisor instead)
        self.share_scale = 1
        self.batch_group = None  # every rank of the stage (global-batch balance loss); set by the train loop
        self.grad_divisor = 1  # data-parallel degree the router's gradients are divided by (global loss)
        self.aux_loss_scale = 1.0  # set by the train loop: 1 / micro-batches, like the LM loss
        # since the last reset (counts, not trained): routed slots per expert, dropped slots, and
        # rows sent to each EP rank (sized by the dispatcher)
        self.register_buffer("tokens_per_expert", torch.zeros(spec.experts, dtype=torch.float32), persistent=False)
        self.register_buffer("dropped_slots", torch.zeros((), dtype=torch.float32), persistent=False)
        self.rows_per_rank: torch.Tensor | None = None

    @torch.no_grad()
    def reset_counts(self) -> None:
        self.tokens_per_expert.zero_()
        self.dropped_slots.zero_()
        self.rows_per_rank = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bs, seq, hidden = x.shape  # (B, S_local, H)
        xf = x.reshape(-1, hidden)  # (T, H)
        weights, idx, probs, logits = self.router(xf, with_logits=True)
        k = idx.shape[1]
        flat = idx.reshape(-1)  # (T*k,) expert of each (token, slot)
        routed = torch.bincount(flat, minlength=self.spec.experts)
        order, counts = self._dispatch_order(flat, weights, routed, k)
        with torch.no_grad():
            self.tokens_per_expert += routed.float()
            self.dropped_slots += (routed - counts).sum().float()
            rows = self.dispatcher.rank_rows(counts).float()
            self.rows_per_rank = rows if self.rows_per_rank is None else self.rows_per_rank + rows
        token_of = order // k
        y = self.dispatcher(xf[token_of], counts, self.experts)  # (kept rows, H) grouped by expert
        out = self.combine(xf, y, weights, order, probs, routed, logits=logits, idx=idx, batch=bs)
        return out.view(bs, seq, hidden)

    def _dispatch_order(self, flat: torch.Tensor, weights: torch.Tensor, routed: torch.Tensor,
                        k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows to run, grouped by expert; kept rows per expert). Dropless keeps every row; with a
        capacity factor each expert keeps its ``capacity`` highest-weight rows (Megatron-Core's
        ``probs`` drop policy) and the dropped slots pass through the residual only."""
        cf = self.routing.capacity_factor
        if cf is None:
            return torch.argsort(flat, stable=True), routed
        # no expert receives more than every routed slot, however large the factor
        capacity = min(flat.numel(), math.ceil(flat.numel() / self.spec.experts * cf))
        by_weight = torch.argsort(weights.detach().reshape(-1), descending=True, stable=True)
        order = by_weight[torch.argsort(flat[by_weight], stable=True)]  # by expert, heaviest first
        starts = torch.cumsum(routed, 0) - routed
        rank_in_expert = torch.arange(order.numel(), device=flat.device) - starts[flat[order]]
        return order[rank_in_expert < capacity], routed.clamp(max=capacity)

    def combine(self, xf: torch.Tensor, y: torch.Tensor, weights: torch.Tensor, order: torch.Tensor,
                probs: torch.Tensor, counts: torch.Tensor, logits: torch.Tensor | None = None,
                idx: torch.Tensor | None = None, batch: int = 1) -> torch.Tensor:
        """Weight the experts' outputs ``y`` (rows grouped by expert in ``order``), sum each token's
        k rows, add the shared experts, and attach the router losses' gradient: (T, H). ``counts``
        are the routed slots per expert (before any dropping); ``batch`` sequences make up the T
        tokens and ``idx`` (T, k) are their chosen experts (the sequence-wise loss)."""
        k = weights.shape[1]
        token_of = order // k
        y = y * weights.reshape(-1)[order].unsqueeze(-1).to(y.dtype)
        out = torch.zeros_like(xf).index_add_(0, token_of, y.to(xf.dtype))
        if self.shared is not None:
            s = self.shared(xf)
            out = out + (s * torch.sigmoid(self.shared_gate(xf)) if self.shared_gate is not None else s)
        if self.training and torch.is_grad_enabled():
            loss = self._router_loss(probs, counts, idx if idx is not None else order.new_zeros(0, k), logits, batch)
            if loss is not None:
                out = _InjectAuxGrad.apply(out, loss * self.aux_loss_scale)
        return out

    def _router_loss(self, probs: torch.Tensor, counts: torch.Tensor, idx: torch.Tensor,
                     logits: torch.Tensor | None, batch: int) -> torch.Tensor | None:
        r, losses, k = self.routing, [], idx.shape[1]
        if r.aux_coef > 0 and r.aux_loss == "micro":
            losses.append(self._balance_loss(probs, counts, k, r.aux_coef, self.stats_group) * self.share_scale)
        elif r.aux_coef > 0 and r.aux_loss == "global":
            loss = self._balance_loss(probs, counts, k, r.aux_coef, self.batch_group or self.stats_group)
            losses.append(loss * (self.grad_divisor if self.batch_group is not None else self.share_scale))
        elif r.aux_coef > 0 and r.aux_loss == "seq" and idx.shape[0] == probs.shape[0]:
            losses.append(self._sequence_loss(probs, idx, batch) * self.share_scale)
        if r.z_loss > 0 and logits is not None:
            losses.append(self._z_loss(logits) * self.share_scale)
        return sum(losses) if losses else None

    def _token_total(self, local: float, device) -> torch.Tensor:
        tokens = torch.tensor(local, device=device)
        if self.stats_group is not None:
            dist.all_reduce(tokens, group=self.stats_group)
        return tokens

    def _balance_loss(self, probs: torch.Tensor, counts: torch.Tensor, k: int, coef: float,
                      group) -> torch.Tensor:
        """Switch-style balance loss coef * E * sum_i f_i * P_i (Fedus et al. 2021): f_i the fraction
        of routed slots to expert i, P_i its mean router probability, both over the tokens of
        ``group`` (this micro-batch's tensor-parallel ranks, or every rank of the stage for the
        global-batch loss). Counts are summed over the group and each rank contributes its tokens'
        share of P, so the gradient summed over the group is the unsplit one."""
        tokens = torch.tensor(float(probs.shape[0]), device=probs.device)
        counts = counts.float()
        if group is not None:
            stats = torch.cat([counts, tokens.view(1)])
            dist.all_reduce(stats, group=group)
            counts, tokens = stats[:-1], stats[-1]
        f = counts / (tokens * k)
        return coef * self.spec.experts * (f * probs.sum(0)).sum() / tokens

    def _sequence_loss(self, probs: torch.Tensor, idx: torch.Tensor, batch: int) -> torch.Tensor:
        """DeepSeek-V3's complementary sequence-wise balance loss (arXiv 2412.19437, eq. 17-20):
        per sequence, alpha * sum_i f_i P_i with f_i = E / (k T) * (slots of the sequence routed to
        i), P_i = mean over its T tokens of the normalised affinity s_i / sum_j s_j; averaged over
        the micro-batch's sequences. Under tensor parallelism each rank holds a shard of every
        sequence: counts and token counts are summed over ``stats_group``."""
        e, k = self.spec.experts, idx.shape[1]
        per_seq = probs.view(batch, -1, e)  # (B, S_local, E)
        sel = torch.zeros_like(per_seq).scatter_(2, idx.view(batch, -1, k), 1.0).sum(1)  # (B, E) slots
        tokens = torch.full((batch, 1), float(per_seq.shape[1]), device=probs.device)
        if self.stats_group is not None:
            stats = torch.cat([sel, tokens], dim=1)
            dist.all_reduce(stats, group=self.stats_group)
            sel, tokens = stats[:, :-1], stats[:, -1:]
        f = sel * e / (k * tokens)
        s_norm = per_seq / (per_seq.sum(-1, keepdim=True) + 1e-20)
        p = s_norm.sum(1) / tokens  # this rank's tokens' share of P
        return self.routing.aux_coef * (f * p).sum(1).mean()

    def _z_loss(self, logits: torch.Tensor) -> torch.Tensor:
        """Router z-loss coef * mean_t (logsumexp_j logits_tj)^2 (ST-MoE, Zoph et al. 2022, eq. 5),
        the mean over the micro-batch's tokens (all tensor-parallel shards)."""
        tokens = self._token_total(float(logits.shape[0]), logits.device)
        return self.routing.z_loss * torch.logsumexp(logits, dim=-1).square().sum() / tokens
