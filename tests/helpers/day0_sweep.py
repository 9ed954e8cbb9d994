"""The ``dayzero day0`` sweep: every preset on one card of each catalog family, with and without
torch, and models derived from their own code; each run must end in a complete report, never a
traceback. Shared by tests/cli/test_day0_sweep.py (a sample in the fast lane, all of it in the
slow lane) and benchmarks/bench_day0_sweep.py (all of it, timed).

Expensive steps are shared across the sweep (:func:`shared_work`): the layout search of a model
on a cluster runs once for the runs with and without torch, the operator trace once per model
and manifest. "Without torch" is simulated as tests/cli/test_day0_validate.py does: the report's
optional-module check (``dayzero.report.day0.missing``) says torch and transformers are absent.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import re
from dataclasses import dataclass
from html import escape
from pathlib import Path
from unittest import mock

# one card of each family the catalog has a software stack for: CUDA, ROCm (HIP registered as
# CUDA), Ascend (CANN, the npu manifest built from torch_npu's operator lists)
FAMILIES = (("cuda", "h100"), ("rocm", "mi300x"), ("ascend", "910b"))
DEVICES = 1024  # every preset fits on 1,024 of each (benchmarks/RESULTS.md, the sweep's row)
SECTIONS = ("model", "cluster", "scenario", "operators", "search", "plans", "candidates", "best", "checks", "training",
            "uncertainty")
WIDTH = 80  # a pipe or a CI log


@dataclass(frozen=True)
class Case:
    model: str
    accelerator: str
    torch: bool  # torch and transformers present (else simulated absent)
    devices: int = DEVICES
    extra: tuple[str, ...] = ()  # more day0 flags (--gbs, --trust-remote-code)

    @property
    def name(self) -> str:
        return f"{Path(self.model).name}-{self.accelerator}-{'torch' if self.torch else 'no-torch'}"


def presets() -> list[str]:
    from dayzero.specs.registry import model_presets

    return sorted(model_presets())


def full_grid(torch_available: bool) -> list[Case]:
    """Every preset x every family x (with torch where it is installed, without)."""
    with_torch = (True, False) if torch_available else (False,)
    return [Case(m, acc, t) for m in presets() for _, acc in FAMILIES for t in with_torch]


def sample(torch_available: bool) -> list[Case]:
    """The fast lane's share: the MoE presets whose traced router op has no kernel on Ascend (the
    crash of issue 34), and a dense and a tiny one, each family and both torch settings met."""
    picks = (("tiny-moe", "910b", True), ("qwen3-235b-a22b", "910b", True), ("mixtral-8x7b", "mi300x", False),
             ("tiny-llama", "h100", False), ("llama-3.1-8b", "mi300x", True), ("gpt-oss-120b", "h100", True))
    return [Case(m, a, t and torch_available) for m, a, t in picks]


@contextlib.contextmanager
def shared_work():
    """Inside: the search of a (model, cluster, scenario) and the trace of a (model, manifest) run
    once, however many runs of the sweep ask (deep copies handed out: a run cannot change
    another's)."""
    import dayzero.ops.report as ops_report
    import dayzero.planner.search.search as search

    plans: dict = {}
    traces: dict = {}
    real_plan, real_analyze = search.plan, ops_report.analyze

    def plan(spec, cluster, gbs, seq, precision="bf16", *a, **k):
        key = (spec.name, spec.source if hasattr(spec, "source") else "", cluster.name, gbs, seq, precision, repr(a),
               repr(sorted(k.items())))
        if key not in plans:
            plans[key] = real_plan(spec, cluster, gbs, seq, precision, *a, **k)
        return copy.deepcopy(plans[key])

    def analyze(model, manifest="cuda", seq=None, **k):
        key = (model, manifest, seq, repr(sorted(k.items())))
        if key not in traces:
            traces[key] = real_analyze(model, manifest=manifest, seq=seq, **k)
        return traces[key]

    with mock.patch.object(search, "plan", plan), mock.patch.object(ops_report, "analyze", analyze):
        yield


@dataclass(frozen=True)
class Outcome:
    case: Case
    code: int
    out: str
    err: str
    out_dir: Path


def run(case: Case, out_dir: Path, json_out: bool = False) -> Outcome:
    """``dayzero day0`` of ``case`` through the CLI's entry point, its output captured."""
    import dayzero.report.day0 as day0
    from dayzero.cli import common
    from dayzero.cli.app import main

    argv = ["day0", case.model, "-a", case.accelerator, "-n", str(case.devices), "--tokens", "10T", *case.extra,
            "--out", str(out_dir)] + (["--json"] if json_out else [])
    absent = contextlib.nullcontext() if case.torch else mock.patch.object(
        day0, "missing", lambda *modules: list(modules))
    out, err = io.StringIO(), io.StringIO()
    with absent, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            mock.patch.object(common.console, "_width", WIDTH), mock.patch.object(common.err_console, "_width", WIDTH):
        code = main(argv)
    return Outcome(case, code, out.getvalue(), err.getvalue(), out_dir)


def problems(o: Outcome, json_out: bool = False) -> list[str]:
    """What is wrong with a run: a traceback, a failing exit, a missing section or file, a
    section that did not render, a line wider than the console. Empty: a complete report."""
    from dayzero.report.day0_render import tables

    bad = []
    if "Traceback" in o.out + o.err:
        bad.append("traceback: " + (o.out + o.err)[-400:])
    if o.code != 0:
        return bad + [f"exit {o.code}: {o.err.strip()[-300:]}"]
    files = {n: o.out_dir / n for n in ("report.json", "report.md", "report.html")}
    missing = [n for n, p in files.items() if not p.is_file() or not p.stat().st_size]
    if missing:
        return bad + [f"missing {', '.join(missing)}"]
    r = json.loads(files["report.json"].read_text())
    bad += [f"section {s} missing" for s in SECTIONS if s not in r]
    if json_out:
        printed = json.loads(o.out)
        if printed.get("model") != r.get("model"):
            bad.append("--json differs from report.json")
    else:
        if not o.out.lstrip().startswith("Day 0:") and "Day 0:" not in o.out:
            bad.append("no summary printed")
        # a line may pass the width only where one word (a --layer-split list of a copyable command) is longer
        # (or one flag and its value: a copyable command breaks between pairs, never inside one)
        wide = [line for line in o.out.splitlines()
                if len(line) > WIDTH and max(len(w) for w in line.split()) < WIDTH - 12
                and len([w for w in line.split() if w != "\\"]) > 2]
        if wide:
            bad.append(f"{len(wide)} line(s) over {WIDTH} columns: {wide[0]!r}")
    op = r.get("operators", {})
    if o.case.torch and "coverage" not in op:
        bad.append(f"operators not traced with torch present: {op.get('note')}")
    if not o.case.torch and "not installed" not in op.get("note", ""):
        bad.append(f"operators without torch: {op}")
    md, html = files["report.md"].read_text(), files["report.html"].read_text()
    for t in tables(r):
        if f"## {t.title}" not in md:
            bad.append(f"report.md lacks {t.title!r}")
        # the HTML shows the summary as its verdict banner, not as a table (report/day0_html.py)
        if t.title != "Summary" and escape(t.title) not in html:
            bad.append(f"report.html lacks {t.title!r}")
    if not html.rstrip().endswith("</html>"):
        bad.append("report.html is cut short")
    for k in op.get("needs_kernel", ()):
        name = k["op"] if isinstance(k, dict) else k
        if name not in md:
            bad.append(f"operator {name} needing a kernel not in report.md")
    for a in r["model"].get("approximations", ()):
        if a not in md or a not in html.replace("&#x27;", "'").replace("&quot;", '"').replace("&amp;", "&") \
                .replace("&lt;", "<").replace("&gt;", ">"):
            bad.append(f"approximation {a[:60]!r} not in report.md and report.html")
    if re.search(r"\bdict\b|\{'", md):
        bad.append("report.md shows a raw Python object")
    return bad
