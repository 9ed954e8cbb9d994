"""The validation report as JSON and Markdown files (``dayzero validate`` writes both).

The JSON is the whole result object (the issue's contract: ``checks`` rows of metric, target,
measured, predicted, rel_error, pass, plus the run, prediction and measurements); the Markdown
is the same for people: the targets table first, then the run and the calibration, if any.
"""

from __future__ import annotations

from pathlib import Path

from dayzero.jsonable import dumps


def value_text(x, unit: str = "") -> str:
    if x is None:
        return "—"
    if unit == "fraction":
        return f"{x:.1%}"
    if unit == "s":
        return f"{x:.3g} s"
    if unit == "relative change":
        return f"{x:+.1%}"
    return f"{x:.4g}"


TARGET_COLUMNS = ("metric", "target", "measured", "predicted", "error", "pass")


def target_rows(checks: list[dict]) -> list[tuple[str, ...]]:
    """The targets table as text cells (TARGET_COLUMNS); a failed target reads ``FAIL``."""
    return [(c["metric"], c["target"], value_text(c["measured"], c.get("unit", "")),
             value_text(c["predicted"], c.get("unit", "")),
             "—" if c["rel_error"] is None else f"{c['rel_error']:+.1%}", "pass" if c["pass"] else "FAIL")
            for c in checks]


def targets_markdown(checks: list[dict]) -> str:
    lines = ["| " + " | ".join(TARGET_COLUMNS) + " |", "|---|---|---|---|---|---|"]
    for row in target_rows(checks):
        cells = [*row[:-1], "pass" if row[-1] == "pass" else "**FAIL**"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def calibration_markdown(cal: dict) -> str:
    b, a = cal["before"], cal["after"]
    lines = [f"## Calibration ({cal['runs']} run(s), fitted: {', '.join(cal['keys'])})", "",
             "| | median abs error | MAPE | Spearman |", "|---|---|---|---|",
             f"| before | {b['median_abs_rel_error']:.1%} | {b['mape']:.1%} | {_sp(b['spearman'])} |",
             f"| after | {a['median_abs_rel_error']:.1%} | {a['mape']:.1%} | {_sp(a['spearman'])} |", "",
             "| constant | before | after |", "|---|---|---|"]
    for k in cal["keys"]:
        lines.append(f"| {k} | {cal['constants_before'][k]:.4g} | {cal['constants_after'][k]:.4g} |")
    return "\n".join(lines)


def share_lines(run: dict) -> list[str]:
    """A derived model's approximated terms against the measured difference, one sentence per metric
    (validate.run.approximation_share)."""
    out = []
    for metric, d in (run.get("approximation_share") or {}).items():
        unit, scale = ("s", 1.0) if metric == "step_time" else ("MiB", 2**20)
        out.append(f"{metric.replace('_', ' ')}: the approximated terms add {d['terms'] / scale:+.4g} {unit} to the "
                   f"shapes' {d['predicted_shapes_only'] / scale:.4g} {unit}; predicted - measured = "
                   f"{d['difference'] / scale:+.4g} {unit}, so they can account for at most {d['share']:.0%} of it")
    return out


def _sp(x):
    return "—" if x is None else f"{x:.2f}"


def to_markdown(result: dict) -> str:
    run = result.get("run", {})
    out = [f"# Validation: {run.get('model', '?')} ({run.get('layout', '')})", ""]
    if run:
        out += [f"- proxy: {run.get('proxy', '')}", f"- ranks: {run.get('ranks')} ({run.get('device')}, "
                f"compute {run.get('compute_dtype')}), {run.get('steps')} steps",
                f"- profile: {run.get('cluster')}", ""]
    if "checks" in result:
        s = result.get("summary", {})
        out += ["## Targets", "", targets_markdown(result["checks"]), "",
                f"{s.get('passed', 0)} of {len(result['checks'])} pass" + (
                    f"; failed: {', '.join(s['failed'])}" if s.get("failed") else ""), ""]
    pred = result.get("prediction")
    if pred:
        t = pred["time"]
        out += ["## Predicted step", "", "| term | seconds |", "|---|---|"]
        out += [f"| {k[:-2].replace('_', ' ')} | {t[k]:.4g} |" for k in ("compute_s", "comm_exposed_s", "bubble_s",
                                                                          "optimizer_s", "step_s")]
        out.append("")
    meas = result.get("measured")
    if meas:
        out += ["## Measured", "", f"- step times (s): {', '.join(f'{x:.3g}' for x in meas.get('step_times_s', []))}",
                f"- losses: {', '.join(f'{x:.4g}' for x in meas.get('losses', []))}",
                "- peak memory per rank (MiB): "
                f"{', '.join(f'{x / 2**20:,.0f}' for x in meas.get('peak_memory_per_rank', []))}",
                ""]
    if run.get("approximation_share"):
        out += ["## Approximations (a model derived from its own code)", ""]
        out += [f"- {a}" for a in run.get("approximations", ())] + [f"- {line}" for line in share_lines(run)] + [""]
    if result.get("calibration"):
        out += [calibration_markdown(result["calibration"]), ""]
    return "\n".join(out).rstrip() + "\n"


def write_report(result: dict, out_dir: str | Path, stem: str = "validation") -> tuple[Path, Path]:
    """Write ``<stem>.json`` and ``<stem>.md`` into ``out_dir``; returns both paths."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    j, m = d / f"{stem}.json", d / f"{stem}.md"
    j.write_text(dumps(result) + "\n")
    m.write_text(to_markdown(result))
    return j, m


