"""``dayzero backtest CSV``: predict published training runs and report the error."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from dayzero.cli.app import app
from dayzero.cli.common import JsonOpt, console, emit_json
from dayzero.cli.next_steps import Step, print_next
from dayzero.cli.predict import CalibrationOpt
from dayzero.cli.render import FitTable


@app.command("backtest")
def backtest_cmd(
    csv: Annotated[Optional[str], typer.Argument(help="CSV with the columns of the shipped published_runs_dev.csv; "
                                                      "default: that file (448 published runs).")] = None,
    calibration: CalibrationOpt = None,
    fit: Annotated[bool, typer.Option("--fit", help="First fit the efficiency constants on the even-id half "
                                                    "(minutes).")] = False,
    write_calibration: Annotated[Optional[str], typer.Option("--write-calibration", help="With --fit: save the "
                                                                                         "constants to "
                                                                                         "FILE.json.")] = None,
    worst: Annotated[int, typer.Option("--worst", min=0, help="Rows with the largest errors to list.")] = 10,
    by: Annotated[str, typer.Option("--by", help="Group the error table by source, model, accelerator or precision "
                                    "(the GEMM recipe: bf16, fp8, mxfp8, fp4).")] = "source",
    holdout: Annotated[Optional[str], typer.Option(
        "--holdout", help="'source': also fit the constants without each source group and predict that group "
        "(leave-one-group-out; minutes).")] = None,
    holdout_iterations: Annotated[int, typer.Option(
        "--holdout-iterations", min=0,
        help="Nelder-Mead steps per held-out group, warm-started from the constants in use.")] = 20,
    json_out: JsonOpt = False,
) -> None:
    """Predict tokens/s per device for every row of a published-runs file; report MAPE overall, per half (fit on even
    ids, held-out odd ids) and per group (--by), the share of rows whose layout is predicted to fit device memory, which
    rows were skipped and why, and what was assumed where a row does not say. --holdout source adds the
    leave-one-source-group-out error.

    Example: [bold]dayzero backtest[/bold] (the shipped runs); [bold]dayzero backtest runs.csv --by model --json[/bold]
    """
    import json
    from pathlib import Path

    from dayzero.planner.backtest.backtest import GROUP_BY, fit_constants, leave_one_group_out, run_backtest
    from dayzero.planner.perf.calibration import load_calibration

    if by not in GROUP_BY:
        raise typer.BadParameter(f"{by!r}; one of: {', '.join(GROUP_BY)}", param_hint="--by")
    if holdout not in (None, "source"):
        raise typer.BadParameter(f"{holdout!r}; the one grouping held out is: source", param_hint="--holdout")
    constants = load_calibration(calibration) if calibration else None
    if fit:
        constants, _ = fit_constants(csv, constants)
        if write_calibration:
            Path(write_calibration).parent.mkdir(parents=True, exist_ok=True)
            Path(write_calibration).write_text(json.dumps({"constants": constants.to_dict()}, indent=1) + "\n")
    result = run_backtest(csv, constants, by=by)
    if holdout:
        result["holdout"] = leave_one_group_out(csv, constants, holdout_iterations)
    if json_out:
        emit_json(result)
        return
    pct = lambda x: "-" if x is None else f"{x:.1%}"  # noqa: E731
    _print_summary(result, by, pct)
    if holdout:
        _print_holdout(result["holdout"], pct)
    if worst and result["rows"]:
        _print_worst(result, worst)
    _print_assumed_and_skipped(result)
    args = ["dayzero", "backtest", *([csv] if csv else [])]
    if fit and write_calibration:
        step = Step.of("dayzero", "plan", "--calibration", write_calibration, why="plan with the fitted constants")
    else:
        step = Step.of(*args, "--fit", "--write-calibration", "runs/calibration.json",
                       why="fit the constants on the even ids, check on the odd")
    print_next(console, [step])


def _print_summary(result: dict, by: str, pct) -> None:
    """The headline (rows predicted and skipped, MAPE, p90), each half, the memory fit share and the
    per-group table."""
    s = result["summary"]
    console.print(f"[bold]{s['n']}[/bold] rows predicted, {s['skipped']} skipped ({s['skipped_fraction']:.1%}); "
                  f"MAPE [bold]{pct(s['mape'])}[/bold], p90 |error| {pct(s['p90_abs_rel_error'])}")
    for half, h in result["halves"].items():
        label = "fit half (even ids)" if half == "fit" else "held-out half (odd ids)"
        console.print(f"  {label}: n {h['n']}, MAPE {pct(h['mape'])}, p90 {pct(h['p90_abs_rel_error'])}")
    if s["n"]:
        not_fit = s["not_fitting"]
        console.print(f"memory: {pct(s['fits_share'])} of rows predicted to fit their device; "
                      f"{pct(s['fits_share_recompute_stated'])} of the {s['recompute_stated']} that state recompute"
                      + (f" (not fitting: {', '.join(not_fit[:8])}{' ...' if len(not_fit) > 8 else ''})"
                         if not_fit else ""))
    t = FitTable(title=f"Per {by}")
    for col in (by, "n", "MAPE", "p90", "bias"):
        t.add_column(col, num=col != by)
    for group, v in s["by_group"].items():
        t.add_row(group, str(v["n"]), f"{v['mape']:.1%}", f"{v['p90_abs_rel_error']:.1%}", f"{v['bias']:+.1%}")
    console.print(t)


def _print_worst(result: dict, worst: int) -> None:
    """The ``worst`` rows with the largest errors."""
    s = result["summary"]
    w = FitTable(title=f"Largest errors (of {s['n']})")
    for col in ("id", "run", "layout", "published tok/s/dev", "predicted", "error", "memory"):
        w.add_column(col, num=col in ("published tok/s/dev", "predicted", "error", "memory"))
    for r in sorted(result["rows"], key=lambda r: -abs(r["rel_error"]))[:worst]:
        w.add_row(r["id"], f"{r['model']} on {r['devices']:,} x "
                           f"{r['accelerator']}", r["layout"], f"{r['published']:,.0f}",
                  f"{r['predicted']:,.0f}", f"{r['rel_error']:+.1%}", f"{r['memory_fraction']:.0%}")
    console.print(w)


def _print_assumed_and_skipped(result: dict) -> None:
    """What was assumed where rows do not say (one example each), and the rows skipped, by reason."""
    s = result["summary"]
    if s["assumed"]:
        console.print(f"assumed where rows do not say ({s['rows_with_assumptions']} rows; per row under "
                      "'assumed' in --json):")
        for kind, n in s["assumed"].items():
            example = next(a["text"] for r in result["rows"] for a in r["assumed"] if a["kind"] == kind)
            console.print(f"  {n} x {kind} (e.g. {example})")
    if result["skipped"]:
        console.print("skipped: " + ", ".join(f"{n} {kind}" for kind, n in s["skipped_by_reason"].items()))
        reasons: dict[str, list[str]] = {}
        for sk in result["skipped"]:
            reasons.setdefault(f"{sk['kind']}: {sk['reason']}", []).append(sk["id"])
        for reason, ids in reasons.items():
            console.print(f"  {len(ids)} x {reason} ({', '.join(ids[:6])}{' ...' if len(ids) > 6 else ''})")


def _print_holdout(h: dict, pct) -> None:
    """The leave-one-group-out tables: per held-out group, per family, per precision."""
    o = h["overall"]
    console.print(f"leave-one-source-group-out: MAPE [bold]{pct(o['mape'])}[/bold] over {o['n']} rows "
                  f"(each group predicted with constants fitted on the others, {h['iterations']} steps)")
    for key, title in (("by_group", "held-out source group"), ("by_family", "family"), ("by_precision", "precision")):
        t = FitTable(title=f"Leave-one-group-out, per {title}")
        for col in (title, "n", "MAPE", "p90", "bias"):
            t.add_column(col, num=col != title)
        for group, v in h[key].items():
            t.add_row(group, str(v["n"]), pct(v["mape"]), pct(v["p90_abs_rel_error"]), f"{v['bias']:+.1%}")
        console.print(t)
    for g, fields in h["unconstrained"].items():
        if fields:
            console.print(f"  without {g}, no other group constrains {', '.join(fields)}: the start value is used")
