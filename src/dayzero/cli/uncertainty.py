"""Printing a plan's error band and sensitivity table (``dayzero plan``; the day0 report renders
the same objects in its own section)."""

from __future__ import annotations

from dayzero.cli.render import FitTable


def sensitivity_table(sens: dict) -> FitTable:
    b = sens["baseline"]
    t = FitTable(title=f"Sensitivity: the best plan re-searched under each change ({sens['pool']} fastest fitting "
                       f"layouts re-timed; gradients {b['grad_reduce'].upper()} in the baseline)", compact=True)
    for col in ("input", "best plan", "step s", "MFU", "vs baseline", "this plan's MFU", "plan changes"):
        t.add_column(col, num=col in ("step s", "MFU", "vs baseline", "this plan's MFU"))
    t.add_row("baseline", b["layout"], f"{b['step_s']:.4g}", f"{b['mfu']:.1%}", "", f"{b['mfu']:.1%}", "")
    for r in sens["rows"]:
        changes = "yes" if r["best_plan_changes"] else "no"
        if not r["covered"]:
            changes += " (within the re-timed layouts)"
        t.add_row(r["perturbation"], r["layout"] if r["best_plan_changes"] else "same", f"{r['step_s']:.4g}",
                  f"{r['mfu']:.1%}", f"{100 * r['mfu_change']:+.1f} pt", f"{r['baseline_plan_mfu']:.1%}", changes)
    return t


def print_uncertainty(console, obj: dict) -> None:
    """The error band line and the sensitivity table of a plan object, when it has them."""
    band = obj.get("error_band")
    if band:
        from dayzero.planner.search.error_band import ErrorBand

        console.print(f"error band: {ErrorBand(**band).text()}", highlight=False)
    if obj.get("sensitivity"):
        console.print(sensitivity_table(obj["sensitivity"]))
        moved = [r["perturbation"] for r in obj["sensitivity"]["rows"] if r["best_plan_changes"]]
        console.print("the best plan changes under: " + (", ".join(moved) if moved else "none of these"),
                      highlight=False)
