"""A small model trained with tensor parallel (DTensor), FSDP2 and a hand-rolled two-stage
pipeline, to exercise dayzero checkpoints on gloo independently of the full runtime.

Run under torchrun (``torchrun --nproc-per-node 8 tests/helpers/ckpt_toy.py --tp 2 --pp 2 ...``) or as a
single plain process (no torch.distributed at all). Rank 0 appends one JSON line per step
(``{"step", "loss", "attempt"}``) and every event to ``--metrics``.

The model is built whole from the seed on every rank, then each pipeline stage drops the blocks it
does not own, so parameter names (and initial values) are the same at every layout.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from dayzero.runtime.distributed import init_process_group, restart_attempt
from dayzero.runtime.resilience.faults import FaultSpec
from dayzero.runtime.resilience.guards import GuardConfig
from dayzero.runtime.resilience.loop import Resilience, ResilienceConfig

HIDDEN = 32


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(HIDDEN, 4 * HIDDEN)
        self.w2 = nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x):  # (B, H) -> (B, H)
        return x + self.w2(torch.tanh(self.w1(x)))


class Net(nn.Module):
    def __init__(self, layers: int):
        super().__init__()
        self.inp = nn.Linear(HIDDEN, HIDDEN)
        self.blocks = nn.ModuleDict({str(i): Block() for i in range(layers)})
        self.out = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x):
        if self.inp is not None:
            x = self.inp(x)
        for b in self.blocks.values():
            x = b(x)
        return self.out(x) if self.out is not None else x


def build(args, mesh):
    torch.manual_seed(args.seed)
    net = Net(args.layers)
    if mesh is None:
        return net, 0
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    stage = mesh.get_local_rank("pp")
    per = args.layers // args.pp
    for i in list(net.blocks):
        if not stage * per <= int(i) < (stage + 1) * per:
            del net.blocks[i]
    if stage != 0:
        net.inp = None
    if stage != args.pp - 1:
        net.out = None
    for b in net.blocks.values():
        parallelize_module(b, mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
        fully_shard(b, mesh=mesh["dp"])
        b.set_force_sum_reduction_for_comms(True)
    fully_shard(net, mesh=mesh["dp"])
    net.set_force_sum_reduction_for_comms(True)
    return net, stage


def batch(args, b: int):
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + b)
    x = torch.randn(args.gbs, HIDDEN, generator=g)
    y = torch.randn(args.gbs, HIDDEN, generator=g)
    if b in args.poison:
        x = x * 1e4  # a spike the loss guard must catch
    return x, y


def train_step(args, net, mesh, stage, x, y):
    """Forward/backward on this rank's share; returns the global mean loss (same on all ranks)."""
    if mesh is None:
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        return loss.item()
    dp, tp = mesh["dp"].size(), mesh["tp"].size()
    i = mesh.get_local_rank("dp")
    mb = args.gbs // dp
    x, y = x[i * mb:(i + 1) * mb], y[i * mb:(i + 1) * mb]
    peer = dist.get_rank() + (dp * tp if stage == 0 else -dp * tp)
    local = torch.zeros(())
    if args.pp == 1:
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        local = loss.detach()
    elif stage == 0:
        h = net(x)
        dist.send(h.detach().contiguous(), peer)
        grad = torch.empty_like(h)
        dist.recv(grad, peer)
        h.backward(grad)
    else:
        h = torch.empty(mb, HIDDEN)
        dist.recv(h, peer)
        h.requires_grad_(True)
        loss = nn.functional.mse_loss(net(h), y)
        loss.backward()
        dist.send(h.grad.contiguous(), peer)
        local = loss.detach()
    dist.all_reduce(local)  # sum over every last-stage rank: tp copies of each dp share's mean
    return (local / (dp * tp)).item()


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--gbs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--metrics", required=True)
    ap.add_argument("--ckpt-dir")
    ap.add_argument("--ckpt-every", type=int, default=0)
    ap.add_argument("--keep", type=int, default=3)
    ap.add_argument("--resume", default="auto")
    ap.add_argument("--async-save", action="store_true")
    ap.add_argument("--inject-fault", action="append", default=[])
    ap.add_argument("--watchdog", type=float, default=0.0)
    ap.add_argument("--spike-factor", type=float, default=0.0)
    ap.add_argument("--on-bad-loss", default=None)
    ap.add_argument("--poison", type=int, action="append", default=[])
    args = ap.parse_args(argv)

    mesh = None
    if "WORLD_SIZE" in os.environ:
        from torch.distributed.device_mesh import init_device_mesh

        init_process_group("gloo")
        world = dist.get_world_size()
        mesh = init_device_mesh("cpu", (args.pp, world // (args.pp * args.tp), args.tp),
                                mesh_dim_names=("pp", "dp", "tp"))
    rank = dist.get_rank() if mesh is not None else 0
    net, stage = build(args, mesh)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))
    attempt = restart_attempt()
    metrics = Path(args.metrics)

    def emit(rec: dict) -> None:
        if rank == 0:
            with open(metrics, "a") as f:
                f.write(json.dumps({**rec, "attempt": attempt}) + "\n")

    guard = GuardConfig(spike_factor=args.spike_factor, warmup=3, action=args.on_bad_loss) if args.on_bad_loss else None
    cfg = ResilienceConfig(ckpt_dir=args.ckpt_dir, every=args.ckpt_every, keep=args.keep, resume=args.resume,
                           async_save=args.async_save, faults=tuple(FaultSpec.parse(f) for f in args.inject_fault),
                           watchdog_s=args.watchdog, guard=guard)
    layout = {"tp": args.tp, "pp": args.pp, "dp": (dist.get_world_size() // (args.tp * args.pp)) if mesh else 1}
    R = Resilience(cfg, model=net, optimizer=opt, scheduler=sched, model_name="toy", spec_digest=f"toy-{args.layers}",
                   layout=layout, rank=rank, on_event=lambda ev: emit(ev) if ev.get("rank") == 0 else None)
    pos = R.start()
    step, next_batch = pos.step, (pos.data or {"batch": 0})["batch"]
    while step < args.steps:
        R.begin_step(step + 1)
        while R.should_skip(next_batch):
            next_batch += 1
        b = next_batch
        next_batch += 1
        loss = train_step(args, net, mesh, stage, *batch(args, b))
        v = R.judge(step + 1, loss, [b])
        if v.action == "rollback":
            pos = R.rollback(step + 1)
            opt.zero_grad(set_to_none=True)
            step, next_batch = pos.step, pos.data["batch"]
            continue
        if v.ok:
            opt.step()
            sched.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        emit({"step": step, "loss": loss, "batch": b, "applied": v.ok})
        R.end_step(step, {"batch": next_batch})
    R.finish(step, {"batch": next_batch})
    if mesh is not None:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
