"""A plan to run here: the layout of a ``dayzero plan --json`` / ``dayzero predict --json`` file,
fitted to the ranks at hand (``dayzero train --plan``, ``dayzero validate --plan``), or taken as
written (``dayzero export PLAN.json``).

A plan file is a user file like any other: it may have been edited by hand. Its ``parallel``
object goes through :func:`checked_fields` (each field's JSON type: an integer is an integer, not
``true``, ``2.0`` or ``"2"``) and then the same rules as the CLI's flags
(:meth:`ParallelConfig.problems`), every error naming the file and the field.
"""

from __future__ import annotations

import json
from pathlib import Path

from dayzero.errors import ConfigError, LayoutError
from dayzero.inputs import load_json
from dayzero.specs import layout_rules
from dayzero.specs.layout_fields import (
    BOOL,
    DERIVED_INTS,
    FIELDS,
    INT,
    INT_OR_NULL,
    INTS,
    STR,
    STRS,
    Field,
    runtime_refused,
)
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import ParallelConfig

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


def _checked(f: Field, v, source: str):
    """One field's JSON value, type-checked as its declaration says (layout_fields.Field.json)."""
    if f.json in (INT, INT_OR_NULL):
        _int(v, source, f.name, optional=f.json == INT_OR_NULL)
        if f.json_min is not None and v < f.json_min:
            raise ConfigError(source, f.name, f"must be >= {f.json_min} ({f.flag.long} {f.flag.default}: the "
                              f"default), got {v}")
    elif f.json == STR and not isinstance(v, str):
        raise ConfigError(source, f.name, f"expected a string, got {v!r}")
    elif f.json == BOOL and not isinstance(v, bool):
        raise ConfigError(source, f.name, f"expected true or false, got {v!r}")
    elif f.json == INTS and v is not None:
        if not isinstance(v, (list, tuple)) or not v:
            raise ConfigError(source, f.name, f"expected a list of layer counts per stage, got {v!r}")
        for x in v:
            _int(x, source, f.name)
        return tuple(v)
    elif f.json == STRS and v is not None:
        names = [v] if isinstance(v, str) else v
        if not isinstance(names, (list, tuple)) or not all(isinstance(m, str) for m in names):
            raise ConfigError(source, f.name, f"expected a list of module names, got {v!r}")
        return tuple(names)
    return v


def checked_fields(p: dict, source: str) -> dict:
    """The ``parallel`` object ``p`` with every field of the wrong JSON type refused (one line
    naming ``source`` and the field; the types: layout_fields.FIELDS); values are left to
    :meth:`ParallelConfig.problems`."""
    if not isinstance(p, dict):
        raise ConfigError(source, "parallel", f"expected an object of layout fields, got {type(p).__name__}")
    out = dict(p)
    for k in DERIVED_INTS:
        if k in p:
            _int(p[k], source, k)
    for f in FIELDS:
        if f.name in p:
            out[f.name] = _checked(f, p[f.name], source)
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
    """The plan's (its best plan's) layout on ``world`` ranks (:func:`layout_of`), refused with the
    reason where it sets a field dayzero's runtime cannot run (:func:`runnable`)."""
    _, p = read_plan(path)
    return runnable(layout_of(p, world, seq, gbs, str(path)), str(path))


def runnable(par: ParallelConfig, source: str) -> ParallelConfig:
    """``par`` when ``dayzero train`` / ``validate`` run every field it sets; else a one-line
    LayoutError naming the first field they cannot run (layout_fields.runtime_refused), why and
    what to do. The values of carried fields the runtime refuses (cp > 1, an FP8 recipe, ...) are
    its pre-flight's (runtime.checks.check_runtime)."""
    for f in runtime_refused():
        value = getattr(par, f.name)
        if value != f.default:
            raise LayoutError(f"{source}: {f.name} {json.dumps(value)}: dayzero's runtime does not run {f.runtime}; "
                              f"re-plan with {f.keep_off}, or export the plan to an engine that runs it "
                              f"(dayzero export {source} --to ENGINE)")
    return par


# fitted to the ranks at hand, not carried: dp fills them, the batch keeps the micro-batch count, seq is the run's
REFIT = ("dp", "gbs", "seq")


def layout_of(p: dict, world: int, seq: int, gbs: int | None = None, source: str = "plan") -> ParallelConfig:
    """The layout of a plan's ``parallel`` object (``source`` names it in errors) on ``world``
    ranks: every field as written (layout_fields.FIELDS) but for :data:`REFIT`: dp fills the ranks
    (tp, pp, cp and so the layer split and recompute layers per chunk are kept), the global batch
    keeps the plan's micro-batch count (at least pp, for the pipeline; at most 4 pp, to stay a
    proxy) unless ``gbs`` is given, and ``seq`` is the run's."""
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
    kept = {x.name: f[x.name] for x in FIELDS if x.name in f and x.name not in REFIT}
    par = ParallelConfig(**{**kept, "dp": dp, "gbs": gbs or mbs * dp * m, "seq": seq})
    # the rules that need the model and the ranks (ep x etp within a stage, heads over tp, the layer
    # split against the layers) are the consumer's: the run's pre-flight validates the fitted layout against both
    bad = [x for x in layout_rules.problems(par) if x.split()[0] in CARRIED_RULES]
    if bad:
        raise LayoutError(f"{source}: invalid parallel layout: " + "; ".join(bad))
    return par


# the first words of the layout rules on carried fields that need neither the model nor the ranks
CARRIED_RULES = ("recompute", "schedule", "cp_comm", "zero", "precision", "rank", "fp8", "layer_split")
