"""Tensor parallelism with optional sequence parallelism (Megatron-LM, Shoeybi et al. 2019;
Korthikanti et al. 2022) as DTensor plans over the ``tp`` mesh dim.

Per block: q/k/v (or MLA's up-projections) and w1/w3 column-wise, wo and w2 row-wise, so each
attention and MLP costs one all-reduce forward and one backward (without SP), or one all-gather +
one reduce-scatter (with SP, where norms and residuals run on sequence shards). Embedding is
vocab-parallel (row-wise), the head column-wise with logits left sharded over the vocabulary for
the vocab-parallel cross-entropy (``loss_parallel``). MoE blocks take their tokens as sequence
shards (each tp rank routes a different part of the micro-batch; ``expert_parallel.py``).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.distributed.tensor.parallel.style import ParallelStyle

from dayzero.runtime.models.attention import MultiHeadLatentAttention
from dayzero.runtime.models.model import Transformer


class ReplicatedInput(ParallelStyle):
    """A replicated activation consumed by rank-local work (e.g. MLA's rotary key, used by each
    rank's own heads): identity forward, gradient summed over the tp group in backward (Megatron's
    "copy to tensor-parallel region")."""

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        def hook(_mod, args):
            x = DTensor.from_local(args[0], device_mesh, [Replicate()], run_check=False)
            return (x.to_local(grad_placements=[Partial()]),) + tuple(args[1:])

        module.register_forward_pre_hook(hook)
        return module


class ReplicatedKV(ParallelStyle):
    """With fewer KV heads than tp ranks (GQA, tp % kv_heads == 0), every rank computes all KV
    heads from a replicated wk / wv and keeps the one its query heads use (Megatron replicates KV
    heads the same way). The projection's output gradient is summed over the tp group, so the
    replicated weight sees every rank's heads."""

    def __init__(self, kv_heads: int, head_dim: int):
        super().__init__()
        self.kv_heads, self.head_dim = kv_heads, head_dim

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        tp, rank = device_mesh.size(), device_mesh.get_local_rank()
        head = rank // (tp // self.kv_heads)  # query heads of this rank use this KV head
        lo, hi = head * self.head_dim, (head + 1) * self.head_dim

        def hook(_mod, _args, out):
            full = DTensor.from_local(out, device_mesh, [Replicate()], run_check=False)
            return full.to_local(grad_placements=[Partial()])[..., lo:hi]

        module.register_forward_hook(hook)
        return module


def apply_tensor_parallel(model: Transformer, tp_mesh, sequence_parallel: bool) -> None:
    """Shard ``model`` (a whole model or one pipeline stage) over ``tp_mesh`` in place."""
    sp = sequence_parallel
    act = Shard(1) if sp else Replicate()  # layout of the residual stream between blocks
    top = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=act)
        if model.pos_embeddings is not None:
            top["pos_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=act)
    if model.norm is not None and sp:
        top["norm"] = SequenceParallel()
    if model.output is not None:
        top["output"] = ColwiseParallel(input_layouts=act, output_layouts=Shard(-1), use_local_output=False)
    if top:
        parallelize_module(model, tp_mesh, top)

    for block in model.layers.values():
        plan = {}
        if sp:
            plan["attention_norm"] = SequenceParallel()
            plan["ffn_norm"] = SequenceParallel()
        att = block.attention
        mla = isinstance(att, MultiHeadLatentAttention)
        kv_replicated = not mla and att.wk.out_features // att.head_dim < tp_mesh.size()
        # GQA's input feeds only column-parallel layers: hand them one DTensor so their input
        # gradients are reduced once (all-reduce, or reduce-scatter with SP) at this boundary.
        # MLA's replicated down-projections (and replicated KV heads) need a plain tensor; each
        # sharded projection then reduces its own input gradient.
        plan["attention"] = PrepareModuleInput(input_layouts=(act, None, None),
                                               desired_input_layouts=(Replicate(), None, None),
                                               use_local_output=mla or kv_replicated)
        if mla:
            # the low-rank down-projections and their norms stay replicated (small, see MLA paper)
            plan["attention.wq" if att.wq is not None else "attention.wq_b"] = ColwiseParallel()
            plan["attention.wkv_b"] = ColwiseParallel()
            plan["attention.shared_key"] = ReplicatedInput()
        elif kv_replicated:
            kv_heads = att.wk.out_features // att.head_dim
            plan.update({"attention.wq": ColwiseParallel(),
                         "attention.wk": ReplicatedKV(kv_heads, att.head_dim),
                         "attention.wv": ReplicatedKV(kv_heads, att.v_head_dim)})
        else:
            plan.update({"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
                         "attention.wv": ColwiseParallel()})
        if not mla and att.q_norm is not None:
            # per-head norms see only this rank's heads: treat "heads" (dim 2) as the sharded dim
            # so their replicated weights get gradients summed over the group
            plan["attention.q_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
            plan["attention.k_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
        plan["attention.wo"] = RowwiseParallel(output_layouts=act)
        if block.mlp is not None:
            plan["mlp"] = PrepareModuleInput(input_layouts=(act,), desired_input_layouts=(Replicate(),))
            plan.update({"mlp.w1": ColwiseParallel(), "mlp.w2": RowwiseParallel(output_layouts=act)})
            if block.mlp.w3 is not None:
                plan["mlp.w3"] = ColwiseParallel()
        else:
            # routed + shared experts work on this rank's sequence shard; see expert_parallel.py
            plan["moe"] = PrepareModuleInputOutput(
                input_layouts=(act,), desired_input_layouts=(Shard(1),), use_local_input=True,
                output_layouts=(Shard(1),), desired_output_layouts=(act,), use_local_output=True)
            block.moe.stats_group = tp_mesh.get_group()
        parallelize_module(block, tp_mesh, plan)
        if not mla and att.sinks is not None:  # one sink per query head: sharded like wq's heads
            dt = distribute_tensor(att.sinks.data, tp_mesh, [Shard(0)], src_data_rank=None)
            att.sinks = nn.Parameter(dt, requires_grad=att.sinks.requires_grad)
