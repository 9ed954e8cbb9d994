"""What a scheduler needs beyond the layout: the job's nodes, devices, run directory and the
``dayzero train`` command its ranks run; shared by the Slurm and Kubernetes writers.

:func:`node_split` is where a plan the scheduler cannot lay out is refused: every node runs the
same number of ranks (``srun --ntasks-per-node``, ``torchrun --nproc-per-node``, a PyTorchJob's
identical replicas), and each tensor-parallel group stays inside one node (ranks are numbered node
by node and tp is the fastest-varying dimension, so ``devices_per_node % tp == 0`` keeps it there).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dayzero.errors import ConfigError, LayoutError
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import DENSE_ORDER, ParallelConfig

DEVICES = ("cuda", "npu", "cpu")
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.\-_\[\],]*$")


@dataclass(frozen=True)
class JobOptions:
    """The job around a plan. ``run_dir`` is on the shared file system (checkpoints, metrics, logs);
    ``device`` is cuda, npu or cpu (CPU ranks on gloo); ``exclude`` the hosts to keep off."""

    name: str = "dayzero"
    devices_per_node: int = 8
    device: str = "cuda"
    run_dir: str = "runs/dayzero"
    steps: int = 100
    ckpt_every: int = 50
    max_requeues: int = 3
    partition: str | None = None
    time_limit: str | None = None
    exclude: tuple[str, ...] = ()
    memory_gb: int | None = None  # per node; None: the whole node (exclusive)
    cpus_per_node: int | None = None

    def __post_init__(self):
        if self.device not in DEVICES:
            raise ConfigError("--device", None, f"must be {', '.join(DEVICES)}, got {self.device!r}")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9\-_.]{0,62}", self.name):
            raise ConfigError("--job-name", None, f"{self.name!r}: letters, digits, '-', '_' and '.', at most 63")


@dataclass(frozen=True)
class NodeSplit:
    nodes: int
    per_node: int  # ranks (devices) per node


def node_split(parallel: ParallelConfig, devices_per_node: int, scheduler: str) -> NodeSplit:
    """Nodes x ranks per node for ``parallel``; a LayoutError says why ``scheduler`` cannot lay it out."""
    world = parallel.world
    per_node = min(world, devices_per_node)
    if world % per_node:
        raise LayoutError(f"{scheduler} cannot lay out {world} ranks on nodes of {devices_per_node}: every node runs "
                          f"the same number of ranks; use a device count that is a multiple of {devices_per_node} or "
                          "give --devices-per-node")
    if per_node % parallel.tp:
        raise LayoutError(f"{scheduler} cannot keep a tp {parallel.tp} group inside a node of {per_node} ranks; "
                          f"use tp dividing {per_node} or give --devices-per-node as a multiple of {parallel.tp}")
    return NodeSplit(world // per_node, per_node)


def read_exclusions(path: str | Path) -> tuple[str, ...]:
    """Hosts to keep off: a JSON object with a ``hosts`` list (the monitor's ``exclusions.json``), a
    JSON list, or plain text with one hostname per line (``#`` comments)."""
    from dayzero.inputs import parse_json, read_text

    text = read_text(path, "an exclusion list: JSON {\"hosts\": [...]} or one hostname per line")
    stripped = text.strip()
    if stripped.startswith(("{", "[")):
        obj = parse_json(text, str(path))
        hosts = obj.get("hosts") if isinstance(obj, dict) else obj
        if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
            raise ConfigError(str(path), "hosts", "expected a list of hostnames")
    else:
        hosts = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    hosts = [h.strip() for h in hosts if h.strip()]
    bad = [h for h in hosts if not _HOST.match(h)]
    if bad:
        raise ConfigError(str(path), "hosts", f"not a hostname: {bad[0]!r}")
    return tuple(dict.fromkeys(hosts))


def train_args(spec: ModelSpec, parallel: ParallelConfig, job: JobOptions, ckpt_dir: str, metrics: str) -> list[str]:
    """``dayzero train`` of the plan, as every rank runs it (after ``-m``): resumes from the newest
    good checkpoint in ``ckpt_dir`` (``--resume auto``) and appends to ``metrics``."""
    from dayzero.cli.next_steps import layout_flags

    out = ["dayzero", "train", spec.name, *layout_flags(parallel.to_dict()), "--steps", str(job.steps),
           "--ckpt-dir", ckpt_dir, "--ckpt-every", str(job.ckpt_every), "--resume", "auto", "--metrics", metrics,
           "--quiet"]
    if job.device == "cpu":
        out += ["--device", "cpu", "--backend", "gloo"]
    elif job.device == "npu":
        out += ["--device", "npu"]
    return out


def unexpressed(parallel: ParallelConfig) -> list[str]:
    """Settings of the plan that ``dayzero train``'s flags do not carry."""
    out = []
    if parallel.rank_order != DENSE_ORDER:
        out.append(f"rank order {parallel.rank_order} (dayzero train numbers ranks {DENSE_ORDER})")
    return out
