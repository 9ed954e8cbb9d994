"""The next command a verb's human output ends with, built from the values it just printed.

A verb hands :func:`print_next` a few :class:`Step` s (a command as argv words and why to run it);
they print as ``next:`` lines that a shell accepts as pasted, long ones continued with ``\\``
so that they fit the console. ``--json`` output never carries them.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from rich.console import Console
from rich.text import Text

from dayzero.specs.layout_flags import layout_flags, train_layout


@dataclass(frozen=True)
class Step:
    argv: tuple[str, ...]
    why: str = ""

    @classmethod
    def of(cls, *words: Any, why: str = "") -> "Step":
        return cls(tuple(str(w) for w in words), why)


def cluster_flags(cluster: str | None, accelerator: str | None, devices: int | None,
                  devices_per_node: int | None = None, inter_node_gbps: float | None = None,
                  default: str | None = None) -> list[str]:
    """The cluster options as the user gave them (or ``--cluster DEFAULT`` when they gave none)."""
    if cluster or not accelerator:
        return ["--cluster", cluster or default] if (cluster or default) else []
    out = ["--accelerator", accelerator]
    for flag, v in (("--devices", devices), ("--devices-per-node", devices_per_node),
                    ("--inter-node-gbps", inter_node_gbps)):
        if v is not None:
            out += [flag, f"{v:g}" if isinstance(v, float) else str(v)]
    return out


def train_step(model: str, p: Mapping[str, Any], devices: int, devices_per_node: int, why: str) -> Step:
    """``dayzero train`` of a layout: ``--nproc`` on one host, torchrun on every node beyond; without
    the memory switches, which are not train flags (:func:`train_layout`)."""
    flags = layout_flags(train_layout(p))
    if devices <= devices_per_node:
        return Step.of("dayzero", "train", model, *flags, "--nproc", devices, why=why)
    nodes = math.ceil(devices / devices_per_node)
    return Step.of("torchrun", "--nnodes", nodes, "--nproc-per-node", devices_per_node, "-m", "dayzero", "train",
                   model, *flags, why=f"{why}, on each of the {nodes:,} nodes")


def run_step(model: str, p: Mapping[str, Any], engines: Sequence[str] | None, devices: int, devices_per_node: int,
             why: str) -> Step:
    """How to run a plan's layout: :func:`train_step` where dayzero's runtime runs it as laid out
    (``engines``: the plan's labels, planner.engines; absent, it is not known and train is the
    step), else ``dayzero export`` to the first engine that does, with every layout flag (the
    switches included) and the ranks, so the step never asks the runtime for what it refuses."""
    if not engines or "dayzero" in engines:
        return train_step(model, p, devices, devices_per_node, why)
    engine = engines[0]
    return Step.of("dayzero", "export", model, "--to", engine, *layout_flags(p), "--devices", devices,
                   "--devices-per-node", devices_per_node, "-o", f"runs/export/{engine}",
                   why=f"{why} with {engine} (dayzero's runtime does not run it)")


def after_train(cfg, world: int) -> list[Step]:
    """After ``dayzero train``: export the newest checkpoint it saved, or, with none, measure the
    layout against the planner's prediction (``dayzero validate``)."""
    shrink = [w for k, v in cfg.model.shrink.items() for w in (f"--{k}", str(v))]
    if cfg.checkpoint.dir:
        from pathlib import Path

        from dayzero.runtime.checkpoint.versions import scan

        done = [v for v in scan(Path(cfg.checkpoint.dir)) if v.state == "complete"]
        if done:
            return [Step.of("dayzero", "ckpt", "export", done[-1].path, f"{str(cfg.checkpoint.dir).rstrip('/')}-hf",
                            why="its weights as Hugging Face safetensors")]
    return [Step.of("dayzero", "validate", cfg.model.name, *shrink, "--nproc", world,
                    *layout_flags(cfg.parallel.to_dict(), precision=False),
                    why="measured against the planner's prediction")]


def starter_devices(spec, accelerator) -> int:
    """Smallest power-of-two device count whose memory holds the model states (weights, gradients,
    FP32 master weights and AdamW moments) in half of it, leaving the rest to activations."""
    from dayzero.planner.memory.memory import MemoryOptions, model_states
    from dayzero.specs.counting import params_total

    states = model_states(params_total(spec), MemoryOptions.for_accelerator(accelerator)).total
    need = states / (0.5 * accelerator.hbm_bytes)
    return 1 if need <= 1 else 2 ** math.ceil(math.log2(need))


def verb_at(step: Step) -> int | None:
    """Where in ``step.argv`` the dayzero verb it runs is (``dayzero VERB`` or ``... -m dayzero
    VERB``), None for another program."""
    words = step.argv
    for i, w in enumerate(words[:-1]):
        if w == "dayzero" and (i == 0 or words[i - 1] == "-m"):
            return i + 1
    return None


def verb_options(verb: str) -> frozenset[str]:
    """The options ``dayzero VERB`` accepts, read from the CLI app itself (never a copied list)."""
    import typer

    from dayzero.cli.app import app

    cmd = typer.main.get_command(app).commands.get(verb)  # type: ignore[attr-defined]
    if cmd is None:
        return frozenset()
    return frozenset(o for p in cmd.params for o in (*p.opts, *p.secondary_opts))


def for_model(steps: Sequence[Step], notes: Mapping[str, Any]) -> tuple[list[Step], list[str]]:
    """The steps that run for a model (``notes``: :func:`dayzero.report.model_notes.model_notes`
    of it, as a report's ``model`` holds them), and a line saying why each other one was left out:
    one built from the modeling code its directory ships needs ``--trust-remote-code``, added where
    the verb has it, and the step left out where it has not (a model derived from a type transformers
    ships runs every verb: validate measures the runtime against its derived spec and states the
    approximations' share of the differences)."""
    keep: list[Step] = []
    left_out: list[str] = []
    remote = notes.get("remote_code")
    for s in steps:
        at = verb_at(s)
        verb = None if at is None else s.argv[at]
        if at is None or verb is None:
            keep.append(s)
        elif remote and "--trust-remote-code" not in verb_options(verb):
            left_out.append(f"not suggested: dayzero {verb}, which does not run a model directory's own modeling code "
                            "(it has no --trust-remote-code)")
        elif remote:
            keep.append(Step(s.argv[:at + 2] + ("--trust-remote-code",) + s.argv[at + 2:], s.why))
        else:
            keep.append(s)
    return keep, left_out


def print_next(console: Console, steps: Sequence[Step]) -> None:
    """``next: COMMAND   # why`` for each step, wrapped with shell continuations to the console;
    a comment that does not fit after the command goes on a line of its own above it."""
    width = max(console.width, 40)
    for i, s in enumerate(steps):
        label = "next: " if i == 0 else "      "
        for line in _lines(label, _chunks(s.argv), f"# {s.why}" if s.why else "", width):
            console.print(Text(line), soft_wrap=True, highlight=False)


def _chunks(argv: Sequence[str]) -> list[str]:
    """Shell-quoted words, an option and its value kept together (a line never ends in --tp)."""
    out: list[str] = []
    for w in argv:
        q = shlex.quote(w)
        if out and out[-1].startswith("--") and " " not in out[-1] and not w.startswith("-"):
            out[-1] += " " + q
        else:
            out.append(q)
    return out


def _lines(label: str, words: list[str], comment: str, width: int) -> list[str]:
    lines = _wrap(label, words, width)
    if comment and len(lines[-1]) + 3 + len(comment) <= width:
        return lines[:-1] + [lines[-1] + "   " + comment]
    if comment:
        return [label + comment] + _wrap(" " * len(label), words, width)
    return lines


def _wrap(label: str, words: list[str], width: int) -> list[str]:
    indent = " " * (len(label) + 2)
    lines, cur = [], label + words[0]
    for w in words[1:]:
        if len(cur) + 1 + len(w) + 2 > width:  # room for " \"
            lines.append(cur + " \\")
            cur = indent + w
        else:
            cur += " " + w
    return lines + [cur]
