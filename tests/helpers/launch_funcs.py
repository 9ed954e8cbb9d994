"""Rank functions for tests/runtime/test_launch.py (imported by the spawned ranks by module path)."""

from __future__ import annotations

import os


def echo(args: dict) -> dict:
    import torch
    import torch.distributed as dist

    from dayzero.runtime.distributed import init_distributed

    init_distributed()
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "sum": float(t), "threads": os.environ.get("OMP_NUM_THREADS"), **args}


def user_error_on_rank1(args: dict) -> None:
    import torch.distributed as dist

    from dayzero.errors import LayoutError
    from dayzero.runtime.distributed import init_distributed

    init_distributed()
    if dist.get_rank() == 1:
        raise LayoutError("tp 3 does not divide 4 heads; choose a divisor")
    dist.barrier()  # rank 0 waits here until the agent stops it: nothing may hang


def crash_on_rank0(args: dict) -> None:
    import torch.distributed as dist

    from dayzero.runtime.distributed import init_distributed

    init_distributed()
    if dist.get_rank() == 0:
        raise RuntimeError("boom")
    dist.barrier()
