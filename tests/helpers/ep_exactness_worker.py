"""Run by tests/runtime/parallel/test_runtime_ep.py on 4 gloo ranks (not collected by pytest): an MoE layer with
experts sharded 4 ways and tokens exchanged by all-to-all equals the same layer with every expert
local, in float64 (so any difference above rounding is a bug, not noise)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import torch
import torch.distributed as dist

from dayzero.runtime.models.model import Transformer, initial_value
from dayzero.runtime.parallel.expert_parallel import apply_expert_parallel
from dayzero.runtime.parallel.mesh import build_meshes
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model


def build(spec):
    m = Transformer(spec, 16)
    with torch.no_grad():
        for n, p in m.named_parameters():
            p.copy_(initial_value(n, tuple(p.shape), 0))
        for n, b in m.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=torch.Generator().manual_seed(3)) * 0.01)
    return m.layers["1"].moe, m


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_default_dtype(torch.float64)
    spec = load_model("tiny-moe").shrink(layers=2)  # layer 0 dense, layer 1 MoE
    spec = replace(spec, moe=replace(spec.moe, aux_loss_coef=0.01))  # exercise the balance loss too
    ref, _ = build(spec)
    x = torch.randn(world, 2, 16, spec.hidden, generator=torch.Generator().manual_seed(1))
    want = []
    for i in range(world):  # every rank's tokens as one micro-batch, all experts here
        y = ref(x[i])
        (y * (i + 1)).sum().backward()
        want.append(y.detach())
    moe, model = build(spec)
    meshes = build_meshes(ParallelConfig(ep=world, dp=world, seq=16), "cpu")
    apply_expert_parallel(model, meshes.ep)
    y = moe(x[rank])
    (y * (rank + 1)).sum().backward()
    err = {"out": (y.detach() - want[rank]).abs().max().item()}
    local = spec.moe.experts // world
    ref_params = dict(ref.named_parameters())
    for n, p in moe.named_parameters():
        if n.startswith("experts."):
            g, r = p.grad.to_local(), ref_params[n].grad[rank * local:(rank + 1) * local]
        else:  # router and shared experts: every rank saw different tokens; sum them
            g = p.grad.clone()
            dist.all_reduce(g)
            r = ref_params[n].grad
        err[n] = ((g - r).abs().max() / r.abs().max().clamp_min(1e-30)).item()
    errs = [None] * world
    dist.all_gather_object(errs, err)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(errs, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
