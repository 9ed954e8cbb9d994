"""The Day-0 report's error band and sensitivity sections (the plan object's ``error_band`` and
``sensitivity``: :mod:`dayzero.planner.search.error_band`, :mod:`dayzero.planner.search.sensitivity`)."""

from __future__ import annotations

from dayzero.report.table import Table


def uncertainty_tables(r: dict) -> list:
    """The two tables, or none for a report without them (one written before they existed)."""
    from dayzero.planner.search.error_band import ErrorBand

    u = r.get("uncertainty")
    if not u:
        return []
    b = ErrorBand(**{**u["error_band"], "extrapolates": tuple(u["error_band"].get("extrapolates", ()))})
    evidence = (("rows it rests on", b.evidence),
                ("this plan", "extrapolates: " + "; ".join(b.extrapolates) if b.extrapolates
                 else "within those rows")) if b.evidence else ()
    out = [Table("Error band of the best plan", ("", ""), (
        ("predicted MFU", f"{b.mfu:.1%}"), ("band (x (1 -/+ MAPE))", f"{b.low:.1%} to {b.high:.1%}"),
        ("cross-source MAPE", f"{b.mape:.1%} over {b.n} held-out {b.key} rows"),
        ("bias (median; + = predicted faster)", f"{b.bias:+.1%}"), *evidence),
        "leave-one-source-group-out backtest (benchmarks/bench_holdout.py --table)" + (f"; {b.note}" if b.note
                                                                                        else ""))]
    s = u["sensitivity"]
    base = s["baseline"]
    rows = [("baseline", base["layout"], f"{base['step_s']:.4g}", f"{base['mfu']:.1%}", "", "")]
    rows += [(x["perturbation"], x["layout"] if x["best_plan_changes"] else "same", f"{x['step_s']:.4g}",
              f"{x['mfu']:.1%}", f"{x['baseline_plan_mfu']:.1%}",
              ("yes" if x["best_plan_changes"] else "no") + ("" if x["covered"] else " (within the re-timed layouts)"))
             for x in s["rows"]]
    out.append(Table("Sensitivity of the best plan", ("input", "best plan", "step s", "MFU", "this plan's MFU",
                                                      "plan changes"), tuple(rows),
                     f"{s['pool']} fastest fitting layouts re-timed under each change; gradients "
                     f"{base['grad_reduce'].upper()} in the baseline"))
    return out
