"""Starting ranks: ``spawn`` runs N local ranks under torchrun's elastic agent; ``main`` is what each
rank runs (``python -m dayzero.runtime.launch [--error-dir DIR] CONFIG.json ...``).

A user error on a rank (DayzeroError) ends that rank with exit code 2 after writing its one-line
message to ``--error-dir``; the agent then stops every other rank, and the parent prints each
distinct message once. Several configs run one after another in the same process group (tests
share one spawned world across runs this way).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import traceback
import uuid
from pathlib import Path

from dayzero.errors import DayzeroError
from dayzero.runtime.config import TrainConfig


def run_configs(configs: list[TrainConfig], error_dir: str | None = None) -> int:
    """Train each config in turn on this rank; returns the process exit code."""
    rank = int(os.environ.get("RANK", "0"))
    try:
        from dayzero.runtime.train import init_distributed

        device = init_distributed()
        for cfg in configs:
            _train_one(cfg, device)
        return 0
    except DayzeroError as e:
        if error_dir:
            Path(error_dir, f"rank{rank}.err").write_text(str(e) + "\n")
        elif rank == 0:
            print(f"dayzero: error: {e}", file=sys.stderr)
        return e.exit_code
    finally:
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - shutting down after an error must not mask it
            pass


def _train_one(cfg: TrainConfig, device) -> None:
    import gc

    from dayzero.runtime.train import build_state, train

    state = build_state(cfg, device)
    train(cfg, state=state)
    del state
    gc.collect()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dayzero.runtime.launch")
    ap.add_argument("--error-dir", default=None)
    ap.add_argument("configs", nargs="+")
    a = ap.parse_args(argv)
    return run_configs([TrainConfig.load(p) for p in a.configs], a.error_dir)


def spawn(configs: TrainConfig | list[TrainConfig], nproc: int) -> int:
    """Run the config(s) on ``nproc`` local ranks (torchrun --standalone). Returns 0, 2 after a
    user error (its message printed once on stderr), or 1 after a crash."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    configs = configs if isinstance(configs, list) else [configs]
    # the agent's own log lines would bury the one line that matters
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="dayzero-launch-") as tmp:
        paths = []
        for i, cfg in enumerate(configs):
            p = Path(tmp, f"config{i}.json")
            cfg.save(p)
            paths.append(str(p))
        errors = Path(tmp, "errors")
        errors.mkdir()
        lc = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0",
                          max_restarts=max(c.max_restarts for c in configs),
                          monitor_interval=0.1, start_method="spawn")
        env_threads = os.environ.get("OMP_NUM_THREADS")
        if env_threads is None:  # as torchrun does: one thread per rank unless told otherwise
            os.environ["OMP_NUM_THREADS"] = "1"
        try:
            for attempt in (1, 2):
                try:
                    elastic_launch(lc, sys.executable)("-m", "dayzero.runtime.launch", "--error-dir", str(errors),
                                                       *paths)
                    return 0
                except ChildFailedError:
                    raise
                except Exception as e:  # noqa: BLE001 - the launcher itself (rendezvous, store) failed
                    what = " ".join(f"{type(e).__name__}: {e}".split())[:300]
                    if attempt == 2:
                        print(f"dayzero: error: could not run {nproc} ranks: {what}", file=sys.stderr)
                        return 1
                    print(f"dayzero: note: starting {nproc} ranks failed ({what}); retrying once", file=sys.stderr)
                    lc.run_id = str(uuid.uuid4())
        except ChildFailedError as e:
            messages = sorted({f.read_text().strip() for f in errors.glob("rank*.err")})
            if messages:
                for m in messages:
                    print(f"dayzero: error: {m}", file=sys.stderr)
                return 2
            rank, failure = e.get_first_failure()
            print(f"dayzero: error: rank {rank} failed with exit code {failure.exitcode}; its traceback is above",
                  file=sys.stderr)
            return 1
        finally:
            if env_threads is None:
                os.environ.pop("OMP_NUM_THREADS", None)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except BaseException:  # a crash: show it, and let the agent stop the other ranks
        traceback.print_exc()
        sys.exit(1)
