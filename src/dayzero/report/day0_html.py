"""The Day-0 report as one self-contained HTML page a lead reads in one screen.

Top to bottom: the verdict (:func:`verdict`: fits or not, on what, the layout, how long, what
energy and cost, the findings that qualify it: failing checks, operators without a kernel, the
approximations of a model derived from its code), the three charts that carry the decision
(:func:`decision_charts`: step time of the best plans by term with their layouts, memory per
pipeline stage by category, step time against peak memory of every fitting layout), the other
charts, then every table of :func:`dayzero.report.day0_render.tables`, the long ones folded in
``<details>``. Inline SVG (:mod:`dayzero.report.svg`) and an inline stylesheet: no script, no font,
image or stylesheet from elsewhere, so the page renders offline.

A report without plans (nothing fits) gets a "does not fit" verdict and the model's charts; it
may carry ``no_fit``: ``{"reason": str, "devices_needed": int}`` (either key optional), which the
verdict quotes.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from dayzero.report import svg
from dayzero.report.day0_render import MEMORY_CATEGORIES, STEP_TERMS, Table, headline, parameter_breakdown, tables
from dayzero.report.layout_text import describe
from dayzero.report.training import count_text
from dayzero.units import figure

GIB = 2**30  # device memory in GiB, the unit HBM is sized in (an "H100 80GB" holds 80 GiB)
CHART_W = 440  # viewBox width of a decision chart: three side by side in a 1,400 px window, text at ~1:1
FOLD_ROWS = 10  # tables longer than this start folded
NOTES_SHOWN = 4  # approximation lines in the banner before the rest fold: the charts stay on the first screen
# the cloud's step axis ends at this multiple of the slowest plan shown: the layouts between the
# plans are the alternatives a lead weighs; one twice as slow as all of them is not one
ZOOM = 2.0
DECISION = ("Step time of the best plans", "Memory per stage", "Candidate cloud")


@dataclass(frozen=True)
class Verdict:
    """The banner: ``tone`` is ``ok`` (fits, every check passes), ``warn`` (fits, with findings)
    or ``no`` (does not fit); ``figures`` are (label, value, detail) tiles."""

    tone: str
    title: str
    layout: str
    figures: tuple[tuple[str, str, str], ...]
    findings: tuple[str, ...]
    notes: tuple[str, ...]


def _gib(n: float) -> str:
    return f"{n / GIB:,.1f} GiB"


def _money(x: float) -> str:
    for div, s in ((1e9, " B"), (1e6, " M"), (1e3, " k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{s}"
    return f"{x:,.0f}"


def _approximations(r: dict) -> tuple[str, ...]:
    """A derived model's approximations, under the figures they shape (step time, MFU and its band)."""
    m = r["model"]
    approx = m.get("approximations") or []
    if not m.get("derived_from_modeling_code") or not approx:
        return ()
    head = ("* derived from its modeling code: the figures above rest on these approximations, which the MFU "
            "band (measured on catalog models) does not cover:")
    return (head, *(f"approximation: {a}" for a in approx))


def _operators(op: dict) -> tuple[tuple[str, str, str], tuple[str, ...]]:
    """The operators tile and, when some need a kernel, the finding."""
    if "coverage" not in op:
        note = op.get("note", "")
        return ("operators", "not traced", note.removeprefix("not traced").strip(" :()")), ()
    need = op.get("needs_kernel") or []
    tile = ("operators", f"{op['coverage']:.1%} covered", f"{len(need)} need a kernel on {op['manifest']}")
    names = [n if isinstance(n, str) else str(n.get("op", n)) for n in need]
    return tile, ((f"{len(need)} operator(s) need a kernel on {op['manifest']}: {', '.join(names)}",) if need else ())


def verdict(r: dict) -> Verdict:
    """What the report decides, in the few figures a lead asks for first."""
    m, cl = r["model"], r["cluster"]
    where = f"{m['name']} on {cl['name']} ({cl['devices']:,} x {cl['accelerator']['name']})"
    approx = _approximations(r)
    if not r.get("plans"):
        nf = r.get("no_fit") or {}
        figs = [("model", f"{count_text(m['params_total'])} parameters", f"{count_text(m['params_active'])} active"),
                ("devices", f"{cl['devices']:,}", cl["accelerator"]["name"])]
        if nf.get("devices_needed"):
            figs.append(("needs", f"{nf['devices_needed']:,} devices", "the smallest count that fits"))
        return Verdict("no", f"Does not fit: {where}", "", tuple(figs),
                       (nf.get("reason") or "no layout fits in device memory",), approx)
    b, tr, p0 = r["best"], r["training"], r["plans"][0]
    sc, e, cost = r["scenario"], tr["energy"], tr["cost"]
    cap = p0["memory"]["capacity_bytes"]
    band = (r.get("uncertainty") or {}).get("error_band")
    mfu_detail = f"band {band['low']:.1%} to {band['high']:.1%}" if band else ""
    figs = [("step", f"{b['step_s']:.4g} s" + (" *" if approx else ""), f"{sc['gbs']:,} x {sc['seq']:,} tokens"),
            ("MFU", f"{b['mfu']:.1%}" + (" *" if approx else ""), mfu_detail),
            ("peak memory", _gib(b["peak_bytes"]), f"{b['memory_utilization']:.1%} of {_gib(cap)} per device"),
            ("training", f"{tr['wall_days']:,.1f} days", f"{count_text(tr['tokens'])} tokens, goodput "
                                                         f"{tr['goodput']:.1%}"),
            ("energy", f"{figure(e['mwh'])} MWh", f"at the facility, {e['cluster_mw']:.3g} MW; "
                                                 f"{figure(e['device_mwh'])} MWh at the devices") if e else
            ("energy", "unknown", "no TDP in the catalog for this card"),
            ("cost", _money(cost["total"]), _cost_detail(cost)) if cost else
            ("cost", "not priced", "no public price for this card: give --price-per-device-hour")]
    fails = [c for c in r["checks"] if not c["pass"]]
    figs.append(("Day-0 checks", "all pass" if not fails else f"{len(r['checks']) - len(fails)} of "
                                                              f"{len(r['checks'])} pass", ""))
    op_tile, op_find = _operators(r["operators"])
    figs.append(op_tile)
    findings = tuple(f"check fails: {c['metric']} {c['value']:.1%} (target {c['target']})" for c in fails) + op_find
    return Verdict("warn" if findings else "ok", f"Fits: {where}", describe(b["parallel"]), tuple(figs), findings,
                   approx)


def _plan_labels(plans: list[dict], scenario: dict) -> tuple[list[str], str]:
    """``#n layout`` per plan, without the global batch (the scenario's, in the subtitle); when a
    layout is still too long for the chart, the words every plan shares join the subtitle."""
    gbs = f"gbs{scenario['gbs']}"
    words = [[w for w in describe(p["parallel"]).split() if w != gbs] for p in plans]
    head = f"gbs {scenario['gbs']:,} x seq {scenario['seq']:,}"
    full = [f"#{i + 1} {' '.join(w)}" for i, w in enumerate(words)]
    if max(len(s) for s in full) * svg.CHAR_W <= CHART_W - 16 or len(plans) < 2:
        return full, head
    shared = [w for w in words[0] if all(w in ws for ws in words[1:])]
    return ([f"#{i + 1} {' '.join(x for x in w if x not in shared)}" for i, w in enumerate(words)],
            f"{head}; every plan: {' '.join(shared)}")


def decision_charts(r: dict) -> list[tuple[str, str]]:
    """(name, svg) of the charts that carry the decision (:data:`DECISION`); none without plans."""
    plans = r.get("plans") or []
    if not plans:
        return []
    best = plans[0]
    stages = best["memory"]["stages"]
    cap = best["memory"]["capacity_bytes"]
    limit = r["scenario"]["max_memory"] * cap
    labels, shared = _plan_labels(plans, r["scenario"])
    out = [(DECISION[0], svg.stacked_bars(
        "Step time of the best plans", labels, {name: [p["time"][k] for p in plans] for name, k in STEP_TERMS},
        "seconds", width=CHART_W, subtitle=shared))]
    out.append((DECISION[1], svg.stacked_columns(
        f"Memory per pipeline stage of #1 (GiB, {len(stages)} stages)", [str(s["stage"]) for s in stages],
        {c: [s[c] / GIB for s in stages] for c in MEMORY_CATEGORIES}, "GiB",
        marks=[(cap / GIB, "capacity"), (limit / GIB, f"target {r['scenario']['max_memory']:.0%}")],
        width=CHART_W, xlabel="stage")))
    cands = r.get("candidates") or []
    if cands:
        # the plans drawn from their own figures (a plan's layout may carry a layer split its cloud point lacks)
        pts = [(c["peak_bytes"] / GIB, c["step_s"]) for c in cands]
        pts += [(p["memory"]["peak_bytes"] / GIB, p["time"]["step_s"]) for p in plans]
        slowest = max(p["time"]["step_s"] for p in plans)
        out.append((DECISION[2], svg.scatter(
            f"Step time vs peak memory, {len(cands)} fitting layouts", pts,
            [(len(cands) + n, f"#{n + 1}") for n in range(len(plans))], "peak memory, GiB", "step s",
            xmarks=[(limit / GIB, "limit")], width=CHART_W, height=330, ycap=ZOOM * slowest)))
    return out


def other_charts(r: dict) -> list[tuple[str, str]]:
    """(name, svg) of the charts below the decision: parameters, communication, the proxy run's loss."""
    pb = parameter_breakdown(r["model"])
    out = [("Parameters by component", svg.stacked_bars(
        "Parameters by component", ["model"], {k: [v / 1e9] for k, v in pb.items()}, "billion parameters"))]
    plans = r.get("plans") or []
    comm = plans[0]["communication"] if plans else []
    if comm:
        out.append(("Communication per step", svg.grouped_hbars(
            "Communication per step (busiest stage)", [c["name"] for c in comm],
            {"busy": [c["total_s"] for c in comm], "exposed": [c["exposed_s"] for c in comm]}, "seconds")))
    v = r.get("validation", {})
    if v.get("measured", {}).get("losses"):
        out.append(("Proxy run loss curve", svg.line(
            f"Proxy run loss: {v['run']['model']}, {v['run']['layout']}", v["measured"]["losses"], "step",
            "loss")))
    return out


def charts(r: dict) -> list[tuple[str, str]]:
    """(name, svg) of every chart of the report, the decision's first."""
    return decision_charts(r) + other_charts(r)


_CSS = ("body{font-family:sans-serif;max-width:1360px;margin:0 auto;padding:8px 16px;color:#222}"
        ".verdict{border-left:10px solid #070;background:#eef7ee;padding:6px 16px 8px;margin:0 0 10px}"
        ".verdict.warn{border-color:#E69F00;background:#fff6e2}.verdict.no{border-color:#C00;background:#fdecec}"
        ".verdict h1{font-size:24px;margin:4px 0}.layout{font-family:monospace;font-size:17px;margin:2px 0 6px}"
        ".figs{display:flex;flex-wrap:wrap;gap:4px 28px}.fig{min-width:120px;max-width:300px}"
        ".fig b{display:block;font-size:20px}.fig small{display:block;color:#555;font-size:12px}"
        ".finding{color:#A00;font-weight:bold;margin:4px 0 0}.approx{color:#7a4a00;margin:4px 0 0;font-size:14px}"
        ".charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(400px,1fr));gap:8px 16px}"
        ".charts figure{margin:0}figure{margin:1em 0}"
        "table{border-collapse:collapse;margin:.5em 0 1em}td,th{border:1px solid #ccc;padding:2px 8px;"
        "text-align:left}td.n{text-align:right}th{background:#f2f2f2}.fail{color:#C00;font-weight:bold}"
        ".pass{color:#070}p.note{color:#555;font-size:90%}details{margin:.4em 0}"
        "summary{cursor:pointer;font-weight:bold;font-size:17px;padding:2px 0}.approx summary{font-size:14px}"
        "h2{font-size:19px;margin:1em 0 .3em}")


def _cell(c: str) -> str:
    cls = ' class="fail"' if c == "FAIL" else (' class="pass"' if c == "pass" else "")
    if not cls and c[:1].isdigit():
        cls = ' class="n"'
    return f"<td{cls}>{escape(c)}</td>"


def verdict_html(v: Verdict) -> str:
    parts = [f'<header class="verdict {v.tone}" id="verdict"><h1>{escape(v.title)}</h1>']
    if v.layout:
        parts.append(f'<div class="layout">{escape(v.layout)}</div>')
    parts.append('<div class="figs">' + "".join(
        f'<div class="fig">{escape(label)}<b>{escape(value)}</b><small>{escape(detail)}</small></div>'
        for label, value, detail in v.figures) + "</div>")
    parts += [f'<p class="finding">{escape(f)}</p>' for f in v.findings]
    shown, rest = v.notes[:NOTES_SHOWN], v.notes[NOTES_SHOWN:]
    parts += [f'<p class="approx">{escape(n)}</p>' for n in shown]
    if rest:
        parts.append(f'<details class="approx"><summary>{len(rest)} more</summary>'
                     + "".join(f"<p>{escape(n)}</p>" for n in rest) + "</details>")
    return "".join(parts) + "</header>"


def table_html(t: Table) -> str:
    """A table in a ``<details>`` element, open when it has at most :data:`FOLD_ROWS` rows."""
    body = ["<table>"]
    if any(t.header):
        body.append("<tr>" + "".join(f"<th>{escape(h)}</th>" for h in t.header) + "</tr>")
    body += ["<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in t.rows]
    body.append("</table>")
    if t.note:
        body.append(f'<p class="note">{escape(t.note)}</p>')
    opened = " open" if len(t.rows) <= FOLD_ROWS else ""
    count = "" if opened else f" ({len(t.rows)} rows)"
    return f"<details{opened}><summary>{escape(t.title)}{count}</summary>" + "\n".join(body) + "</details>"


def _cost_detail(cost: dict) -> str:
    parts = []
    if "price_per_device_hour" in cost:
        parts.append(f"at {cost['price_per_device_hour']:g} per device-hour ({cost.get('price_source', 'given')})")
    if "energy_total" in cost:
        parts.append(f"energy at {cost['electricity_per_kwh']:g} per kWh")
    return "; ".join(parts)


def _figures(items: list[tuple[str, str]], cls: str) -> str:
    return f'<section class="{cls}">' + "\n".join(
        f'<figure data-chart="{escape(name)}">{chart}</figure>' for name, chart in items) + "</section>"


def to_html(r: dict) -> str:
    title = f"Day 0: {r['model']['name']} on {r['cluster']['name']}"
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{escape(title)}</title>",
             f"<style>{_CSS}</style></head><body>", verdict_html(verdict(r))]
    top = decision_charts(r)
    if top:
        parts.append(_figures(top, "charts"))
    parts += ["<h2>More charts</h2>", _figures(other_charts(r), "charts")]
    if r.get("plans"):
        parts.append("<h2>Details</h2>")
        summary = tuple(headline(r))
        parts += [table_html(t) for t in tables(r) if t.rows != summary]  # the summary is the verdict's
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
