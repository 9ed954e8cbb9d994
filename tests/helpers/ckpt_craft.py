"""A small saved checkpoint version and crafted copies of it: a side file's content changed, its
manifest entry and COMPLETE marker rewritten so the checksums match (only the content is wrong)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn

from dayzero.runtime.checkpoint.checkpointer import Checkpointer
from dayzero.runtime.checkpoint.manifest import describe_file, read_manifest, write_json_durable, write_marker
from dayzero.runtime.checkpoint.versions import version_name


def make():
    """(model, AdamW, LambdaLR), deterministic."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    return m, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))


def save_version(root: Path, steps: int) -> Path:
    """``steps`` optimizer steps, then one version at that step with model, optimizer, scheduler
    and a data position."""
    m, opt, sched = make()
    for _ in range(steps):
        m(torch.randn(3, 4)).pow(2).mean().backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    ck = Checkpointer(root)
    ck.save(steps, m, opt, scheduler=sched,
            data={"stream": {"samples": steps, "seed": 0, "seq": 8, "fingerprint": "f"}})
    ck.close()
    return root


def recommit(version: Path, rel: str) -> None:
    """Rewrite ``rel``'s manifest entry and the COMPLETE marker to match the file as it is now."""
    m = read_manifest(version)
    files = [describe_file(version, f.path) if f.path == rel else f for f in m.files]
    write_json_durable(version / "manifest.json", m.model_copy(update={"files": files}).to_json())
    write_marker(version)


def craft(src: Path, dst: Path, step: int, rel: str, edit: Callable[[Any], Any]) -> Path:
    """A copy of the checkpoint directory ``src`` at ``dst`` whose version ``step`` has ``rel``
    replaced by ``edit(its parsed JSON)``, recommitted."""
    shutil.copytree(src, dst)
    v = dst / version_name(step)
    (v / rel).write_text(json.dumps(edit(json.loads((v / rel).read_text()))))
    recommit(v, rel)
    return dst


def resume(root: Path, step: int):
    """Resume version ``step`` of ``root`` into a fresh model, optimizer and scheduler."""
    m, opt, sched = make()
    ck = Checkpointer(root)
    try:
        return ck.resume(m, opt, sched, which=step)
    finally:
        ck.close()
