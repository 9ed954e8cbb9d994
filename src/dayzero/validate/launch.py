"""Run one function on N local ranks and collect what each returns.

``run_ranks("dayzero.validate.microbench:run_rank", args, nproc)`` starts ``nproc`` processes
through :func:`dayzero.runtime.launch.launch_local` (torchrun's elastic agent, the launcher
``dayzero train`` uses), each joining one process group (:mod:`dayzero.runtime.device` picks device and backend) and
calling
the function with ``args``; each rank's JSON-able return value comes back as one list entry, rank
order. A user error on any rank (DayzeroError) becomes one line and exit code 2 for the caller;
the agent stops the other ranks, so nothing hangs. Each rank runs with one intra-op thread unless
OMP_NUM_THREADS says otherwise, as torchrun and ``dayzero train`` do, so microbenchmarks see the
same machine training sees.

Each rank runs ``python -m dayzero.validate.launch FUNC ARGS.json OUTDIR``.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
from pathlib import Path

from dayzero.errors import DayzeroError
from dayzero.runtime.distributed import destroy_process_group
from dayzero.runtime.launch import RanksFailed, launch_local, run_as_rank, write_rank_error


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
        write_rank_error(out_dir, e)
        return e.exit_code
    finally:
        destroy_process_group()


def run_ranks(func: str, args: dict, nproc: int) -> list:
    """Run ``func(args)`` on ``nproc`` local ranks; returns each rank's result, rank order."""
    with tempfile.TemporaryDirectory(prefix="dayzero-ranks-") as tmp:
        args_path = Path(tmp, "args.json")
        args_path.write_text(json.dumps(args))
        try:
            launch_local(["-m", "dayzero.validate.launch", func, str(args_path), tmp], nproc, tmp)
        except RanksFailed as e:
            raise DayzeroError("; ".join(e.messages if e.exit_code == 2 else [f"{func}: {m}" for m in e.messages])) \
                from None
        return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(nproc)]


if __name__ == "__main__":
    run_as_rank(lambda _stop: rank_main(sys.argv[1:]))
