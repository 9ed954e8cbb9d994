"""Data parallelism and ZeRO through FSDP2 ``fully_shard`` (Rajbhandari et al. 2020; Zhao et al.
2023), with mixed precision: parameters kept sharded in fp32 (the master weights), gathered in
the compute dtype, gradients reduced in fp32.

    ZeRO-3  fully_shard, parameters re-gathered in backward (reshard_after_forward=True)
    ZeRO-2  fully_shard, parameters kept gathered from forward to backward; gradients and
            optimizer states sharded (reduce-scatter)
    ZeRO-1  run as ZeRO-2 (numerically identical; holds gradients sharded, i.e. less memory
            than a ZeRO-1 that keeps full gradients)
    ZeRO-0  no sharding: the replicate dim of a 2-D (replicate, shard=1) mesh, i.e. all-reduce

The policy is installed even at one rank whenever it casts (bf16), so compute precision never
depends on the layout; with one rank per stage and fp32 compute there is nothing to shard, reduce
or cast and ``parallelize`` leaves FSDP out.
Routed experts are reduced over their expert-data-parallel group and the router and shared
experts over the whole stage, but every gradient is divided by the data-parallel degree: a
token's gradient must count once however the ranks that saw it are grouped.
"""

from __future__ import annotations

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from dayzero.runtime.models.model import Transformer
from dayzero.specs.parallel import zero_shards


def apply_fsdp(model: Transformer, meshes, param_dtype: torch.dtype, zero: int, gloo: bool) -> list:
    """fully_shard every block (experts, router and shared experts on their own meshes first),
    then the root (embedding, final norm, head). Returns every FSDP module created."""
    reshard = zero_shards(zero, "weights")  # ZeRO-3: parameters stay sharded between uses
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    fp32 = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
    dp = meshes.parallel.dp * meshes.parallel.cp
    units = []

    def shard(module, mesh, policy, divide_by: int | None = None):
        fully_shard(module, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
        m = module[0] if isinstance(module, list) else module
        if divide_by is not None:
            m.set_gradient_divide_factor(float(divide_by))
        # gloo: guard against averaging inside its collectives (torch 2.13 on gloo; docs/runtime.md, FSDP2). Not where
        # the shard dim has one rank and a divide factor is set: no reduce-scatter runs there, and
        # torch 2.13's FSDP2 (_fsdp_collectives.foreach_reduce, its world_size == 1 branch) then
        # divides by the factor once while copying and again after the all-reduce, i.e. by its
        # square (routed experts with ep == dp: their gradients came out 1/dp too small)
        single_shard = mesh.size(mesh.ndim - 1) == 1 and divide_by is not None
        if gloo and not single_shard:
            m.set_force_sum_reduction_for_comms(True)
        units.append(m)

    for block in model.layers.values():
        moe = block.moe
        if moe is not None:
            shard(moe.experts, meshes.edp, mp, dp)
            shard(moe.router, meshes.mdp, fp32, dp)  # fp32 routing, as the HF references do
            shared = [m for m in (moe.shared, moe.shared_gate) if m is not None]
            if shared:
                shard(shared, meshes.mdp, mp, dp)
        shard(block, meshes.dp, mp)
    shard(model, meshes.dp, mp)
    return units
