"""Time, energy and cost to train N tokens with a plan, and what failures at this scale take away.

Inputs are a plan's predicted step (time, tokens per step, model TFLOP/s per device) and the
cluster. Every default below is a published figure or a stated convention; each can be overridden.

* **Power** at the device, node (host share) and facility (switches, PUE): planner/facility.py,
  each figure with its source; ``host_overhead`` (a fraction of device power), ``pue`` and the
  others of :class:`~dayzero.planner.facility.PowerOptions` override them.
* **Price**: ``price_per_device_hour`` where given, else the card's public offer (``price_offer``,
  by default its first) in ``presets/data/device_prices.json``: a rental rate or a purchase
  amortized straight-line over stated years, with its source and date in the output and the card's
  other offers beside it; else no cost; energy costs ``electricity_per_kwh`` x facility kWh where given.
* **Interruptions** by component (accelerator, network, software per device-hour; host and
  planned maintenance per node-hour), Llama 3's 466 in 54 days on 16,384 H100 by default, or a
  team's incident log (planner/failures.py); ``interruptions_per_device_day`` replaces them with
  one flat rate.
* **Checkpoint cost** (the time a save blocks training): the plan's model states per device over
  the per-device share of the storage fabric's sustained write bandwidth; Llama 3's fabric
  sustains 2 TB/s for 16,384 GPUs (same paper, sec. 3.3.1): ``STORAGE_BYTES_PER_S_PER_DEVICE``.
  An asynchronous save blocks for a fraction of that (``async_blocking``; dayzero's own measured
  1.5-3.3 %, benchmarks/RESULTS_ckpt.md; default 1: a synchronous save).
* **Restart**: relaunch (``relaunch_s``: detection, rescheduling, process start and communicator
  set-up, 10 minutes: an assumption stated in every output, inside Llama 3's bound of >90 %
  effective training time at 8.6 interruptions a day, i.e. at most ~17 minutes lost per
  interruption all told) plus reading the checkpoint back at the same per-device bandwidth;
  ``restart_s`` fixes the whole restart instead.
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

import json
import math
from dataclasses import dataclass
from functools import lru_cache

from dayzero.errors import ConfigError
from dayzero.planner.facility import FacilityPower, PowerOptions, facility_power
from dayzero.planner.failures import FailureRates, default_rates, restart_seconds
from dayzero.specs import layout_rules
from dayzero.specs.presets import reference_data

SECONDS_PER_DAY = 86_400.0
INTERRUPTIONS_PER_DEVICE_DAY = 419 / (54 * 16_384)  # Llama 3's unexpected interruptions, as one flat rate
STORAGE_BYTES_PER_S_PER_DEVICE = 2e12 / 16_384
DEFAULT_RELAUNCH_S = 600.0


@dataclass(frozen=True)
class CostOptions:
    tokens: float = 1e12
    power_fraction: float = 1.0  # of TDP
    host_overhead: float | None = None  # host power per device, fraction of device power (None: the system's)
    pue: float | None = None  # None: facility.json's survey average
    price_per_device_hour: float | None = None  # currency per device-hour (None: the card's public price)
    price_offer: str | None = None  # which of the card's public offers (None: its first; device_prices.json)
    electricity_per_kwh: float | None = None  # currency per facility kWh
    interruptions_per_device_day: float | None = None  # one flat rate instead of the component rates
    failure_rates: FailureRates | None = None  # a team's own (planner/failures.py); None: Llama 3's
    relaunch_s: float = DEFAULT_RELAUNCH_S
    restart_s: float | None = None  # the whole restart, fixed (None: relaunch + checkpoint read)
    storage_bytes_per_s_per_device: float = STORAGE_BYTES_PER_S_PER_DEVICE
    async_blocking: float = 1.0  # fraction of a synchronous save that blocks training (1: synchronous)

    def __post_init__(self):
        checks = {"tokens": (self.tokens, 0, False), "power_fraction": (self.power_fraction, 0, False),
                  "relaunch_s": (self.relaunch_s, 0, True),
                  "storage_bytes_per_s_per_device": (self.storage_bytes_per_s_per_device, 0, False),
                  "async_blocking": (self.async_blocking, 0, True)}
        for name, lo, closed in (("price_per_device_hour", 0, True), ("electricity_per_kwh", 0, True),
                                 ("host_overhead", 0, True), ("pue", 1, True),
                                 ("interruptions_per_device_day", 0, True), ("restart_s", 0, True)):
            if getattr(self, name) is not None:
                checks[name] = (getattr(self, name), lo, closed)
        for name, (v, lo, closed) in checks.items():
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                    and (v >= lo if closed else v > lo)):
                raise ConfigError("training cost", name, f"expected a finite number {'>=' if closed else '>'} {lo}, "
                                                         f"got {v!r}")
        if self.power_fraction > 1.5:  # boost above TDP is bounded; 1.5x is far past any card's limit
            raise ConfigError("training cost", "power_fraction", "expected at most 1.5 (of TDP), got "
                                                                 f"{self.power_fraction}")
        if self.async_blocking > 1:
            raise ConfigError("training cost", "async_blocking", "a fraction of a save, at most 1, got "
                                                                 f"{self.async_blocking}")

    @property
    def power(self) -> PowerOptions:
        return PowerOptions(power_fraction=self.power_fraction, pue=self.pue, host_overhead=self.host_overhead)


HOURS_PER_YEAR = 8_760


@dataclass(frozen=True)
class Price:
    """One device-hour's price and where it came from; ``others``: the card's other public offers
    (name, price per device-hour, source), listed beside it."""

    per_device_hour: float
    source: str
    url: str = ""
    offer: str = "given"
    others: tuple[tuple[str, float, str], ...] = ()
    kind: str = "given"  # rental (a rate paid per hour) | purchase (amortized) | given



def offer_rate(entry: dict) -> float:
    """USD per device-hour of one ``device_prices.json`` offer: its rental rate, or its purchase
    price amortized straight-line over ``amortization_years`` of 8,760 hours."""
    if "usd_per_device_hour" in entry:
        return float(entry["usd_per_device_hour"])
    return float(entry["purchase_usd_per_device"]) / (float(entry["amortization_years"]) * HOURS_PER_YEAR)


def _offer_text(e: dict) -> str:
    return f"USD {e['offer']}, {e['basis']}, {e['date']}"


@lru_cache(maxsize=1)
def device_prices() -> dict:
    """``presets/data/device_prices.json``'s offers per accelerator id, read once (as facility_data)."""
    return json.loads(reference_data("device_prices.json").read_text())["prices"]


def device_price(accelerator_id: str, given: float | None, offer: str | None = None) -> Price | None:
    """The price of one device-hour: the one given, else the card's public offer named ``offer``
    (None: its first) from ``device_prices.json`` with its source and date and the card's other
    offers beside it, else None. An offer the card lacks is a one-line ConfigError naming those it has."""
    if given is not None:
        return Price(given, "given (--price-per-device-hour)")
    offers = device_prices().get(accelerator_id)
    if not offers:
        if offer is not None:
            raise ConfigError("price offer", offer, f"no public price for {accelerator_id}; give "
                              "--price-per-device-hour")
        return None
    names = [e["offer"] for e in offers]
    if offer is not None and offer not in names:
        raise ConfigError("price offer", offer, f"{accelerator_id} has {', '.join(names)}")
    chosen = offers[names.index(offer) if offer is not None else 0]
    others = tuple((e["offer"], offer_rate(e), f"{_offer_text(e)} ({e['source']})") for e in offers if e is not chosen)
    kind = "rental" if "usd_per_device_hour" in chosen else "purchase"
    return Price(offer_rate(chosen), _offer_text(chosen), chosen["source"], chosen["offer"], others, kind)


def goodput(checkpoint_s: float, interval_s: float, restart_s: float, mtbf_s: float) -> float:
    """Fraction of wall time that advances training (first-order Young/Daly model), in [0, 1]."""
    if mtbf_s == math.inf:
        return 1.0 / (1.0 + checkpoint_s / interval_s) if interval_s > 0 else 1.0
    lost = checkpoint_s / interval_s + (interval_s / 2 + restart_s) / mtbf_s
    return max(0.0, 1.0 - lost)


def optimal_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's checkpoint interval ``sqrt(2 d M)`` (seconds)."""
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    return f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def failure_model(*, step_s: float, ideal_s: float, devices: int, state_bytes_per_device: float,
                  options: CostOptions = CostOptions(), devices_per_node: int = 8) -> dict:
    """Interruption rate (per second) and its classes, mean time between interruptions, blocking
    checkpoint cost, restart cost, Young's checkpoint interval (at least one step; the whole run
    without interruptions) with its reason, and the goodput of a run of ``ideal_s`` seconds of
    training in steps of ``step_s`` on ``devices``."""
    o = options
    if o.interruptions_per_device_day is not None:
        rate = o.interruptions_per_device_day * devices / SECONDS_PER_DAY
        by_class = {"all": o.interruptions_per_device_day * devices}
        rates_text = f"{o.interruptions_per_device_day:g} interruptions per device-day (given)"
    else:
        rates = o.failure_rates or default_rates()
        rate = rates.job_rate_per_hour(devices, devices_per_node) / 3600
        by_class = rates.by_class_per_day(devices, devices_per_node)
        rates_text = (f"interruptions by component from {rates.source} ({rates.fitted_on})"
                      + ("" if o.failure_rates else "; no published breakdown for other cards: these rates assumed"))
    mtbf_s = 1.0 / rate if rate > 0 else math.inf
    if not math.isfinite(step_s) or step_s >= mtbf_s:
        raise ConfigError("training cost", None, f"one step is predicted to take {step_s:.3g} s, no shorter than the "
                          f"{mtbf_s:.3g} s between interruptions, so no step would finish; the step time follows from "
                          "the cluster's rates and the efficiency constants: check for a bandwidth, peak or "
                          "efficiency near zero")
    write_s = state_bytes_per_device / o.storage_bytes_per_s_per_device
    ckpt_s = write_s * o.async_blocking
    restart_s = (o.restart_s if o.restart_s is not None
                 else restart_seconds(state_bytes_per_device, o.storage_bytes_per_s_per_device, o.relaunch_s))
    if mtbf_s < math.inf:
        young = optimal_interval(ckpt_s, mtbf_s)
        interval = max(young, step_s)
        reason = (f"Young's interval sqrt(2 x {ckpt_s:.3g} s blocking save x {_duration(mtbf_s)} between "
                  f"interruptions) = {_duration(young)}"
                  + (f", raised to one step ({step_s:.3g} s)" if young < step_s else ""))
    else:
        interval = max(ideal_s, step_s)
        reason = "no interruptions expected: one checkpoint at the end"
    g = goodput(ckpt_s, interval, restart_s, mtbf_s)
    if not g > 0:
        raise ConfigError("training cost", None, f"interruptions every {mtbf_s / 60:.1f} min with {restart_s:.0f} s "
                          "restarts leave no time to train; check the interruption rate, the storage bandwidth and "
                          "the relaunch time")
    return {"rate": rate, "mtbf_s": mtbf_s, "checkpoint_s": ckpt_s, "restart_s": restart_s, "interval_s": interval,
            "interval_reason": reason, "goodput": g, "by_class_per_day": by_class, "rates_text": rates_text}


def _energy(power: FacilityPower, devices: int, wall_s: float, tokens: float, model_tflops_per_device: float) -> dict:
    hours = wall_s / 3600
    mwh = {lvl: w * devices * hours / 1e6 for lvl, w in (("device", power.device_w), ("node", power.node_w),
                                                          ("it", power.it_w), ("facility", power.facility_w))}
    return {"device_w": power.device_w, "host_w": power.host_w, "network_w": power.network_w, "pue": power.pue,
            "facility_w_per_device": power.facility_w, "cluster_mw": power.facility_w * devices / 1e6,
            "device_mwh": mwh["device"], "node_mwh": mwh["node"], "it_mwh": mwh["it"], "mwh": mwh["facility"],
            "tokens_per_joule": {lvl: tokens / (m * 3.6e9) for lvl, m in mwh.items() if m > 0},
            "model_tflops_per_w": model_tflops_per_device / power.device_w, "basis": list(power.basis)}


def training_cost(*, step_s: float, tokens_per_step: float, devices: int, model_tflops_per_device: float,
                  state_bytes_per_device: float, power: FacilityPower | None, price: Price | None = None,
                  devices_per_node: int = 8, options: CostOptions = CostOptions()) -> dict:
    """Wall days, device-hours, energy at each level, cost and expected failure losses of training
    ``options.tokens`` tokens; every assumption listed under ``assumptions``."""
    if not (step_s > 0 and tokens_per_step > 0 and devices >= 1 and math.isfinite(step_s)):
        raise ConfigError("training cost", None, f"needs a positive step time and tokens per step, got step "
                          f"{step_s} s, {tokens_per_step} tokens, {devices} devices")
    o = options
    steps = math.ceil(o.tokens / tokens_per_step)
    ideal_s = steps * step_s
    f = failure_model(step_s=step_s, ideal_s=ideal_s, devices=devices, state_bytes_per_device=state_bytes_per_device,
                      options=o, devices_per_node=devices_per_node)
    rate, mtbf_s, ckpt_s, interval, g = f["rate"], f["mtbf_s"], f["checkpoint_s"], f["interval_s"], f["goodput"]
    wall_s = ideal_s / g
    device_hours = wall_s * devices / 3600
    out = {
        "tokens": o.tokens, "steps": steps, "ideal_days": ideal_s / SECONDS_PER_DAY,
        "wall_days": wall_s / SECONDS_PER_DAY,
        "device_hours": device_hours, "goodput": g,
        "failures": {"interruptions_per_day": rate * SECONDS_PER_DAY, "mtbf_hours": mtbf_s / 3600,
                     "interruptions_per_day_by_component": f["by_class_per_day"],
                     "checkpoint_s": ckpt_s, "restart_s": f["restart_s"],
                     "optimal_checkpoint_interval_s": interval,
                     "optimal_checkpoint_interval_steps": max(1, round(interval / step_s)),
                     "interval_reason": f["interval_reason"],
                     "expected_interruptions": wall_s * rate},
        "energy": None, "cost": None,
        "assumptions": [
            f["rates_text"],
            (f"restart {o.restart_s:.0f} s after each interruption (given)" if o.restart_s is not None else
             f"restart {f['restart_s']:.0f} s: relaunch {o.relaunch_s:.0f} s (assumed) + reading the checkpoint back"),
            f"checkpoint write {o.storage_bytes_per_s_per_device / 1e6:.0f} MB/s per device (Llama 3's 2 TB/s for "
            "16,384 GPUs)" + (f", {o.async_blocking:.0%} of it blocking" if o.async_blocking < 1 else " (synchronous)"),
        ],
    }
    if power is not None:
        out["energy"] = _energy(power, devices, wall_s, o.tokens, model_tflops_per_device)
        out["assumptions"] += list(power.basis)
    else:
        out["assumptions"].append("no TDP in the catalog for this accelerator: energy not computed")
    cost = {}
    if price is not None:
        cost.update(price_per_device_hour=price.per_device_hour, price_source=price.source, price_url=price.url,
                    price_offer=price.offer, price_kind=price.kind, devices_total=device_hours * price.per_device_hour)
        if price.others:  # the card's other public offers, each with the total it would give
            cost["other_offers"] = [{"offer": name, "price_per_device_hour": rate, "source": src,
                                     "devices_total": device_hours * rate} for name, rate, src in price.others]
    if o.electricity_per_kwh is not None and out["energy"]:
        cost.update(electricity_per_kwh=o.electricity_per_kwh,
                    energy_total=out["energy"]["mwh"] * 1000 * o.electricity_per_kwh)
    if cost:
        cost["total"] = cost.get("devices_total", 0.0) + cost.get("energy_total", 0.0)
        out["cost"] = cost
    else:
        out["assumptions"].append("no public price for this card: give --price-per-device-hour for the cost")
    return out


def cost_of_prediction(pred: dict, cluster, options: CostOptions = CostOptions()) -> dict:
    """:func:`training_cost` of a ``predict`` object (the ``dayzero predict --json`` object) on its cluster."""
    p = pred["parallel"]
    busiest = max(pred["memory"]["stages"], key=lambda s: s["total"])
    return training_cost(step_s=pred["time"]["step_s"], tokens_per_step=p["gbs"] * p["seq"], devices=pred["devices"],
                         model_tflops_per_device=pred["throughput"]["model_tflops_per_device"],
                         state_bytes_per_device=busiest["weights"] + busiest["optimizer"],
                         power=facility_power(cluster, options.power),
                         price=device_price(cluster.accelerator.id, options.price_per_device_hour, options.price_offer),
                         devices_per_node=cluster.devices_per_node, options=options)


def with_training(obj: dict, cluster, options: CostOptions = CostOptions()) -> dict:
    """A ``predict`` object with its ``training`` (:func:`cost_of_prediction`), or a ``plan``
    object with every plan's; the input is not changed."""
    if "plans" in obj:
        return {**obj, "plans": [with_training(p, cluster, options) for p in obj["plans"]]}
    return {**obj, "training": cost_of_prediction(obj, cluster, options)}


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
                        state_bytes_per_device: float, options: CostOptions = CostOptions(),
                        devices_per_node: int = 8) -> dict:
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
                      options=options, devices_per_node=devices_per_node)
    wall_s = ideal_s / f["goodput"]
    return {"tokens": tokens, "phases": rows, "ideal_s": ideal_s, "wall_s": wall_s, "goodput": f["goodput"],
            "device_hours": wall_s * devices / 3600,
            "ideal_tokens_per_s_per_device": tokens / ideal_s / devices,
            "tokens_per_s_per_device": tokens / wall_s / devices,
            "failures": {"interruptions_per_day": f["rate"] * SECONDS_PER_DAY, "mtbf_hours": f["mtbf_s"] / 3600,
                         "checkpoint_s": f["checkpoint_s"], "checkpoint_interval_s": f["interval_s"],
                         "restart_s": f["restart_s"]},
            "assumptions": [
                f"{len(phases)} batch phases, {rows[0]['gbs']} -> {rows[-1]['gbs']} sequences per step",
                f["rates_text"],
                f"restart {f['restart_s']:.0f} s after each interruption",
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
        if not layout_rules.problems(replace(parallel, gbs=g), None, devices):
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
                              state_bytes_per_device=busiest["weights"] + busiest["optimizer"], options=cost,
                              devices_per_node=cluster.devices_per_node)
    short = sorted({p.gbs for p in phases if runnable_gbs(parallel, p.gbs, cluster.devices) != p.gbs})
    if short:
        out["assumptions"].append(f"batches {', '.join(map(str, short))} cannot run on this layout: timed at the "
                                  "tokens/s of the smallest batch above each that can")
    return out
