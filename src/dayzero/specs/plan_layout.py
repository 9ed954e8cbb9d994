"""A plan to run here: the layout of a ``dayzero plan --json`` / ``dayzero predict --json`` file,
fitted to the ranks at hand (``dayzero train --plan``, ``dayzero validate --plan``), or taken as
written (``dayzero export PLAN.json``).

A plan file is a user file like any other: it may have been edited by hand. Its ``parallel``
object goes through :func:`checked_fields` (each field's JSON type: an integer is an integer, not
``true``, ``2.0`` or ``"2"``) and then the same rules as the CLI's flags
(:meth:`ParallelConfig.problems`), every error naming the file and the field.
"""

from __future__ import annotations

from pathlib import Path

from dayzero.errors import ConfigError, LayoutError
from dayzero.inputs import load_json
from dayzero.specs import layout_rules
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import ParallelConfig

INT_FIELDS = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs", "gbs", "seq", "zero", "activation_offload_layers",
              "microbatches", "world", "edp")
STR_FIELDS = ("recompute", "schedule", "precision", "cp_comm", "rank_order")
BOOL_FIELDS = ("sequence_parallel", "fp8_param_gather", "optimizer_offload")
# beyond any degree or size (layout_rules.MAX_DEGREE is 2^24) but inside int64: the rules then name the field
INT_LIMIT = 2**53


def _int(v, source: str, field: str, optional: bool = False) -> int | None:
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(source, field, f"expected an integer, got {v!r}" + (" (or null)" if optional else ""))
    if abs(v) > INT_LIMIT:
        raise ConfigError(source, field, f"{v} is out of range; no layout field is that large")
    return v


def checked_fields(p: dict, source: str) -> dict:
    """The ``parallel`` object ``p`` with every field of the wrong JSON type refused (one line
    naming ``source`` and the field); values are left to :meth:`ParallelConfig.problems`."""
    if not isinstance(p, dict):
        raise ConfigError(source, "parallel", f"expected an object of layout fields, got {type(p).__name__}")
    out = dict(p)
    for k in INT_FIELDS:
        if k in p:
            _int(p[k], source, k)
    if p.get("activation_offload_layers", 0) < 0:
        raise ConfigError(source, "activation_offload_layers", f"must be >= 0 layers per model chunk (0: off), got "
                          f"{p['activation_offload_layers']}")
    if "recompute_layers" in p:
        _int(p["recompute_layers"], source, "recompute_layers", optional=True)
    for k in STR_FIELDS:
        if k in p and not isinstance(p[k], str):
            raise ConfigError(source, k, f"expected a string, got {p[k]!r}")
    for k in BOOL_FIELDS:
        if k in p and not isinstance(p[k], bool):
            raise ConfigError(source, k, f"expected true or false, got {p[k]!r}")
    split = p.get("layer_split")
    if split is not None:
        if not isinstance(split, (list, tuple)) or not split:
            raise ConfigError(source, "layer_split", f"expected a list of layer counts per stage, got {split!r}")
        for v in split:
            _int(v, source, "layer_split")
        out["layer_split"] = tuple(split)
    mods = p.get("recompute_modules")
    if mods is not None:
        if isinstance(mods, str):
            mods = [mods]
        if not isinstance(mods, (list, tuple)) or not all(isinstance(m, str) for m in mods):
            raise ConfigError(source, "recompute_modules", f"expected a list of module names, got {mods!r}")
        out["recompute_modules"] = tuple(mods)
    return out


def checked_layout(par: ParallelConfig, source: str, spec: ModelSpec | None = None,
                   devices: int | None = None) -> ParallelConfig:
    """``par`` when it breaks no layout rule (for ``spec`` on ``devices`` when given); a one-line
    LayoutError naming ``source`` otherwise."""
    problems = layout_rules.problems(par, spec, devices)
    if problems:
        raise LayoutError(f"{source}: invalid parallel layout: " + "; ".join(problems))
    return par


def parallel_from_plan(p: dict, source: str, spec: ModelSpec | None = None) -> ParallelConfig:
    """The layout a plan file states, as written (``dayzero export PLAN.json``), checked like flags."""
    return checked_layout(ParallelConfig.from_dict(checked_fields(p, source)), source, spec)


def read_plan(path: str | Path, obj=None) -> tuple[str | None, dict]:
    """(model name, ``parallel`` object) of a ``dayzero plan --json`` (its best plan) or
    ``dayzero predict --json`` file (``obj``: its contents, when already read)."""
    if obj is None:
        obj = load_json(path, "pass the output of `dayzero plan --json` or `dayzero predict --json`")
    model = obj.get("model") if isinstance(obj, dict) else None
    if model is not None and not isinstance(model, str):
        raise ConfigError(str(path), "model", f"expected a model name, got {model!r}")
    if isinstance(obj, dict) and obj.get("plans"):
        if not isinstance(obj["plans"], list):
            raise ConfigError(str(path), "plans", "expected a list of plans")
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
    f = checked_fields(p, source)
    tp, pp, cp = f.get("tp", 1), f.get("pp", 1), f.get("cp", 1)
    mbs, vpp, micro = f.get("mbs", 1), f.get("vpp", 1), f.get("microbatches", 1)
    ep, etp, zero = f.get("ep", 1), f.get("etp", 1), f.get("zero", 1)
    degrees = ParallelConfig(tp=tp, pp=pp, cp=cp, mbs=mbs, vpp=vpp if vpp >= 1 else 1, ep=ep, etp=etp, zero=zero,
                             gbs=max(1, mbs), schedule="interleaved" if vpp > 1 else "1f1b")
    bad = [x for x in layout_rules.problems(degrees) if x.split()[0] in ("tp", "pp", "cp", "mbs", "ep", "etp", "zero")]
    if min(vpp, micro) < 1:
        bad.append(f"{'vpp' if vpp < 1 else 'microbatches'} must be >= 1, got {min(vpp, micro)}")
    if bad:
        raise LayoutError(f"{source}: invalid parallel layout: " + "; ".join(bad))
    if world % (tp * pp * cp):
        raise LayoutError(f"the plan needs tp*pp*cp = {tp}*{pp}*{cp} = {tp * pp * cp} ranks per data-parallel "
                          f"replica; use --nproc as a multiple of {tp * pp * cp}")
    dp = world // (tp * pp * cp)
    m = max(pp, min(micro, 4 * pp))
    par = ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, cp_comm=f.get("cp_comm", "p2p"), ep=ep, etp=etp, vpp=vpp,
                         mbs=mbs, gbs=gbs or mbs * dp * m,
                         seq=seq, zero=zero, recompute=f.get("recompute", "none"),
                         recompute_modules=tuple(f.get("recompute_modules") or ()),
                         sequence_parallel=bool(f.get("sequence_parallel")), schedule=f.get("schedule", "1f1b"))
    # the rules that need the model and the ranks (ep x etp within a stage, heads over tp) are the
    # consumer's: the run's pre-flight validates the fitted layout against both
    bad = [x for x in layout_rules.problems(par) if x.split()[0] in ("recompute", "schedule", "cp_comm", "zero")]
    if bad:
        raise LayoutError(f"{source}: invalid parallel layout: " + "; ".join(bad))
    return par
