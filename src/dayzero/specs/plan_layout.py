"""A plan to run here: the layout of a ``dayzero plan --json`` / ``dayzero predict --json`` file,
fitted to the ranks at hand (``dayzero train --plan``, ``dayzero validate --plan``)."""

from __future__ import annotations

from pathlib import Path

from dayzero.errors import ConfigError, LayoutError
from dayzero.inputs import load_json
from dayzero.specs.parallel import ParallelConfig


def read_plan(path: str | Path, obj=None) -> tuple[str | None, dict]:
    """(model name, ``parallel`` object) of a ``dayzero plan --json`` (its best plan) or
    ``dayzero predict --json`` file (``obj``: its contents, when already read)."""
    if obj is None:
        obj = load_json(path, "pass the output of `dayzero plan --json` or `dayzero predict --json`")
    model = obj.get("model") if isinstance(obj, dict) else None
    if isinstance(obj, dict) and obj.get("plans"):
        obj = obj["plans"][0]
    p = obj.get("parallel") if isinstance(obj, dict) else None
    if not isinstance(p, dict):
        raise ConfigError(str(path), "parallel", "expected `dayzero plan --json` or `dayzero predict --json` output")
    return model, p


def plan_interval(path: str | Path) -> tuple[int, str] | None:
    """The checkpoint interval (steps, and why) a plan/predict file derived for its best plan
    (planner/training_cost.py: Young's interval from the interruption rate), or None where it has none."""
    obj = load_json(path, "pass the output of `dayzero plan --json` or `dayzero predict --json`")
    if isinstance(obj, dict) and obj.get("plans"):
        obj = obj["plans"][0]
    f = ((obj.get("training") or {}).get("failures") or {}) if isinstance(obj, dict) else {}
    steps = f.get("optimal_checkpoint_interval_steps")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        return None
    return steps, str(f.get("interval_reason", "the plan's derived interval"))


def plan_layout(path: str | Path, world: int, seq: int, gbs: int | None = None) -> ParallelConfig:
    """The plan's (its best plan's) tp, pp, cp (and its cp_comm), ep, etp, vpp, ZeRO, recompute, sequence parallelism,
    schedule and micro-batch size on ``world`` ranks: dp fills them; the global batch keeps the
    plan's micro-batch count (at least pp, for the pipeline; at most 4 pp, to stay a proxy) unless
    ``gbs`` is given."""
    _, p = read_plan(path)
    return layout_of(p, world, seq, gbs, str(path))


def layout_of(p: dict, world: int, seq: int, gbs: int | None = None, source: str = "plan") -> ParallelConfig:
    """:func:`plan_layout` of a plan's ``parallel`` object already read (``source`` names it in errors)."""
    path = source
    try:
        tp, pp, cp = int(p.get("tp", 1)), int(p.get("pp", 1)), int(p.get("cp", 1))
        mbs, vpp, micro = int(p.get("mbs", 1)), int(p.get("vpp", 1)), int(p.get("microbatches", 1))
        ep, etp, zero = int(p.get("ep", 1)), int(p.get("etp", 1)), int(p.get("zero", 1))
    except (TypeError, ValueError) as e:
        raise ConfigError(str(path), "parallel", f"not a layout: {e}") from None
    if min(tp, pp, cp, mbs, vpp, ep, etp) < 1:
        raise ConfigError(str(path), "parallel", f"degrees must be >= 1, got {p}")
    if world % (tp * pp * cp):
        raise LayoutError(f"the plan needs tp*pp*cp = {tp}*{pp}*{cp} = {tp * pp * cp} ranks per data-parallel "
                          f"replica; use --nproc as a multiple of {tp * pp * cp}")
    dp = world // (tp * pp * cp)
    m = max(pp, min(micro, 4 * pp))
    return ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, cp_comm=p.get("cp_comm", "p2p"), ep=ep, etp=etp, vpp=vpp,
                          mbs=mbs, gbs=gbs or mbs * dp * m,
                          seq=seq, zero=zero, recompute=p.get("recompute", "none"),
                          recompute_modules=tuple(p.get("recompute_modules") or ()),
                          sequence_parallel=bool(p.get("sequence_parallel")), schedule=p.get("schedule", "1f1b"))
