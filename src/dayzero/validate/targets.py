"""The targets table: each Day-0 target with what was measured, what the planner predicted,
the prediction error and whether the target is met.

    metric              target                 measured                    predicted
    mfu                 > 50 %                 model FLOPs / time / peak   planner MFU
    peak_memory         < 85 % of capacity     busiest rank / capacity     planner peak / capacity
    comm_ratio          < 15 % of the step     time in collectives / step  exposed comm / step
    step_time           |error| <= tolerance   seconds per step            planner step time
    loss_trend          decreasing             Theil-Sen relative change   (none)

``rel_error = (predicted - measured) / measured``. The targets are those of planner.predict
(``Targets``); the step-time row judges the prediction itself (tolerance 20 % by default, the
issue's bar on a CPU host; 10 % on GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass

from dayzero.planner.targets import Targets
from dayzero.validate.loss_trend import LossTrend


@dataclass(frozen=True)
class Measured:
    """What a validation run measured (the steady steps: the first one pays one-time setup)."""

    step_time_s: float  # median over steady steps
    mfu: float  # model FLOPs per step / step time / (devices x calibrated peak)
    peak_memory_bytes: int  # busiest rank
    capacity_bytes: int  # per device
    comm_ratio: float  # time inside collectives / step time
    loss: LossTrend

    @property
    def memory_fraction(self) -> float:
        return self.peak_memory_bytes / self.capacity_bytes if self.capacity_bytes else float("nan")


def rel_error(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or measured is None or measured == 0:
        return None
    return (predicted - measured) / measured


def checks(m: Measured, prediction: dict, targets: Targets = Targets(), step_tolerance: float = 0.20) -> list[dict]:
    """The JSON contract rows: metric, target, measured, predicted, rel_error, pass (plus unit
    and detail)."""
    mem = prediction["memory"]
    pred_frac = mem["peak_bytes"] / mem["capacity_bytes"] if mem["capacity_bytes"] else None
    pred_step = prediction["time"]["step_s"]
    step_err = rel_error(pred_step, m.step_time_s)
    rows = [
        _row("mfu", f"> {targets.mfu:.0%}", m.mfu, prediction["throughput"]["mfu"], m.mfu > targets.mfu, "fraction",
             "model FLOPs per step / measured step time / (devices x calibrated peak)"),
        _row("peak_memory", f"< {targets.memory:.0%} of capacity", m.memory_fraction, pred_frac,
             m.memory_fraction < targets.memory, "fraction",
             f"busiest rank {m.peak_memory_bytes / 2**20:,.0f} MiB of {m.capacity_bytes / 2**20:,.0f} MiB; predicted "
             f"{mem['peak_bytes'] / 2**20:,.0f} MiB"),
        _row("comm_ratio", f"< {targets.comm_ratio:.0%} of step", m.comm_ratio, prediction["comm_ratio"],
             m.comm_ratio < targets.comm_ratio, "fraction",
             "measured: time inside collectives (profiler) / step time; predicted: exposed communication / step time"),
        _row("step_time", f"prediction within {step_tolerance:.0%}", m.step_time_s, pred_step,
             step_err is not None and abs(step_err) <= step_tolerance, "s",
             f"median of the steady steps; predicted {pred_step:.3g} s"),
        {"metric": "loss_trend", "target": f"decreasing (Mann-Kendall p < {m.loss.alpha:g})",
         "measured": _num(m.loss.relative_change), "predicted": None, "rel_error": None, "pass": m.loss.decreasing,
         "unit": "relative change", "detail": m.loss.reason()},
    ]
    return rows


def _num(x):
    return None if x is None or x != x else float(x)  # NaN -> null in JSON


def _row(metric, target, measured, predicted, ok, unit, detail) -> dict:
    return {"metric": metric, "target": target, "measured": _num(measured), "predicted": _num(predicted),
            "rel_error": _num(rel_error(predicted, measured)), "pass": bool(ok), "unit": unit, "detail": detail}


def summary(rows: list[dict]) -> dict:
    failed = [r["metric"] for r in rows if not r["pass"]]
    return {"passed": len(rows) - len(failed), "failed": failed, "all_pass": not failed}
