"""Run one function on N local ranks and collect what each returns.

``run_ranks("dayzero.validate.microbench:run_rank", args, nproc)`` starts ``nproc`` processes
under torchrun's elastic agent (the same launcher ``dayzero train`` uses), each joining one
process group (gloo on CPU, NCCL on CUDA) and calling the function with ``args``; each rank's
JSON-able return value comes back as one list entry, rank order. A user error on any rank
(DayzeroError) becomes one line and exit code 2 for the caller; the agent stops the other ranks,
so nothing hangs. Each rank runs with one intra-op thread unless OMP_NUM_THREADS says otherwise,
as torchrun and ``dayzero train`` do, so microbenchmarks see the same machine training sees.

Each rank runs ``python -m dayzero.validate.launch FUNC ARGS.json OUTDIR``.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import tempfile
import traceback
import uuid
from datetime import timedelta
from pathlib import Path

from dayzero.errors import DayzeroError

PG_TIMEOUT_S = 600  # a rank stuck longer than this in a collective fails instead of hanging


def init_process_group():
    """Join torchrun's group (gloo on CPU, NCCL on CUDA); returns the device."""
    import torch
    import torch.distributed as dist

    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        kw = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend, timeout=timedelta(seconds=PG_TIMEOUT_S), **kw)
    return device


def _resolve(func: str):
    module, _, name = func.partition(":")
    return getattr(importlib.import_module(module), name)


def rank_main(argv: list[str]) -> int:
    func, args_path, out_dir = argv
    rank = int(os.environ.get("RANK", "0"))
    try:
        args = json.loads(Path(args_path).read_text())
        result = _resolve(func)(args)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
        return 0
    except DayzeroError as e:
        Path(out_dir, f"rank{rank}.err").write_text(str(e) + "\n")
        return e.exit_code
    finally:
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - shutting down after an error must not mask it
            pass


def run_ranks(func: str, args: dict, nproc: int) -> list:
    """Run ``func(args)`` on ``nproc`` local ranks; returns each rank's result, rank order."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="dayzero-ranks-") as tmp:
        args_path = Path(tmp, "args.json")
        args_path.write_text(json.dumps(args))
        lc = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
                          monitor_interval=0.1, start_method="spawn")
        threads = os.environ.get("OMP_NUM_THREADS")
        if threads is None:
            os.environ["OMP_NUM_THREADS"] = "1"
        try:
            elastic_launch(lc, sys.executable)("-m", "dayzero.validate.launch", func, str(args_path), tmp)
        except ChildFailedError as e:
            messages = sorted({f.read_text().strip() for f in Path(tmp).glob("rank*.err")})
            if messages:
                raise DayzeroError("; ".join(messages)) from None
            rank, failure = e.get_first_failure()
            raise DayzeroError(f"rank {rank} of {func} failed with exit code {failure.exitcode}; "
                               "its traceback is above") from None
        finally:
            if threads is None:
                os.environ.pop("OMP_NUM_THREADS", None)
        return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(nproc)]


if __name__ == "__main__":
    try:
        sys.exit(rank_main(sys.argv[1:]))
    except SystemExit:
        raise
    except BaseException:  # a crash: show it, and let the agent stop the other ranks
        traceback.print_exc()
        sys.exit(1)
