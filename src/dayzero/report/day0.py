"""The Day-0 report: one model on one cluster, from its config to a decision.

:func:`steps` lists the workflow as named steps, each filling one part of the report dict (so a
caller can show progress between them); :func:`build` runs them all. The report holds:

* ``model``: ``dayzero inspect``'s object (parameters total/active/embedding/head, FLOPs per
  token, per layer by component);
* ``cluster``: the cluster and its accelerator's catalog entry;
* ``operators``: ``dayzero ops``'s coverage of the model's real modeling code on the backend
  manifest of the cluster's card (:func:`manifest_for`), or a ``note`` saying why not;
* ``search``: layouts considered, rejected by reason, seconds; ``plans``: the best layouts as
  full predictions (memory per stage, step time, every collective, checks), each with its
  ``training`` (time, energy, cost: :func:`planner.training_cost.cost_of_prediction`);
  ``candidates``: step time and peak memory of the best fitting layouts (the cloud);
  ``uncertainty``: the best plan's ``error_band`` and ``sensitivity`` table (planner/search/error_band.py,
  planner/search/sensitivity.py);
* ``best``: the first plan's figures and the Day-0 ``checks`` (planner/targets.py);
* ``validation`` (with ``validate``): the best plan's proxy run on this machine
  (:func:`dayzero.validate.proxy_plan.run_proxy`: ``dayzero validate``'s result object, measured vs
  predicted and the loss of every step), or a ``note`` saying why it did not run.

:func:`write` puts ``report.json``, ``report.md`` and ``report.html`` in a directory.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dayzero.planner.perf.perf import PerfOptions
from dayzero.planner.targets import MEMORY_TARGET
from dayzero.planner.training_cost import CostOptions, with_training
from dayzero.specs.cluster import Cluster
from dayzero.validate.proxy_plan import ProxyPlan

CLOUD = 500  # fitting layouts drawn in the candidate cloud
_SPEC = "_spec"  # the report's ModelSpec while it is built (:func:`_spec`); build() drops it
# the PyTorch dispatch key a vendor's cards run under: ROCm builds register HIP as CUDA
CUDA_VENDORS = ("nvidia", "amd")


@dataclass(frozen=True)
class ProxyOptions:
    """``--validate``: the proxy run's size (None: the rule of dayzero.validate.proxy_plan)."""

    nproc: int | None = None
    steps: int | None = None
    profile: str | None = None  # a host profile file (default: this host's cached one)


@dataclass(frozen=True)
class Day0Request:
    model: str  # preset, config.json or directory
    cluster: Cluster
    gbs: int = 4096
    seq: int = 4096
    precision: str = "bf16"
    cost: CostOptions = CostOptions()
    perf: PerfOptions = field(default_factory=PerfOptions)
    top_k: int = 5
    max_memory: float = MEMORY_TARGET
    operators: bool = True  # trace the modeling code (needs torch and transformers)
    trust_remote_code: bool = False  # run the modeling_*.py a model directory ships
    validate: ProxyOptions | None = None  # run the best plan at proxy scale here
    announce: Callable[[str], None] = field(default=lambda _: None, compare=False)  # progress notes


def missing(*modules: str) -> list[str]:
    """The modules of ``modules`` that are not installed (the optional sections' check)."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def manifest_for(accelerator) -> tuple[str, str]:
    """The shipped backend manifest (dayzero ops --manifest) for a card, and a note on the choice."""
    vendor = (accelerator.vendor or "").lower()
    if any(v in vendor for v in CUDA_VENDORS):
        return "cuda", f"{accelerator.vendor} cards run PyTorch's CUDA dispatch key (ROCm registers HIP as CUDA)"
    if "huawei" in vendor:
        return "npu", ("Ascend cards run torch_npu's PrivateUse1 kernels: the shipped npu manifest, built from "
                       "torch_npu's published operator lists (ops/manifests/npu.yaml)")
    return "example-npu", (f"no shipped manifest for {accelerator.vendor or accelerator.id}: the illustrative "
                           "example-npu (Core ATen + composite kernels); give your backend's own with "
                           "dayzero ops --manifest FILE")


def _spec(req: Day0Request, r: dict):
    """The request's ModelSpec, loaded once per report (a derived model builds its modeling code on
    the meta device: seconds): kept beside the report, never written with it."""
    from dayzero.specs.registry import load_model

    key = (req.model, req.trust_remote_code)
    if r.get(_SPEC, (None,))[0] != key:
        r[_SPEC] = (key, load_model(req.model, req.trust_remote_code))
    return r[_SPEC][1]


def _model(req: Day0Request, r: dict) -> None:
    from dayzero.report.model_notes import model_report
    from dayzero.specs.counting import summarize

    spec = _spec(req, r)
    r["model"] = model_report(spec, summarize(spec, req.seq))


def _cluster(req: Day0Request, r: dict) -> None:
    cl = req.cluster
    r["cluster"] = {**cl.summary(), "accelerator": cl.accelerator.summary()}
    r["scenario"] = {"gbs": req.gbs, "seq": req.seq, "precision": req.precision, "tokens": req.cost.tokens,
                     "max_memory": req.max_memory}


def _operators(req: Day0Request, r: dict) -> None:
    manifest, why = manifest_for(req.cluster.accelerator)
    absent = missing("torch", "transformers")
    if not req.operators:
        r["operators"] = {"manifest": manifest, "note": "not traced (--no-ops)"}
        return
    if absent:
        r["operators"] = {"manifest": manifest, "note": f"not traced: {' and '.join(absent)} not installed "
                          "(pip install 'dayzero[ops]')"}
        return
    from dayzero.errors import one_line
    from dayzero.ops.report import analyze

    try:
        # decompositions listed, not checked numerically here: `dayzero ops` checks them
        ops = analyze(req.model, manifest=manifest, seq=req.seq, check=False,
                      trust_remote_code=req.trust_remote_code).to_dict()
    except Exception as e:  # noqa: BLE001 - an optional section: its failure is reported, not raised
        r["operators"] = {"manifest": manifest, "note": f"not traced: {one_line(e, None)}"}
        return
    r["operators"] = {"manifest": manifest, "manifest_choice": why, "coverage": ops["coverage"],
                      "coverage_flops": ops["coverage_flops"], "calls": ops["calls"], "distinct": len(ops["ops"]),
                      "unsupported": [{"op": u["op"], "calls": u["unsupported_count"], "flops_share": u["flops_share"],
                                       "needs_kernel": u["needs_kernel"]} for u in ops["unsupported"]],
                      "needs_kernel": ops["needs_kernel"], "seconds": ops["seconds"], "notes": ops["notes"]}


def _plan(req: Day0Request, r: dict) -> None:
    from dayzero.planner.search.search import plan

    obj = plan(_spec(req, r), req.cluster, req.gbs, req.seq, req.precision, req.perf, req.top_k,
               req.max_memory, cloud=CLOUD, uncertainty=True)
    obj = with_training(obj, req.cluster, req.cost)
    r["search"] = {k: obj[k] for k in ("considered", "rejected", "timed", "seconds")}
    r["plans"] = obj["plans"]
    r["candidates"] = obj["candidates"]
    r["uncertainty"] = {k: obj[k] for k in ("error_band", "sensitivity")}


def _best(req: Day0Request, r: dict) -> None:
    b = r["plans"][0]
    t = b["time"]
    r["best"] = {"parallel": b["parallel"], "step_s": t["step_s"], "mfu": b["throughput"]["mfu"],
                 "comm_ratio": b["comm_ratio"], "bubble_ratio": t["bubble_s"] / t["step_s"],
                 "memory_utilization": b["memory"]["utilization"], "peak_bytes": b["memory"]["peak_bytes"],
                 "tokens_per_s": b["throughput"]["tokens_per_s"], "all_pass": all(c["pass"] for c in b["checks"])}
    r["checks"] = b["checks"]
    r["training"] = b["training"]


def _claims(req: Day0Request, r: dict) -> None:
    """The seed's rules of thumb against this model and plan (report/claims.py); the plan's
    recompute is priced against the same layout without it."""
    from dayzero.errors import DayzeroError
    from dayzero.planner.predict import predict
    from dayzero.report.claims import claims
    from dayzero.specs.parallel import ParallelConfig
    from dayzero.specs.registry import load_model

    best = r["plans"][0]
    without = None
    if best["parallel"].get("recompute", "none") != "none":
        par = ParallelConfig.from_dict({**best["parallel"], "recompute": "none", "recompute_layers": None,
                                        "recompute_modules": ()})
        try:
            without = predict(load_model(req.model), par, req.cluster, req.perf)["time"]["compute_s"]
        except DayzeroError:
            without = None
    r["claims"] = claims(r["model"]["params_total"], best, without)


def _validation(req: Day0Request, r: dict) -> None:
    """The best plan's proxy run here, or why not (torch absent; a model or layout the runtime
    does not run: the run's own one-line error)."""
    from dayzero.errors import DayzeroError
    from dayzero.validate.proxy_plan import DEFAULT_STEPS, run_proxy

    if missing("torch"):
        r["validation"] = {"note": "not run: torch not installed (pip install 'dayzero[runtime]')"}
        return
    o = req.validate or ProxyOptions()
    proxy = ProxyPlan(model=req.model, parallel=r["plans"][0]["parallel"], nproc=o.nproc,
                      steps=o.steps or DEFAULT_STEPS, profile=o.profile)
    try:
        r["validation"] = run_proxy(proxy, req.announce)
    except DayzeroError as e:
        r["validation"] = {"note": f"not run: {e}"}


STEPS: tuple[tuple[str, Callable[[Day0Request, dict], None]], ...] = (
    ("model: parameters and FLOPs", _model),
    ("cluster", _cluster),
    ("search: every layout, memory first", _plan),
    ("Day-0 checks, time, energy, cost", _best),
    ("the seed's claims", _claims),
    ("operators: trace the modeling code", _operators),
)


def steps(req: Day0Request) -> list[tuple[str, Callable[[dict], None]]]:
    """The workflow as (label, run) pairs; ``run(report)`` fills its part of ``report``."""
    todo = list(STEPS) + ([("validate: the best plan's proxy run on this machine", _validation)]
                          if req.validate else [])
    return [(label, lambda r, f=f: f(req, r)) for label, f in todo]


def build(req: Day0Request) -> dict:
    report: dict = {}
    for _, run in steps(req):
        run(report)
    return finished(report)


def finished(report: dict) -> dict:
    """The report as written: without the ModelSpec its steps shared."""
    report.pop(_SPEC, None)
    return report


def default_dir(model: str, cluster: Cluster, root: Path = Path("runs")) -> Path:
    """``runs/day0-<model>-<cluster>``, names reduced to file-safe characters."""
    def safe(s: str) -> str:
        return "".join(c if c.isalnum() or c in "-_." else "-" for c in s).strip("-.") or "model"

    name = Path(model).parent.name if Path(model).name == "config.json" else Path(model).name
    return root / f"day0-{safe(name)}-{safe(cluster.name)}"


def write(report: dict, out: Path) -> dict[str, Path]:
    """``report.json``, ``report.md`` and ``report.html`` in ``out`` (created); returns their paths."""
    from dayzero.errors import ConfigError
    from dayzero.jsonable import dumps
    from dayzero.report.day0_html import to_html
    from dayzero.report.day0_render import to_markdown

    try:
        out.mkdir(parents=True, exist_ok=True)
        paths = {"json": out / "report.json", "md": out / "report.md", "html": out / "report.html"}
        paths["json"].write_text(dumps(report) + "\n")
        paths["md"].write_text(to_markdown(report))
        paths["html"].write_text(to_html(report))
    except OSError as e:
        raise ConfigError("--out", None, f"cannot write the report in {out}: {e.strerror or e}") from None
    return paths
