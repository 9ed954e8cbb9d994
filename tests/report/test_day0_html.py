"""report.html reads in one screen: the verdict first, the three decision charts under it, the
tables after them (the long ones folded); it renders a report where nothing fits and a derived
model's approximations beside the figures they shape. The charts' axes separate the points and
their legends list only the series drawn."""

from __future__ import annotations

import copy
import json
import re

import pytest

from dayzero.report import svg
from dayzero.report.day0 import Day0Request, build
from dayzero.report.day0_html import DECISION, FOLD_ROWS, decision_charts, to_html, verdict
from dayzero.report.layout_text import describe
from dayzero.specs.cluster import build_cluster


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    """A small llama-type model no preset has, on 16 H100s, with 4 pipeline stages possible."""
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 1536,
           "intermediate_size": 4608, "num_hidden_layers": 10, "num_attention_heads": 12, "num_key_value_heads": 4,
           "vocab_size": 48000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
           "hidden_act": "silu"}
    d = tmp_path_factory.mktemp("never-seen")
    (d / "config.json").write_text(json.dumps(cfg))
    r = build(Day0Request(str(d / "config.json"), build_cluster("h100", 16), gbs=64, operators=False))
    return json.loads(json.dumps(r))  # as report.json holds it


def _figure(html: str, name: str) -> str:
    return re.search(rf'<figure data-chart="{re.escape(name)}">(.*?)</figure>', html, re.S).group(1)


def test_verdict_then_the_decision_charts_then_the_tables(report):
    html = to_html(report)
    first_table = html.index("<details")
    assert html.index('id="verdict"') < min(html.index(f'data-chart="{n}"') for n in DECISION)
    assert max(html.index(f'data-chart="{n}"') for n in DECISION) < first_table
    # long tables start folded, short ones open; the summary table is the verdict's, not repeated
    for m in re.finditer(r"<details( open)?><summary>([^<]*)</summary>(.*?)</details>", html, re.S):
        rows = m.group(3).count("<tr>") - ("<th>" in m.group(3))
        assert (m.group(1) is None) == (rows > FOLD_ROWS), m.group(2)
    assert "<summary>Summary</summary>" not in html
    assert "<script" not in html and "url(" not in html and "@import" not in html


def test_the_verdict_says_fits_where_how_long_energy_and_cost(report):
    v = verdict(report)
    b, tr = report["best"], report["training"]
    assert v.tone in ("ok", "warn") and v.title.startswith("Fits: ") and report["cluster"]["name"] in v.title
    assert v.layout == describe(b["parallel"])
    figs = {label: value for label, value, _ in v.figures}
    assert figs["step"] == f"{b['step_s']:.4g} s" and figs["training"] == f"{tr['wall_days']:,.1f} days"
    assert "MWh" in figs["energy"]
    # the card's public price (device_prices.json) with its source, or the flag to give one
    assert figs["cost"] != "not priced" if tr["cost"] else figs["cost"] == "not priced"
    fails = [c for c in report["checks"] if not c["pass"]]
    assert (v.tone == "warn") == bool(fails) and len(v.findings) == len(fails)
    priced = copy.deepcopy(report)
    priced["training"]["cost"] = {"total": 2.5e6, "price_per_device_hour": 2.0}
    assert dict((lb, val) for lb, val, _ in verdict(priced).figures)["cost"] == "2.5 M"


def test_a_report_where_nothing_fits_renders_its_verdict(report):
    r = {k: report[k] for k in ("model", "cluster", "scenario", "operators")}
    r["plans"] = []
    html = to_html(r)
    assert "Does not fit: " in html and "no layout fits in device memory" in html and decision_charts(r) == []
    r["no_fit"] = {"reason": "no layout fits in 85% of 80.0 GiB per device on 16 devices", "devices_needed": 64}
    v = verdict(r)
    assert v.tone == "no" and v.findings == (r["no_fit"]["reason"],)
    assert ("needs", "64 devices", "the smallest count that fits") in v.figures
    assert "64 devices" in to_html(r)


def test_a_derived_models_approximations_sit_under_the_figures(report):
    r = copy.deepcopy(report)
    notes = [f"layer {i}: linear attention modelled as attention over a window of 128 keys" for i in range(6)]
    r["model"].update(derived_from_modeling_code=True, approximations=notes)
    v = verdict(r)
    figs = {label: value for label, value, _ in v.figures}
    assert figs["step"].endswith(" *") and figs["MFU"].endswith(" *")
    assert v.notes[0].startswith("* derived from its modeling code") and len(v.notes) == len(notes) + 1
    html = to_html(r)
    banner = html[html.index('id="verdict"'):html.index("</header>")]
    assert all(n in banner for n in notes) and "3 more</summary>" in banner  # the rest folded, still there
    assert "approximation" not in verdict(report).notes


def test_step_chart_labels_each_plan_with_its_layout_and_lists_only_terms_drawn(report):
    chart = _figure(to_html(report), DECISION[0])
    text = " ".join(re.findall(r"<text[^>]*>([^<]*)</text>", chart))
    for i, p in enumerate(report["plans"]):
        assert f"#{i + 1}" in text
        words = [w for w in describe(p["parallel"]).split() if not w.startswith("gbs")]
        assert all(w in text for w in words), (words, text)
    rects = re.findall(r"<rect[^>]*><title>[^<]*</title>", chart)
    drawn = {re.search(r"<title>[^<]*, ([^:]+):", rect).group(1) for rect in rects}
    legend = set(re.findall(r'height="10" fill="[^"]+"/>\n<text[^>]*>([^<]*)</text>', chart))
    assert legend == drawn and "stragglers" not in legend  # sigma 0: no straggler term, no legend entry


def test_memory_chart_has_a_column_per_stage_and_the_capacity(report):
    chart = _figure(to_html(report), DECISION[1])
    stages = report["plans"][0]["memory"]["stages"]
    assert f"{len(stages)} stages" in chart and "capacity" in chart and "target 85%" in chart
    assert len(set(re.findall(r"<title>(\d+), ", chart))) == len(stages)


@pytest.mark.parametrize("values, log, lo_max, hi_min", [
    ([226.4, 239.0, 272.0, 18578.0], True, 226.4, 18578.0),   # a cloud spanning 80x: decades
    ([12.2, 12.5, 13.1, 14.3], False, 12.2, 14.3),             # a narrow cloud: zoomed, not from 0
    ([0.0, 3.0], False, 0.0, 3.0),
])
def test_axis_is_chosen_from_the_data(values, log, lo_max, hi_min):
    ax = svg.axis_for(values)
    assert ax.log is log and ax.lo <= lo_max and ax.hi >= hi_min
    assert list(ax.ticks) == sorted(ax.ticks) and ax.ticks[0] >= ax.lo and ax.ticks[-1] <= ax.hi * (1 + 1e-9)
    if not log:
        assert (ax.hi - ax.lo) <= 2 * (max(values) - min(values)) + 1e-9  # the range hugs the values
    assert all(0.0 <= ax.frac(v) <= 1.0 for v in values)
    assert svg.axis_for(values, zero=True).lo == 0.0


def test_scatter_separates_the_best_plans_from_a_cloud_80_times_wider():
    """The seed scenario's shape: five plans within 20 % of each other, layouts up to 80x slower."""
    plans = [(57.4, 226.4), (56.0, 238.9), (58.1, 262.7), (57.0, 265.4), (51.1, 271.6)]
    cloud = [(30.0 + i * 0.1, 300.0 * 1.02 ** i) for i in range(250)]
    pts = cloud + plans
    chosen = [(len(cloud) + i, f"#{i + 1}") for i in range(len(plans))]
    out = svg.scatter("t", pts, chosen, "peak memory, GB", "step s", ycap=2 * 271.6)
    dots = [(float(x), float(y)) for x, y in re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)" r="5"', out)]
    assert len(dots) == 5
    # no two dots overlap (radius 5): on a linear axis to 42,000 s they would all sit within 2 px
    assert min(((a[0] - b[0]) ** 2 + (a[1] - b[1]) ** 2) ** 0.5 for i, a in enumerate(dots) for b in dots[i + 1:]) >= 10
    assert re.search(r">\d+ slower, up to 4\d,\d{3} step s: open circles on the top edge<", out)
    labels = [(float(x), float(y), t) for x, y, t in re.findall(r'<text x="([\d.]+)" y="([\d.]+)" font-weight="bold"'
                                                                r'[^>]*>(#\d)</text>', out)]
    assert sorted(t for *_, t in labels) == [f"#{i + 1}" for i in range(5)]
    boxes = [(x, y - 12, x + svg.CHAR_W * len(t), y) for x, y, t in labels]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not (a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]), (a, b)


def test_a_legend_lists_only_series_with_a_value():
    out = svg.stacked_bars("t", ["a", "b"], {"compute": [1.0, 2.0], "stragglers": [0.0, 0.0], "bubble": [0.5, 0]},
                           "s")
    assert ">compute<" in out and ">bubble<" in out and "stragglers" not in out


def test_wrap_breaks_between_words():
    assert svg.wrap("tp2 pp1 dp512 selective(moe_act+mlp) sp", 20) == ["tp2 pp1 dp512", "selective(moe_act+mlp)",
                                                                      "sp"]
    assert svg.wrap("", 5) == [""]
