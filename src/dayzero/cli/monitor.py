"""``dayzero monitor RUN_DIR|URL``: a terminal dashboard of a running or finished job; also lists
the alert rules and writes their Prometheus file."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from dayzero.cli.app import app
from dayzero.cli.common import JsonOpt, console, emit_json


@app.command("monitor")
def monitor_cmd(
    sources: Annotated[Optional[list[str]], typer.Argument(
        help="A run directory or metrics JSONL (dayzero train --metrics), or exporter URL(s) "
             "(http://HOST:PORT, one per rank unless --metrics-aggregate).", show_default=False)] = None,
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit.")] = False,
    interval: Annotated[float, typer.Option("--interval", min=0.1, help="Seconds between frames.")] = 2.0,
    alert_threshold: Annotated[Optional[list[str]], typer.Option(
        "--alert-threshold", help="KEY=VALUE override of an alert threshold (repeatable).")] = None,
    rules: Annotated[bool, typer.Option("--rules", help="List the alert rules, their thresholds and sources.")] = False,
    write_rules: Annotated[Optional[Path], typer.Option("--write-rules", help="Write the Prometheus alerting-rules "
                                                                              "file (with the --alert-threshold "
                                                                              "values) here.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Watch a job: loss curve and tokens/s (sparklines), per-rank step, communication and busy time, memory, and the
    alerts the rules raise, from the run's metrics stream or its Prometheus exporter.

    Example: [bold]dayzero monitor runs/tiny-llama[/bold]; [bold]dayzero monitor http://127.0.0.1:9400 --once[/bold];
    [bold]dayzero monitor --write-rules runs/alerts.yml --alert-threshold straggler_ratio=0.3[/bold]
    """
    from dayzero.errors import DayzeroError
    from dayzero.monitor.rules import threshold_overrides

    thresholds = threshold_overrides(alert_threshold or [])
    if rules or write_rules:
        _rules(thresholds, write_rules, json_out)
        return
    if not sources:
        raise DayzeroError("dayzero monitor: give a run directory, a metrics file or an exporter URL (or --rules)")
    from dayzero.monitor.view import ExporterReader, from_stream, is_url

    urls = [s for s in sources if is_url(s)]
    if urls and len(urls) != len(sources) or (not urls and len(sources) > 1):
        raise DayzeroError("dayzero monitor: give one run directory or metrics file, or exporter URLs only")
    reader = ExporterReader(", ".join(urls), thresholds) if urls else None

    def view():
        if reader is not None:
            return reader.read([_fetch(u) for u in urls], time.time())
        return from_stream(sources[0], thresholds, now_s=time.time())

    if json_out:
        emit_json(view().to_dict())
        return
    from dayzero.cli.monitor_dashboard import frame

    if once:
        console.print(frame(view()))
        return
    from rich.live import Live

    with Live(frame(view()), console=console, refresh_per_second=max(1.0, 1.0 / interval)) as live:
        try:
            while True:
                time.sleep(interval)
                live.update(frame(view()))
        except KeyboardInterrupt:
            pass


def _fetch(url: str) -> str:
    import urllib.error
    import urllib.request

    from dayzero.monitor.view import SourceError

    full = url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"
    try:
        with urllib.request.urlopen(full, timeout=10) as r:
            return r.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError) as e:
        raise SourceError(f"{full}: cannot scrape ({getattr(e, 'reason', None) or e})") from None


def _rules(thresholds: dict, write: Path | None, json_out: bool) -> None:
    from dayzero.monitor.prometheus_rules import write_rules
    from dayzero.monitor.rules import RULES, resolve_thresholds

    t = resolve_thresholds(thresholds)
    if write is not None:
        from dayzero.outputs import prepare_output

        prepare_output(write, "--write-rules")
        write_rules(write, thresholds)
    doc = [{"name": r.name, "severity": r.severity, "summary": r.summary, "expr": r.expr(t),
            "thresholds": [{"key": th.key, "value": t[th.key], "default": th.default, "unit": th.unit,
                            "source": th.source, "help": th.help} for th in r.thresholds]} for r in RULES]
    if json_out:
        emit_json({"rules": doc, "written": str(write) if write else None})
        return
    if write is not None:
        console.print(f"wrote {len(RULES)} alert rules to {write}", highlight=False)
        return
    from dayzero.cli.render import FitTable

    table = FitTable(title="Alert rules (Prometheus: dayzero/monitor/alerts.yml; in process: dayzero train --alerts)")
    for c in ("rule", "severity", "summary", "thresholds (source)"):
        table.add_column(c, wrap=c != "rule")
    for r in doc:
        table.add_row(r["name"], r["severity"], r["summary"],
                      "\n".join(f"{x['key']}={x['value']:g} {x['unit']} ({x['source']})" for x in r["thresholds"]))
    console.print(table)
