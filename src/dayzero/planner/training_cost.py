"""Time, energy and cost to train N tokens with a plan, and what failures at this scale take away.

Inputs are a plan's predicted step (time, tokens per step, model TFLOP/s per device) and the
cluster. Every default below is a published figure or a stated convention; each can be overridden.

* **Power per device**: ``TDP x power_fraction`` with ``power_fraction = 1``: the convention of
  published training-energy reports, "peak power capacity per GPU device ... adjusted for power
  usage efficiency" (Touvron et al. 2023, Llama 2, Table 2 and sec. 2.2.1). ``host_overhead`` adds
  the host's share (CPUs, NICs, switches) as a fraction of device power; ``pue`` the data centre's
  power usage effectiveness (1.0: device energy only; Llama 2 and BLOOM report 1.1-1.2).
* **Interruptions**: 419 unexpected job interruptions in a 54-day snapshot of Llama 3 405B
  pre-training on 16,384 H100 (Llama Team 2024, "The Llama 3 Herd of Models", sec. 3.3.4):
  ``INTERRUPTIONS_PER_DEVICE_DAY = 419 / (54 x 16384)``, so a job of N devices is interrupted
  every ``1 / (rate x N)`` days (failures of independent components add up).
* **Checkpoint cost** (the time a save blocks training): the plan's model states per device over
  the per-device share of the storage fabric's sustained write bandwidth; Llama 3's fabric
  sustains 2 TB/s for 16,384 GPUs (same paper, sec. 3.3.1): ``STORAGE_BYTES_PER_S_PER_DEVICE``.
  An asynchronous save blocks for a fraction of that (``async_blocking``; dayzero's own measured
  1.5-3.3 %, benchmarks/RESULTS_ckpt.md; default 0: a synchronous save).
* **Restart**: detection, rescheduling and reloading after an interruption, ``restart_s``: 10
  minutes, an assumption stated in every output (Llama 3 reports >90 % effective training time
  at 7.8 interruptions a day, i.e. at most ~18 minutes lost per interruption all told).
* **Goodput** (first order, Young 1974; Daly 2006): with checkpoint cost ``d``, interval ``t``,
  restart ``R`` and mean time between interruptions ``M``, the lost fraction is
  ``d / t + (t / 2 + R) / M``; it is smallest at ``t* = sqrt(2 d M)``.
* **Batch schedules** (:func:`batch_ramp`, :func:`schedule_wall_clock`): a published training
  throughput ("H800 GPU-hours per trillion tokens", DeepSeek-V3 Table 1) is wall-clock over the
  whole run, a batch-size ramp (fewer micro-batches, a larger bubble share) and the interruptions
  included; the schedule's time is each phase's steps at the step time of its batch, over the
  goodput above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dayzero.errors import ConfigError

SECONDS_PER_DAY = 86_400.0
INTERRUPTIONS_PER_DEVICE_DAY = 419 / (54 * 16_384)
STORAGE_BYTES_PER_S_PER_DEVICE = 2e12 / 16_384
DEFAULT_RESTART_S = 600.0


@dataclass(frozen=True)
class CostOptions:
    tokens: float = 1e12
    power_fraction: float = 1.0  # of TDP
    host_overhead: float = 0.0  # host power per device, fraction of device power
    pue: float = 1.0
    price_per_device_hour: float | None = None  # currency per device-hour
    interruptions_per_device_day: float = INTERRUPTIONS_PER_DEVICE_DAY
    restart_s: float = DEFAULT_RESTART_S
    storage_bytes_per_s_per_device: float = STORAGE_BYTES_PER_S_PER_DEVICE
    async_blocking: float = 1.0  # fraction of a synchronous save that blocks training (1: synchronous)

    def __post_init__(self):
        checks = {"tokens": (self.tokens, 0, False), "power_fraction": (self.power_fraction, 0, False),
                  "host_overhead": (self.host_overhead, 0, True), "pue": (self.pue, 1, True),
                  "interruptions_per_device_day": (self.interruptions_per_device_day, 0, True),
                  "restart_s": (self.restart_s, 0, True),
                  "storage_bytes_per_s_per_device": (self.storage_bytes_per_s_per_device, 0, False),
                  "async_blocking": (self.async_blocking, 0, True)}
        if self.price_per_device_hour is not None:
            checks["price_per_device_hour"] = (self.price_per_device_hour, 0, True)
        for name, (v, lo, closed) in checks.items():
            if not (isinstance(v, (int, float)) and math.isfinite(v) and (v >= lo if closed else v > lo)):
                raise ConfigError("training cost", name, f"expected a finite number {'>=' if closed else '>'} {lo}, "
                                                         f"got {v!r}")
        if self.power_fraction > 1.5:  # boost above TDP is bounded; 1.5x is far past any card's limit
            raise ConfigError("training cost", "power_fraction", "expected at most 1.5 (of TDP), got "
                                                                 f"{self.power_fraction}")
        if self.async_blocking > 1:
            raise ConfigError("training cost", "async_blocking", "a fraction of a save, at most 1, got "
                                                                 f"{self.async_blocking}")


def goodput(checkpoint_s: float, interval_s: float, restart_s: float, mtbf_s: float) -> float:
    """Fraction of wall time that advances training (first-order Young/Daly model), in [0, 1]."""
    if mtbf_s == math.inf:
        return 1.0 / (1.0 + checkpoint_s / interval_s) if interval_s > 0 else 1.0
    lost = checkpoint_s / interval_s + (interval_s / 2 + restart_s) / mtbf_s
    return max(0.0, 1.0 - lost)


def optimal_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's checkpoint interval ``sqrt(2 d M)`` (seconds)."""
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def failure_model(*, step_s: float, ideal_s: float, devices: int, state_bytes_per_device: float,
                  options: CostOptions = CostOptions()) -> dict:
    """Interruption rate (per second), mean time between interruptions, blocking checkpoint cost,
    Young's checkpoint interval (at least one step; the whole run without interruptions) and the
    goodput of a run of ``ideal_s`` seconds of training in steps of ``step_s`` on ``devices``."""
    o = options
    rate = o.interruptions_per_device_day * devices / SECONDS_PER_DAY
    mtbf_s = 1.0 / rate if rate > 0 else math.inf
    if not math.isfinite(step_s) or step_s >= mtbf_s:
        raise ConfigError("training cost", None, f"one step is predicted to take {step_s:.3g} s, no shorter than the "
                          f"{mtbf_s:.3g} s between interruptions, so no step would finish; the step time follows from "
                          "the cluster's rates and the efficiency constants: check for a bandwidth, peak or "
                          "efficiency near zero")
    ckpt_s = state_bytes_per_device / o.storage_bytes_per_s_per_device * o.async_blocking
    interval = optimal_interval(ckpt_s, mtbf_s) if mtbf_s < math.inf else ideal_s
    interval = max(interval, step_s)  # a checkpoint at most every step
    g = goodput(ckpt_s, interval, o.restart_s, mtbf_s)
    if not g > 0:
        raise ConfigError("training cost", None, f"interruptions every {mtbf_s / 60:.1f} min with {o.restart_s:.0f} s "
                          "restarts leave no time to train; lower --restart-s or the interruption rate")
    return {"rate": rate, "mtbf_s": mtbf_s, "checkpoint_s": ckpt_s, "interval_s": interval, "goodput": g}


def training_cost(*, step_s: float, tokens_per_step: float, devices: int, model_tflops_per_device: float,
                  state_bytes_per_device: float, tdp_w: float | None, options: CostOptions = CostOptions()) -> dict:
    """Wall days, device-hours, energy, cost and expected failure losses of training
    ``options.tokens`` tokens; every assumption listed under ``assumptions``."""
    if not (step_s > 0 and tokens_per_step > 0 and devices >= 1):
        raise ConfigError("training cost", None, f"needs a positive step time and tokens per step, got step "
                          f"{step_s} s, {tokens_per_step} tokens, {devices} devices")
    o = options
    steps = math.ceil(o.tokens / tokens_per_step)
    ideal_s = steps * step_s
    f = failure_model(step_s=step_s, ideal_s=ideal_s, devices=devices, state_bytes_per_device=state_bytes_per_device,
                      options=o)
    rate, mtbf_s, ckpt_s, interval, g = f["rate"], f["mtbf_s"], f["checkpoint_s"], f["interval_s"], f["goodput"]
    wall_s = ideal_s / g
    device_hours = wall_s * devices / 3600
    out = {
        "tokens": o.tokens, "steps": steps, "ideal_days": ideal_s / SECONDS_PER_DAY,
           "wall_days": wall_s / SECONDS_PER_DAY,
        "device_hours": device_hours, "goodput": g,
        "failures": {"interruptions_per_day": rate * SECONDS_PER_DAY, "mtbf_hours": mtbf_s / 3600,
                     "checkpoint_s": ckpt_s, "restart_s": o.restart_s,
                     "optimal_checkpoint_interval_s": interval,
                     "optimal_checkpoint_interval_steps": max(1, round(interval / step_s)),
                     "expected_interruptions": wall_s * rate},
        "energy": None, "cost": None,
        "assumptions": [
            f"{o.interruptions_per_device_day * 16_384:.2f} interruptions/day per 16,384 devices (Llama 3, 419 in 54 "
            "days)",
            f"restart {o.restart_s:.0f} s after each interruption",
            f"checkpoint write {o.storage_bytes_per_s_per_device / 1e6:.0f} MB/s per device"
            + (f", {o.async_blocking:.0%} of it blocking" if o.async_blocking < 1 else " (synchronous)"),
        ],
    }
    if tdp_w:
        device_w = tdp_w * o.power_fraction
        facility_w = device_w * (1 + o.host_overhead) * o.pue
        out["energy"] = {"device_w": device_w, "cluster_mw": facility_w * devices / 1e6,
                         "mwh": facility_w * devices * wall_s / 3600 / 1e6,
                         "model_tflops_per_w": model_tflops_per_device / device_w,
                         "pue": o.pue, "host_overhead": o.host_overhead, "power_fraction": o.power_fraction}
        out["assumptions"].append(f"device power {o.power_fraction:.0%} of TDP {tdp_w:.0f} W, PUE {o.pue:g}, "
                                  f"host overhead {o.host_overhead:.0%}")
    else:
        out["assumptions"].append("no TDP in the catalog for this accelerator: energy not computed")
    if o.price_per_device_hour is not None:
        out["cost"] = {"price_per_device_hour": o.price_per_device_hour,
                       "total": device_hours * o.price_per_device_hour}
    return out


def cost_of_prediction(pred: dict, accelerator, options: CostOptions = CostOptions()) -> dict:
    """:func:`training_cost` of a ``predict`` object (DESIGN.md contract) on its accelerator."""
    p = pred["parallel"]
    busiest = max(pred["memory"]["stages"], key=lambda s: s["total"])
    return training_cost(step_s=pred["time"]["step_s"], tokens_per_step=p["gbs"] * p["seq"], devices=pred["devices"],
                         model_tflops_per_device=pred["throughput"]["model_tflops_per_device"],
                         state_bytes_per_device=busiest["weights"] + busiest["optimizer"],
                         tdp_w=accelerator.tdp_w, options=options)


def with_training(obj: dict, accelerator, options: CostOptions = CostOptions()) -> dict:
    """A ``predict`` object with its ``training`` (:func:`cost_of_prediction`), or a ``plan``
    object with every plan's; the input is not changed."""
    if "plans" in obj:
        return {**obj, "plans": [with_training(p, accelerator, options) for p in obj["plans"]]}
    return {**obj, "training": cost_of_prediction(obj, accelerator, options)}


@dataclass(frozen=True)
class BatchPhase:
    """``tokens`` trained at ``gbs`` sequences per step."""

    tokens: float
    gbs: int


def batch_ramp(start_gbs: int, end_gbs: int, ramp_tokens: float, total_tokens: float, multiple: int = 1,
               phases: int = 8) -> tuple[BatchPhase, ...]:
    """A batch-size schedule: ``start_gbs`` -> ``end_gbs`` sequences over the first ``ramp_tokens``
    tokens, then ``end_gbs`` to ``total_tokens``. The ramp is taken linear in tokens (DeepSeek-V3,
    arXiv 2412.19437 sec. 4.2, says only "gradually increased") and cut into ``phases`` phases of
    equal tokens, each at its mid-point batch rounded to the nearest ``multiple`` (a layout's
    sequences per step come in units of dp x mbs), at least one ``multiple``."""
    if not (0 <= ramp_tokens <= total_tokens and total_tokens > 0 and start_gbs >= 1 and end_gbs >= 1
            and multiple >= 1 and phases >= 1):
        raise ConfigError("batch ramp", None, f"needs 0 <= ramp tokens {ramp_tokens:g} <= total {total_tokens:g}, "
                          f"batches >= 1 (got {start_gbs}, {end_gbs}), multiple {multiple} and phases {phases} >= 1")
    out = []
    if ramp_tokens > 0:
        for i in range(phases):
            mid = start_gbs + (end_gbs - start_gbs) * (i + 0.5) / phases
            out.append(BatchPhase(ramp_tokens / phases, max(multiple, round(mid / multiple) * multiple)))
    if total_tokens > ramp_tokens:
        out.append(BatchPhase(total_tokens - ramp_tokens, end_gbs))
    return tuple(out)


def schedule_wall_clock(phases: tuple[BatchPhase, ...], step_time, *, seq: int, devices: int,
                        state_bytes_per_device: float, options: CostOptions = CostOptions()) -> dict:
    """Wall-clock time and tokens/s per device of training through a batch schedule, the figure a
    published "GPU-hours per trillion tokens" is: each phase's steps (``tokens / (gbs x seq)``,
    fractional) at ``step_time(gbs)`` seconds, then the interruption and checkpoint losses of
    :func:`failure_model` at the schedule's mean step time (``options.tokens`` is ignored: the
    phases give the tokens). Every assumption is listed under ``assumptions``."""
    if not phases or seq < 1 or devices < 1:
        raise ConfigError("training schedule", None, f"needs phases, seq >= 1 and devices >= 1, got {len(phases)} "
                          f"phases, seq {seq}, {devices} devices")
    rows, times = [], {}
    for ph in phases:
        if ph.gbs not in times:
            times[ph.gbs] = float(step_time(ph.gbs))
        steps = ph.tokens / (ph.gbs * seq)
        rows.append({"tokens": ph.tokens, "gbs": ph.gbs, "steps": steps, "step_s": times[ph.gbs],
                     "seconds": steps * times[ph.gbs]})
    tokens = sum(r["tokens"] for r in rows)
    ideal_s = sum(r["seconds"] for r in rows)
    mean_step = ideal_s / sum(r["steps"] for r in rows)
    f = failure_model(step_s=mean_step, ideal_s=ideal_s, devices=devices, state_bytes_per_device=state_bytes_per_device,
                      options=options)
    wall_s = ideal_s / f["goodput"]
    return {"tokens": tokens, "phases": rows, "ideal_s": ideal_s, "wall_s": wall_s, "goodput": f["goodput"],
            "device_hours": wall_s * devices / 3600,
            "ideal_tokens_per_s_per_device": tokens / ideal_s / devices,
            "tokens_per_s_per_device": tokens / wall_s / devices,
            "failures": {"interruptions_per_day": f["rate"] * SECONDS_PER_DAY, "mtbf_hours": f["mtbf_s"] / 3600,
                         "checkpoint_s": f["checkpoint_s"], "checkpoint_interval_s": f["interval_s"],
                         "restart_s": options.restart_s},
            "assumptions": [
                f"{len(phases)} batch phases, {rows[0]['gbs']} -> {rows[-1]['gbs']} sequences per step",
                f"{options.interruptions_per_device_day * 16_384:.2f} interruptions/day per 16,384 devices (Llama 3, "
                "419 in 54 days)",
                f"restart {options.restart_s:.0f} s after each interruption",
                f"checkpoint write {options.storage_bytes_per_s_per_device / 1e6:.0f} MB/s per device, every "
                f"{f['interval_s'] / 60:.0f} min (Young's interval)"]}


def runnable_gbs(parallel, gbs: int, devices: int | None = None) -> int:
    """The smallest batch >= ``gbs``, in units of dp x mbs, that ``parallel`` can run (its
    schedule's micro-batch rules: DualPipe >= 2 pp and even, interleaved a multiple of pp; the
    model is not asked: the planner splits layers unevenly where pp does not divide them)."""
    from dataclasses import replace

    unit = parallel.dp * parallel.mbs
    g = max(unit, -(-gbs // unit) * unit)
    for _ in range(100_000):
        if not replace(parallel, gbs=g).problems(None, devices):
            return g
        g += unit
    raise ConfigError("training schedule", None, f"no batch >= {gbs} runs on {parallel.describe()}")


def layout_wall_clock(spec, parallel, cluster, phases: tuple[BatchPhase, ...], options=None, memory_options=None,
                      cost: CostOptions = CostOptions()) -> dict:
    """:func:`schedule_wall_clock` of one layout through a batch schedule, each phase's step
    predicted (``planner.predict``) at its batch; a batch the layout cannot run is timed at the
    tokens/s of :func:`runnable_gbs` (its step time x gbs / that batch: a bubble share no larger
    than the runnable batch's, so optimistic, and said in ``assumptions``). The checkpointed state
    is the busiest rank's weights and optimizer states at the last phase's batch."""
    from dataclasses import replace

    from dayzero.planner.predict import predict

    preds: dict[int, dict] = {}

    def pred(g: int) -> dict:
        if g not in preds:
            preds[g] = predict(spec, replace(parallel, gbs=g), cluster, options, memory_options=memory_options)
        return preds[g]

    def step_s(gbs: int) -> float:
        g = runnable_gbs(parallel, gbs, cluster.devices)
        return pred(g)["time"]["step_s"] * gbs / g

    last = pred(runnable_gbs(parallel, phases[-1].gbs, cluster.devices))
    busiest = max(last["memory"]["stages"], key=lambda s: s["total"])
    out = schedule_wall_clock(phases, step_s, seq=parallel.seq, devices=last["devices"],
                              state_bytes_per_device=busiest["weights"] + busiest["optimizer"], options=cost)
    short = sorted({p.gbs for p in phases if runnable_gbs(parallel, p.gbs, cluster.devices) != p.gbs})
    if short:
        out["assumptions"].append(f"batches {', '.join(map(str, short))} cannot run on this layout: timed at the "
                                  "tokens/s of the smallest batch above each that can")
    return out
