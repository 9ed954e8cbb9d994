"""``dayzero train`` as a subprocess, outside any torchrun environment this process may be in."""

from __future__ import annotations

import os
import subprocess
import sys


def run_train(model: list[str], *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run ``dayzero train MODEL... ARGS...``; raise with its output tails when it fails."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    p = subprocess.run([sys.executable, "-m", "dayzero", "train", *model, *args], capture_output=True, text=True,
                       timeout=timeout, env=env)
    if p.returncode != 0:
        raise AssertionError(f"dayzero train exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}")
    return p
