"""Run a plan on the runtime at proxy scale and measure it against the planner's prediction.

    request  = ValidationRequest(ModelSection(model, **shrink), parallel, ...)   the same layout, shrunk
    ranks    = run_ranks(run_rank, nproc)          runtime.train.train_step on every rank
    measured = measure(ranks)                      step time, MFU, memory, comm ratio, loss trend
    result   = validate(request, cluster)          + prediction, targets table (validate.targets)

Per rank, odd steady steps run under the PyTorch profiler (``runtime.metrics.CommTimer``: the
time of gloo work items or the accelerator's communication kernels) and even ones without it, so step time is measured
without profiling overhead and communication from the profiled steps. The first step pays
one-time setup and is not measured.

* step time: median of the unprofiled steady steps (rank 0; collectives keep ranks in step).
* communication ratio: per rank, time inside collectives over the profiled steps' time; the
  mean over ranks (the largest rank's is reported too). On an oversubscribed CPU host this
  includes waiting for peers that the OS has descheduled.
* peak memory: per rank, peak resident set size on CPU, or on an accelerator the peak reserved by
  PyTorch's allocator plus what the device context and communicators hold (device memory used
  before the first step minus PyTorch's own).
* MFU: model FLOPs per step (causal attention, no recompute) / step time / (ranks x the
  calibrated peak of the compute dtype).
* loss: the global loss of every step, tested by validate.loss_trend.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, replace

from dayzero.errors import LayoutError
from dayzero.jsonable import finite as json_finite
from dayzero.jsonable import plain as json_plain
from dayzero.planner.targets import MEMORY_TARGET
from dayzero.runtime.config import ModelSection, OptimizerSection, TrainConfig
from dayzero.specs.cluster import Cluster
from dayzero.specs.counting import flops_per_token
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import ParallelConfig
from dayzero.validate.loss_trend import loss_trend
from dayzero.validate.targets import Measured, checks, summary


@dataclass(frozen=True)
class ValidationRequest:
    """A validation run: the training run's own sections (what to build and how to optimize it),
    the layout, and the run-level fields whose defaults differ for a short measured run."""

    model: ModelSection  # preset, config.json or directory, and the proxy sizes (ModelSpec.shrink)
    parallel: ParallelConfig
    steps: int = 12
    compute_dtype: str = "fp32"
    seed: int = 0
    optimizer: OptimizerSection = field(default_factory=OptimizerSection)
    data: str | None = None
    reset_attention_mask: bool = False  # packed documents, attention within each (TrainConfig's)

    @property
    def shrink(self) -> dict:
        return self.model.shrink

    def spec(self) -> ModelSpec:
        return self.model.spec()

    def train_config(self) -> TrainConfig:
        """The TrainConfig every rank builds its state from (quiet, communication timed)."""
        return TrainConfig(model=self.model, parallel=self.parallel, optimizer=self.optimizer, steps=self.steps,
                           seed=self.seed, compute_dtype=self.compute_dtype, data=self.data, quiet=True,
                           measure_comm=True, reset_attention_mask=self.reset_attention_mask)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["parallel"] = self.parallel.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ValidationRequest":
        d = dict(d)
        d["parallel"] = ParallelConfig.from_dict(d["parallel"])
        d["model"] = ModelSection(**d["model"])
        d["optimizer"] = OptimizerSection(**d.get("optimizer", {}))
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def proxy_shrink(spec: ModelSpec, parallel: ParallelConfig, given: dict, capacity_bytes: float) -> dict:
    """The proxy sizing: what the user gave, or, when the full model does not fit the machine
    (planner memory above 85 % of a rank's memory), a small model of the same architecture: 4
    layers per pipeline stage, width 256, 8 experts (at least 2 per EP rank), vocab 512."""
    from dayzero.runtime.checks import check_layout

    check_layout(parallel)  # a layout that cannot run gets no proxy (and no division by a zero degree)
    if any(v is not None for v in given.values()):
        return {k: v for k, v in given.items() if v is not None}
    from dayzero.planner.memory.memory import estimate_memory
    from dayzero.runtime.planner_view import memory_options, runtime_layout

    eff = runtime_layout(parallel)
    try:
        peak = estimate_memory(spec, eff, capacity_bytes, memory_options(None, "fp32", spec, eff)).peak_bytes
    except LayoutError:
        peak = float("inf")
    if peak <= MEMORY_TARGET * capacity_bytes:
        return {}
    out = {"layers": 4 * parallel.pp * parallel.vpp, "hidden": 256, "vocab": 512}
    if spec.moe is not None:
        out["experts"] = max(8, 2 * parallel.ep)
    return out


# -- on every rank -------------------------------------------------------------------------------

def run_rank(args: dict) -> dict:
    """One rank of a validation run (called through validate.launch.run_ranks)."""
    import torch.distributed as dist

    from dayzero.runtime.device import memory_stats
    from dayzero.runtime.distributed import init_distributed
    from dayzero.runtime.metrics import CommTimer, peak_memory_bytes
    from dayzero.runtime.train import build_state, train_step

    req = ValidationRequest.from_dict(args["request"])
    device = init_distributed()
    state = build_state(req.train_config(), device)
    context = memory_stats(device).context or 0
    world = dist.get_world_size()
    profiled_timer, plain_timer = CommTimer(world > 1, device), CommTimer(False, device)
    records = []
    for i in range(req.steps):
        profiled = world > 1 and i % 2 == 1
        timer = profiled_timer if profiled else plain_timer
        rec = train_step(state, timer)
        records.append({"step": rec.step, "loss": rec.loss, "grad_norm": rec.grad_norm, "step_time_s": rec.step_time_s,
                        "comm_s": timer.seconds if profiled else 0.0, "profiled": profiled})
    peak_reserved = memory_stats(device).peak_reserved
    peak = peak_memory_bytes(device) if peak_reserved is None else int(peak_reserved) + int(context)
    return {"rank": dist.get_rank(), "records": records, "peak_memory_bytes": peak, "device": device.type}


# -- in the parent ------------------------------------------------------------------------------

def peak_flops(cluster: Cluster, compute_dtype: str) -> float:
    """The calibrated peak of one rank in the compute dtype (profile fits, else the catalog)."""
    fits = (cluster.measurements or {}).get("fits", {})
    if compute_dtype in fits:
        return fits[compute_dtype]["peak_tflops"] * 1e12
    return cluster.accelerator.peak("bf16" if compute_dtype == "bf16" else "fp32")


def measure(ranks: list[dict], spec: ModelSpec, parallel: ParallelConfig, cluster: Cluster,
            compute_dtype: str) -> dict:
    """Aggregate the ranks' records (see the module docstring)."""
    r0 = ranks[0]["records"]
    steady = r0[1:] or r0
    plain = [r["step_time_s"] for r in steady if not r["profiled"]] or [r["step_time_s"] for r in steady]
    step_time = float(statistics.median(plain))
    ratios = []
    for rank in ranks:
        prof = [r for r in rank["records"][1:] if r["profiled"]]
        t = sum(r["step_time_s"] for r in prof)
        if t > 0:
            ratios.append(sum(r["comm_s"] for r in prof) / t)
    peaks = [int(r["peak_memory_bytes"]) for r in ranks]
    flops = flops_per_token(spec, parallel.seq, causal=True).train * parallel.gbs * parallel.seq
    mfu = flops / step_time / (len(ranks) * peak_flops(cluster, compute_dtype))
    losses = [r["loss"] for r in r0]
    # a diverged run measures non-finite losses: a measurement, kept as null (the loss trend says
    # ``finite: false`` and fails), unlike a computed number, which the strict JSON writer refuses
    return json_finite(json_plain({
        "step_time_s": step_time, "step_times_s": [r["step_time_s"] for r in r0],
        "comm_ratio": float(statistics.mean(ratios)) if ratios else 0.0,
        "comm_ratio_max": max(ratios) if ratios else 0.0,
        "peak_memory_bytes": max(peaks), "peak_memory_per_rank": peaks, "mfu": mfu, "model_flops_per_step": flops,
        "losses": losses, "loss_trend": loss_trend(losses).to_dict()}))


def record_of(request: ValidationRequest, spec: ModelSpec, measured: dict, label: str | None = None) -> dict:
    """What the calibration loop keeps of a run (validate.fit.observation_from_record)."""
    return {"label": label or f"{spec.name} {request.parallel.describe()}", "model": request.model.name,
            "shrink": dict(request.shrink), "parallel": request.parallel.to_dict(),
            "layout": request.parallel.describe(),
            "compute_dtype": request.compute_dtype, "step_time_s": measured["step_time_s"],
            "comm_ratio": measured["comm_ratio"], "peak_memory_bytes": measured["peak_memory_bytes"],
            "device": measured.get("device")}


def host_profile(path: str | None, nproc: int, acc, announce=lambda _: None,
                 measure: bool = True) -> tuple[Cluster | None, str | None]:
    """The profile to predict a run here with, and its file when it has one: ``path``
    (``--cluster``), or on an accelerator the catalog entry of the device's own name (no file), else
    a measured profile of this host (made once and cached: :mod:`dayzero.validate.host_cache`).
    Without ``measure`` (a pre-flight) a host with no cached profile gets (None, the file the run
    would measure into)."""
    from dayzero.errors import ConfigError
    from dayzero.specs.cluster import build_cluster, get_cluster

    if path:
        return get_cluster(path), path
    if not acc.is_cpu:
        import torch

        from dayzero.runtime.device import device_name
        from dayzero.specs.hardware import resolve_accelerator

        entry = resolve_accelerator(device_name(torch.device(acc.type, 0)))
        if entry is not None:
            return build_cluster(entry, nproc, nproc), None
    if acc.is_cpu:
        from dayzero.validate.host_cache import HostKey, cached_profile, profile_path

        if not measure and not profile_path(HostKey.here(nproc)).exists():
            return None, str(profile_path(HostKey.here(nproc)))
        cached = str(cached_profile(nproc, announce))
        return get_cluster(cached), cached
    raise ConfigError("--cluster", None, f"no hardware profile for this {acc.type} device in the catalog; run `dayzero "
                      f"calibrate --nproc {nproc} --out host.yaml` and pass --cluster host.yaml")


def unmeasured_capacity(nproc: int) -> float:
    """Memory per rank of this host before its profile is measured: what the measured profile
    will say (:func:`dayzero.validate.profile.host_rank_memory_gb`)."""
    from dayzero.specs.hardware import HBM_GB
    from dayzero.validate.host_cache import HostKey
    from dayzero.validate.profile import host_rank_memory_gb

    return host_rank_memory_gb(HostKey.here(nproc).memory_bytes, nproc) * HBM_GB


def local_cluster(cluster: Cluster, nproc: int) -> Cluster:
    """The profile's machine running ``nproc`` local ranks: one node, its scale-up tier."""
    from dataclasses import replace

    t0 = replace(cluster.tiers[0], size=nproc)
    return replace(cluster, nodes=1, devices_per_node=nproc, tiers=(t0,))


def evaluate_run(request: ValidationRequest, cluster: Cluster, ranks: list[dict], step_tolerance: float = 0.20) -> dict:
    """The result object: checks (the issue's contract), run, measured, prediction, record."""
    from dayzero.validate.predicted import predict_run

    spec = with_trained_documents(request, request.spec())
    cluster = local_cluster(cluster, len(ranks))
    device = ranks[0]["device"]
    measured = measure(ranks, spec, request.parallel, cluster, request.compute_dtype)
    measured["device"] = device
    prediction = predict_run(spec, request.parallel, cluster, request.compute_dtype, device=device)
    m = Measured(step_time_s=measured["step_time_s"], mfu=measured["mfu"],
                 peak_memory_bytes=measured["peak_memory_bytes"], capacity_bytes=cluster.memory_bytes,
                 comm_ratio=measured["comm_ratio"], loss=loss_trend(measured["losses"]))
    rows = checks(m, prediction, step_tolerance=step_tolerance)
    run = {"model": spec.name, "model_source": request.model.name, "proxy": _proxy_text(request.shrink),
           "shrink": dict(request.shrink), "layout": request.parallel.describe(),
           "parallel": request.parallel.to_dict(),
           "ranks": len(ranks), "device": device, "compute_dtype": request.compute_dtype, "steps": request.steps,
           "cluster": cluster.name, "seed": request.seed, "lr": request.optimizer.lr}
    if spec.document_length is not None:  # what the prediction priced: the trained windows' documents
        run["document_length"] = spec.document_length
    if spec.extra.get("derived"):  # the planner's spec of a model derived from its own code: what it approximates
        run["derived_from_modeling_code"] = True
        run["approximations"] = list(spec.extra.get("approximations", ()))
        run["proxy_notes"] = list(spec.extra.get("proxy_notes", ()))
        shapes = predict_run(shapes_only(spec), request.parallel, cluster, request.compute_dtype, device=device)
        run["approximation_share"] = approximation_share(measured, prediction, shapes)
    return {"checks": rows, "summary": summary(rows), "run": run, "measured": measured, "prediction": prediction,
            "record": record_of(request, spec, measured)}


def shapes_only(spec: ModelSpec) -> ModelSpec:
    """A derived model's spec without what its shapes do not give: the per-layer and outside parameters
    the module tree holds beyond them, and the traced FLOPs and activations (dayzero.derive)."""
    return replace(spec, layer_extra=(), outside_extra=0, layer_flops_extra=(), layer_act_extra=(),
                   layer_act_reference=())


def approximation_share(measured: dict, prediction: dict, shapes: dict) -> dict:
    """How much of a derived model's measured-vs-predicted difference its approximated terms can
    account for, per metric (step time, peak memory): the terms are what the prediction adds to the
    planner's own shapes (``terms`` = predicted - shapes-only predicted); the difference is
    predicted - measured; ``share`` = min(1, |terms| / |difference|) bounds the part of the difference
    that an error in those terms could explain (1: all of it; 0: the terms are nothing)."""
    out = {}
    for metric, m, p, q in (("step_time", measured["step_time_s"], prediction["time"]["step_s"],
                             shapes["time"]["step_s"]),
                            ("peak_memory", measured["peak_memory_bytes"], prediction["memory"]["peak_bytes"],
                             shapes["memory"]["peak_bytes"])):
        terms, diff = p - q, p - m
        out[metric] = {"measured": m, "predicted": p, "predicted_shapes_only": q, "terms": terms, "difference": diff,
                       "share": min(1.0, abs(terms) / abs(diff)) if diff else (0.0 if not terms else 1.0)}
    return out


def with_trained_documents(request: ValidationRequest, spec: ModelSpec) -> ModelSpec:
    """``spec`` priced as the run trained it: with per-document attention, the document length of the
    windows the run consumed (steps x gbs samples from the start of the stream:
    :meth:`~dayzero.runtime.data.TokenStream.document_length`), rounded to a token; else unchanged."""
    if not request.reset_attention_mask:
        return spec
    from dayzero.runtime.data import TokenStream, resolve_data

    p = request.parallel
    stream = TokenStream(resolve_data(request.data), p.seq, request.seed, spec.vocab)
    return replace(spec, document_length=max(1, round(stream.document_length(request.steps * p.gbs))))


def _proxy_text(shrink: dict) -> str:
    kw = {k: v for k, v in shrink.items() if v is not None}
    return ", ".join(f"{k} {v}" for k, v in kw.items()) if kw else "full size"


def validate(request: ValidationRequest, cluster: Cluster, nproc: int, step_tolerance: float = 0.20) -> dict:
    """Run ``request`` on ``nproc`` local ranks and build the result object."""
    from dayzero.validate.launch import run_ranks
    from dayzero.validate.preflight import preflight_validate

    preflight_validate(request, nproc)  # one line before any rank starts (also `dayzero validate --dry-run`)
    ranks = run_ranks("dayzero.validate.run:run_rank", {"request": request.to_dict()}, nproc)
    return evaluate_run(request, cluster, ranks, step_tolerance)
