"""A planned layout's proxy run on this machine (``dayzero day0 --validate``).

The plan was chosen for the target cluster (thousands of devices); this machine has a few cores.
The proxy keeps the plan's kind of split and cuts it to the ranks at hand, then runs it through
the same library call ``dayzero validate`` makes (:func:`dayzero.validate.run.validate`), with the
same host profile (:func:`~dayzero.validate.run.host_profile`: the cached measured profile of a CPU
host) and the same proxy model (:func:`~dayzero.validate.run.proxy_shrink`).

The sizing rule (:func:`default_ranks`, :func:`proxy_parallel`):

* ranks: this host's cores (``os.cpu_count()``, what the host profile is keyed by), at most
  :data:`MAX_RANKS` gloo ranks;
* degrees, in the order tp, pp, cp: each becomes its greatest common divisor with the ranks still
  free, so the proxy has tensor parallelism where the plan has it, then a pipeline, and the product
  always divides the ranks; data parallelism fills the rest. ep and etp are cut the same way to what
  the proxy's dp x cp and tp hold; a proxy without a pipeline runs 1F1B without virtual stages;
* what the cut changes or dayzero's runtime does not run is left at ParallelConfig's default
  (:data:`RESET`): the layer counts (the layer split and the recompute layers per chunk, which
  the cut pipeline and the shrunk proxy model no longer hold) and the fields the runtime runs
  only at their defaults (layout_fields.runtime_refused: precision, rank order, the memory
  switches and activation offload);
* steps: :data:`DEFAULT_STEPS` (the loss-trend test needs at least 4), sequence :data:`PROXY_SEQ`
  (``dayzero validate``'s default).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Callable

from dayzero.specs.layout_fields import runtime_refused

MAX_RANKS = 4  # gloo ranks on one CPU host (the runtime's multi-rank tests use at most 4)
DEFAULT_STEPS = 8
PROXY_SEQ = 256
# the plan's fields a proxy leaves at their defaults (the module docstring's rule)
RESET = ("layer_split", "recompute_layers", *(f.name for f in runtime_refused()))


@dataclass(frozen=True)
class ProxyPlan:
    """One proxy run of a plan: the model, the plan's ``parallel`` object, and the run's size
    (``nproc`` None: :func:`default_ranks`; ``profile`` None: this host's cached profile)."""

    model: str
    parallel: dict
    nproc: int | None = None
    steps: int = DEFAULT_STEPS
    profile: str | None = None
    seq: int = PROXY_SEQ
    seed: int = 0


def default_ranks(cores: int | None = None) -> int:
    """This host's cores, at most MAX_RANKS."""
    return max(1, min(cores if cores is not None else (os.cpu_count() or 1), MAX_RANKS))


def proxy_parallel(p: dict, nproc: int) -> dict:
    """The plan's ``parallel`` object cut to ``nproc`` ranks (the rule in the module docstring)."""
    free = nproc
    out = dict(p)
    for k in ("tp", "pp", "cp"):
        out[k] = math.gcd(int(p.get(k, 1)), free)
        free //= out[k]
    dp_cp = free * out["cp"]
    out["ep"] = math.gcd(int(p.get("ep", 1)), dp_cp)
    out["etp"] = math.gcd(int(p.get("etp", 1)), out["tp"])
    if out["pp"] == 1:
        out["vpp"], out["schedule"] = 1, "1f1b"
    out["dp"] = free
    for f in RESET:
        out.pop(f, None)
    return out


def derived_parallel(p: dict, derived: bool) -> tuple[dict, list[str]]:
    """A proxy layout a model derived from its own code runs (runtime.parallel.hf_plan.derived_problems):
    selective recompute becomes full (transformers' attention computes its core inside its forward, so
    the runtime recomputes whole decoder layers); context parallelism is kept (the all-to-all around
    transformers' attention core, runtime.parallel.hf_context; a model whose modules rule it out is
    refused naming the module); what changed, as sentences."""
    if not derived:
        return p, []
    out, changed = dict(p), []
    if out.get("recompute") == "selective":
        out["recompute"], out["recompute_modules"] = "full", []
        changed.append("selective recompute run as full (per decoder layer): transformers' attention computes its "
                       "core inside its forward")
    return out, changed


def run_proxy(req: ProxyPlan, announce: Callable[[str], None] = lambda _: None) -> dict:
    """Run the proxy of ``req`` on this machine: ``dayzero validate``'s result object (checks,
    summary, run, measured, prediction, record) plus ``proxy`` (the rule's choices, the plan's
    layout it was cut from, wall seconds)."""
    from dayzero.runtime.config import ModelSection
    from dayzero.runtime.device import compute_dtype, resolve
    from dayzero.specs.plan_layout import layout_of
    from dayzero.specs.registry import load_model
    from dayzero.validate.run import ValidationRequest, host_profile, local_cluster, proxy_shrink, validate

    t0 = time.perf_counter()
    spec = load_model(req.model)
    nproc = req.nproc or default_ranks()
    acc = resolve()
    dtype = compute_dtype(acc, "auto")
    cluster, profile_file = host_profile(req.profile, nproc, acc, announce)
    cut, changed = derived_parallel(proxy_parallel(req.parallel, nproc), bool(spec.extra.get("derived")))
    par = layout_of(cut, nproc, req.seq)
    shrink = proxy_shrink(spec, par, {}, local_cluster(cluster, nproc).memory_bytes)
    vreq = ValidationRequest(model=ModelSection(req.model, **shrink), parallel=par, steps=req.steps,
                             compute_dtype=dtype, seed=req.seed)
    announce(f"proxy run: {vreq.spec().name} ({', '.join(f'{k} {v}' for k, v in shrink.items()) or 'full size'}), "
             f"{par.describe()} on {nproc} rank(s), {req.steps} steps in {dtype}")
    with acc.exported():
        result = validate(vreq, cluster, nproc)
    result["proxy"] = {"nproc": nproc, "nproc_rule": "given" if req.nproc else f"min(cores, {MAX_RANKS})",
                       "steps": req.steps, "seq": req.seq, "plan_parallel": dict(req.parallel),
                       "layout": par.describe(), "derived_changes": changed, "profile": profile_file or cluster.name,
                       "seconds": time.perf_counter() - t0}
    return result
