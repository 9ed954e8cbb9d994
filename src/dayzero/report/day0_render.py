"""The Day-0 report (:mod:`dayzero.report.day0`) as tables and as Markdown.

:func:`tables` (title, header, rows of text) are what report.md shows and what report.html
(:mod:`dayzero.report.day0_html`: the verdict and charts first) shows below its charts.
"""

from __future__ import annotations

from dayzero.report.layout_text import describe
from dayzero.report.table import Table, cell_text
from dayzero.report.training import count_text, training_rows
from dayzero.report.uncertainty import uncertainty_tables
from dayzero.report.validation import TARGET_COLUMNS, target_rows

MEMORY_CATEGORIES = ("weights", "gradients", "optimizer", "activations", "temporary", "overhead")
STEP_TERMS = (("compute", "compute_s"), ("exposed comm", "comm_exposed_s"), ("bubble", "bubble_s"),
              ("optimizer", "optimizer_s"), ("stragglers", "straggler_s"))
OPTIONAL_TERMS = ("straggler_s",)  # listed only when nonzero (planner.perf.scale_effects, sigma 0 by default)
COMPONENTS = ("attention", "recurrent", "dense_mlp", "routed_experts", "shared_experts", "router", "norms")


def _gb(n: float) -> str:
    """Device memory, in GiB (dayzero.units)."""
    return f"{n / 2**30:,.1f}"


def _pct(x: float) -> str:
    return f"{x:.1%}"


def _big(n: float) -> str:
    for div, s in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if abs(n) >= div:
            return f"{n / div:.4g} {s}"
    return f"{n:,.0f}"


def parameter_breakdown(model: dict) -> dict[str, int]:
    """Parameters by component over all layers, plus embedding and output head."""
    out = {c: sum(lc.get(c, 0) for lc in model["per_layer"]) for c in COMPONENTS}
    out = {k: v for k, v in out.items() if v}
    out["embedding"] = model["params_embedding"]
    if model["params_head"]:
        out["output head"] = model["params_head"]
    return out


def step_rows(t: dict) -> tuple[tuple[str, str, str], ...]:
    """The step's terms (seconds, share of the step), then the step: the terms listed add up to it
    (an optional term is left out only when it is zero)."""
    rows = tuple((name, f"{t[k]:.3f}", _pct(t[k] / t["step_s"])) for name, k in STEP_TERMS
                 if k not in OPTIONAL_TERMS or t.get(k, 0.0))
    return rows + (("step", f"{t['step_s']:.3f}", ""),)


def headline(r: dict) -> list[tuple[str, str]]:
    """The answer in a few lines: what a meeting needs first."""
    b, tr, cl = r["best"], r["training"], r["cluster"]
    e, cost = tr["energy"], tr["cost"]
    fails = [c["metric"] for c in r["checks"] if not c["pass"]]
    rows = [("model", f"{r['model']['name']} ({r['model']['model_type']}), {_big(r['model']['params_total'])} "
                      f"parameters, {_big(r['model']['params_active'])} active"),
            ("cluster", f"{cl['name']}: {cl['devices']:,} x {cl['accelerator']['name']}"),
            ("fits", f"yes: {describe(b['parallel'])}, peak {_gb(b['peak_bytes'])} GiB "
                     f"({_pct(b['memory_utilization'])} of device memory)"),
            ("step", f"{b['step_s']:.4g} s for {r['scenario']['gbs']:,} x {r['scenario']['seq']:,} tokens; "
                     f"MFU {_pct(b['mfu'])}, comm {_pct(b['comm_ratio'])}, bubble {_pct(b['bubble_ratio'])}"),
            ("training", f"{count_text(tr['tokens'])} tokens in {tr['wall_days']:,.1f} days, goodput "
                         f"{_pct(tr['goodput'])}, a checkpoint every "
                         f"{tr['failures']['optimal_checkpoint_interval_steps']:,} steps"),
            ("energy", f"{e['mwh']:,.0f} MWh at the facility ({e['node_mwh']:,.0f} at the nodes, "
                       f"{e['device_mwh']:,.0f} at the devices), {e['cluster_mw']:.3g} MW" if e else "no TDP known"),
            ("cost", (f"{cost['total']:,.0f}" + (f" ({cost['price_source']})" if "price_source" in cost else ""))
             if cost else "no public price for this card (--price-per-device-hour)"),
            ("Day-0 checks", "all pass" if not fails else f"fail: {', '.join(fails)}")]
    if "validation" in r:
        rows.append(("proxy run here", validation_line(r["validation"])))
    # every number above rests on these: shown wherever they are (inspect, plan, the report)
    rows += [("approximation", a) for a in r["model"].get("approximations", ())]
    if r["model"].get("unused_config_keys"):
        rows.append(("config keys not used", cell_text(r["model"]["unused_config_keys"])))
    return rows


def _check(v: dict, metric: str) -> dict | None:
    return next((c for c in v.get("checks", ()) if c["metric"] == metric), None)


def validation_line(v: dict) -> str:
    """The proxy run in one line: measured vs predicted step time, the loss, targets passed."""
    if "checks" not in v:
        return v["note"]
    st, loss, s = _check(v, "step_time"), _check(v, "loss_trend"), v["summary"]
    err = "" if st["rel_error"] is None else f" ({st['rel_error']:+.0%})"
    return (f"{v['run']['layout']} on {v['run']['ranks']} rank(s): step {st['measured']:.3g} s measured vs "
            f"{st['predicted']:.3g} s predicted{err}; loss {v['measured']['losses'][0]:.4g} -> "
            f"{v['measured']['losses'][-1]:.4g} ({'falling' if loss and loss['pass'] else 'not falling'}); "
            f"{s['passed']} of {len(v['checks'])} targets pass")


def tables(r: dict) -> list[Table]:
    m, best = r["model"], r["plans"][0]
    out = [Table("Summary", ("", ""), tuple(headline(r)))]
    out.append(Table("Model", ("quantity", "value"), (
        ("parameters, total", f"{m['params_total']:,}"), ("parameters, active per token", f"{m['params_active']:,}"),
        ("layers x hidden, vocab", f"{m['layers']} x {m['hidden']:,}, {m['vocab']:,}"),
        ("FLOPs per token, train", f"{m['flops_per_token_train']:.4g} (seq {m['seq']:,})"))))
    pb = parameter_breakdown(m)
    out.append(Table("Parameters by component", ("component", "parameters", "share"),
                     tuple((k, f"{v:,}", _pct(v / m["params_total"])) for k, v in pb.items())))
    op = r["operators"]
    if "coverage" in op:
        rows = [("manifest", op["manifest"]), ("coverage by calls", _pct(op["coverage"])),
                ("coverage by FLOPs", _pct(op["coverage_flops"])),
                ("operators needing a kernel", cell_text(op["needs_kernel"]) or "none")]
        rows += [(f"unsupported: {u['op']}", f"{u['calls']:,} calls/step, {_pct(u['flops_share'])} of FLOPs"
                  + (", needs a kernel" if u["needs_kernel"] else ", decomposes (not checked here; dayzero ops checks "
                                                                  "it)")) for u in op["unsupported"]]
        out.append(Table("Operator coverage", ("", ""), tuple(rows), op.get("manifest_choice", "")))
    else:
        out.append(Table("Operator coverage", ("", ""), (("manifest", op["manifest"]), ("note", op["note"]))))
    out.append(Table("Best plans", ("layout", "step s", "MFU", "comm", "bubble", "memory", "days", "MWh"), tuple(
        (describe(p["parallel"]), f"{p['time']['step_s']:.4g}", _pct(p["throughput"]["mfu"]), _pct(p["comm_ratio"]),
         _pct(p["time"]["bubble_s"] / p["time"]["step_s"]), _pct(p["memory"]["utilization"]),
         f"{p['training']['wall_days']:,.1f}",
         f"{p['training']['energy']['mwh']:,.0f}" if p["training"]["energy"] else "—") for p in r["plans"])))
    out += uncertainty_tables(r)
    out.append(Table("Memory per stage of the best plan (GiB)", ("stage", *MEMORY_CATEGORIES, "total"), tuple(
        (str(s["stage"]), *(_gb(s[c]) for c in MEMORY_CATEGORIES), _gb(s["total"])) for s in best["memory"]["stages"])))
    t = best["time"]
    out.append(Table("Step time of the best plan", ("term", "seconds", "share"), step_rows(t)))
    out.append(Table("Communication per step (busiest stage)",
                     ("collective", "group", "tier", "MB/op", "ops", "busy s", "exposed s", "hidden by"), tuple(
        (c["name"], str(c["group_size"]), c["tier"], f"{c['bytes'] / 1e6:,.0f}", f"{c['count']:,.0f}",
         f"{c['total_s']:.3g}", f"{c['exposed_s']:.3g}", c["hidden_by"] or "—") for c in best["communication"])))
    out.append(Table("Day-0 checks", ("metric", "value", "target", "result"), tuple(
        (c["metric"], _pct(c["value"]), c["target"], "pass" if c["pass"] else "FAIL") for c in r["checks"])))
    out.append(Table("Training: time, energy, cost", ("", ""), tuple(training_rows(r["training"])),
                     "; ".join(r["training"]["assumptions"])))
    if r.get("claims"):
        out.append(Table("The seed's claims, checked", ("claim", "verdict", "computed", "formula"), tuple(
            (c["claim"], "holds" if c["holds"] else "does not hold", c["text"], c["formula"]) for c in r["claims"])))
    s = r["search"]
    out.append(Table("Search", ("", ""), (("layouts considered", f"{s['considered']:,}"),
                                         *((f"rejected: {k}", f"{v:,}") for k, v in s["rejected"].items()),
                                         ("timed", f"{s['timed']:,}"), ("seconds", f"{s['seconds']['total']:.2f}"))))
    if "validation" in r:
        out += validation_tables(r["validation"])
    return out


def validation_tables(v: dict) -> list[Table]:
    """The proxy run: what ran (the rule's choices), then the targets table, measured vs predicted."""
    title = "Proxy run on this machine: measured vs predicted"
    if "checks" not in v:
        return [Table(title, ("", ""), (("note", v["note"]),))]
    run, px, m = v["run"], v["proxy"], v["measured"]
    rows = (("model", f"{run['model']} ({run['proxy']})"),
            ("layout", f"{run['layout']} on {run['ranks']} {run['device']} rank(s), cut from "
                       f"{describe(px['plan_parallel'])} ({px['nproc_rule']} ranks)"),
            ("steps", f"{run['steps']} in {run['compute_dtype']}, seq {px['seq']}"),
            ("profile", str(px["profile"])), ("seconds", f"{px['seconds']:.1f}"),
            ("losses", ", ".join(f"{x:.4g}" for x in m["losses"])))
    return [Table(title, ("", ""), rows),
            Table("Proxy run: Day-0 targets", TARGET_COLUMNS, tuple(target_rows(v["checks"])),
                  f"{v['summary']['passed']} of {len(v['checks'])} pass; error = (predicted - measured) / measured")]


def to_markdown(r: dict) -> str:
    lines = [f"# Day 0: {r['model']['name']} on {r['cluster']['name']}", ""]
    for t in tables(r):
        lines += [f"## {t.title}", ""]
        head = t.header if any(t.header) else ("", "")
        lines.append("| " + " | ".join(h or " " for h in head) + " |")
        lines.append("|" + "|".join("---" for _ in head) + "|")
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in t.rows]
        if t.note:
            lines += ["", t.note]
        lines.append("")
    lines += ["Charts: report.html (same directory).", ""]
    return "\n".join(lines)
