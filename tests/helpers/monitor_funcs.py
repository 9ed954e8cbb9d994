"""Rank functions for tests/monitor/test_monitor_inprocess.py (imported by the spawned ranks by module path)."""

from __future__ import annotations

import time


def straggler(args: dict) -> dict:
    """Train a tiny model with in-process alerts while rank ``slow_rank`` sleeps after every step
    (outside the timed step and outside any collective); return the alerts each rank saw."""
    import torch.distributed as dist

    from dayzero.runtime.config import CheckpointSection, ModelSection, MonitorSection, TrainConfig
    from dayzero.runtime.distributed import init_distributed
    from dayzero.runtime.train import train
    from dayzero.specs.parallel import ParallelConfig

    init_distributed()
    seen: list = []

    def hook(state, rec):
        seen.append([a.to_dict() for a in state.alerts])
        if dist.get_rank() == args["slow_rank"]:
            time.sleep(args["sleep_s"])

    world = dist.get_world_size()
    cfg = TrainConfig(model=ModelSection("tiny-llama", layers=2, hidden=64, vocab=512),
                      parallel=ParallelConfig(dp=world, gbs=2 * world, mbs=1, seq=32),
                      monitor=MonitorSection(alerts=True, thresholds=args.get("thresholds", {})), steps=args["steps"],
                      compute_dtype="fp32",
                      checkpoint=CheckpointSection(dir=args.get("ckpt_dir"), every=args.get("ckpt_every", 0)),
                      metrics=args.get("metrics"), quiet=True)
    train(cfg, hooks=(hook,))
    return {"rank": dist.get_rank(), "alerts": seen}
