"""dayzero day0 (one report from a config to a Day-0 decision) and dayzero compare (the best plan
on several cards), and the --tokens parser every cost-taking verb shares."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dayzero.cli.app import main
from dayzero.cli.common import parse_tokens
from dayzero.errors import ConfigError
from dayzero.planner.training_cost import CostOptions, cost_of_prediction
from dayzero.specs.cluster import build_cluster, get_cluster

SECTIONS = ("model", "cluster", "scenario", "operators", "search", "plans", "candidates", "best", "checks", "training")


def run(capsys, argv):
    code = main(argv)
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out


def day0(capsys, tmp_path, *argv):
    run(capsys, ["day0", *argv, "--out", str(tmp_path)])
    return json.loads((tmp_path / "report.json").read_text())


def llama_config(tmp_path: Path) -> Path:
    """A small llama-type config no preset has."""
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 1536,
           "intermediate_size": 4608, "num_hidden_layers": 10, "num_attention_heads": 12, "num_key_value_heads": 4,
           "vocab_size": 48000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
           "hidden_act": "silu"}
    d = tmp_path / "never-seen"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d / "config.json"


def test_day0_seed_scenario_writes_the_report(tmp_path, capsys):
    r = day0(capsys, tmp_path, "dense-3t", "--tokens", "15T")
    assert {p.name for p in tmp_path.iterdir()} >= {"report.json", "report.md", "report.html"}
    for s in SECTIONS:
        assert s in r, s
    assert r["cluster"]["name"] == "ascend910b-8192" and r["model"]["name"] == "dense-3t"
    best = r["plans"][0]
    expect = cost_of_prediction(best, get_cluster("ascend910b-8192"), CostOptions(tokens=15e12))
    assert r["training"] == json.loads(json.dumps(expect))
    # facility energy at three levels, goodput with the interval's reason, the seed's claims
    e, f = r["training"]["energy"], r["training"]["failures"]
    assert e["device_mwh"] < e["node_mwh"] < e["it_mwh"] < e["mwh"] and e["pue"] > 1
    assert "Young" in f["interval_reason"] and 0 < r["training"]["goodput"] < 1
    assert {c["claim"] for c in r["claims"]} >= {"3T parameters in BF16 need about 600 GB",
                                                 "ZeRO cuts memory about 8x"}
    assert next(c for c in r["claims"] if "600 GB" in c["claim"])["holds"] is False  # 3T x 2 B = 6 TB
    assert r["training"]["tokens"] == 15e12
    assert [c["metric"] for c in r["checks"]] == ["mfu", "peak_memory_fraction", "comm_ratio"]
    assert r["candidates"][0]["step_s"] == pytest.approx(best["time"]["step_s"])
    limit = r["scenario"]["max_memory"] * best["memory"]["capacity_bytes"]
    assert all(c["peak_bytes"] <= limit for c in r["candidates"])
    op = r["operators"]
    assert "coverage" in op or op["note"]
    md = (tmp_path / "report.md").read_text()
    assert f"{best['time']['step_s']:.4g}" in md and "Day-0 checks" in md


def test_day0_never_seen_config_and_accelerator(tmp_path, capsys):
    cfg = llama_config(tmp_path)
    out_dir = tmp_path / "out"
    out = run(capsys, ["day0", str(cfg), "-a", "h100", "-n", "16", "--gbs", "64", "--no-ops",
                       "--price-per-device-hour", "2.5", "--out", str(out_dir)])
    r = json.loads((out_dir / "report.json").read_text())
    assert r["model"]["params_total"] > 0 and r["cluster"]["devices"] == 16
    assert r["training"]["cost"]["total"] == pytest.approx(r["training"]["device_hours"] * 2.5)
    assert r["operators"]["note"] == "not traced (--no-ops)"
    # the first next step validates the plan's proxy layout on this machine (its comment may come first)
    assert re.search(r"next: (#[^\n]*\n\s+)?dayzero validate", out) and "report.json" in out


def test_day0_default_directory_is_under_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = llama_config(tmp_path)
    run(capsys, ["day0", str(cfg), "-a", "h100", "-n", "8", "--gbs", "32", "--no-ops"])
    made = list((tmp_path / "runs").iterdir())
    assert [p.name for p in made] == ["day0-never-seen-nvidia_h100_sxm-8"]
    assert (made[0] / "report.html").exists() and not (tmp_path / "report.json").exists()


def test_html_is_self_contained_with_one_svg_per_chart(tmp_path, capsys):
    from dayzero.report.day0_html import charts

    r = day0(capsys, tmp_path, str(llama_config(tmp_path)), "-a", "h100", "-n", "16", "--gbs", "64", "--no-ops")
    html = (tmp_path / "report.html").read_text()
    names = [n for n, _ in charts(r)]
    assert {"Memory per stage", "Step time of the best "
                                "plans", "Communication per step", "Candidate cloud"} <= set(names)
    assert html.count("<svg") == html.count("</svg>") == len(names)
    for n in names:
        assert f'data-chart="{n}"' in html
    assert not re.search(r"""(src|href)\s*=\s*["']?[^"'>]*http""", html, re.IGNORECASE)
    assert "<script" not in html and "@import" not in html and "url(" not in html


def test_compare_three_accelerators(capsys):
    argv = ["compare", "llama-3.1-8b", "--accelerators", "h100,910b,mi300x", "--devices", "16", "--gbs", "64"]
    out = run(capsys, argv)
    obj = json.loads(run(capsys, [*argv, "--json"]))
    rows = obj["rows"]
    assert obj["rank_by"] == "days" and [r["wall_days"] for r in rows] == sorted(r["wall_days"] for r in rows)
    assert {r["accelerator"] for r in rows} == {"nvidia_h100_sxm", "huawei_ascend_910b", "amd_mi300x"}
    for r in rows:
        assert r["fits"] and r["training"]["wall_days"] == r["wall_days"] and r["hbm_gib"] > 0
        assert f"{r['step_s']:.4g}" in out and f"{r['wall_days']:,.1f}" in out
    # a faster step trains the same tokens in proportionally fewer ideal days
    a, b = rows[0], rows[1]
    assert a["training"]["ideal_days"] / b["training"]["ideal_days"] == pytest.approx(a["step_s"] / b["step_s"],
                                                                                      rel=1e-6)
    assert "dayzero day0 llama-3.1-8b --accelerator" in out.split("next:", 1)[1]


def test_compare_rank_by(capsys):
    argv = ["compare", "llama-3.1-8b", "--accelerators", "h100,910b,mi300x", "--devices", "16", "--gbs", "64",
            "--json"]
    tpj = json.loads(run(capsys, [*argv, "--rank-by", "tokens-per-joule"]))["rows"]
    assert [r["tokens_per_joule"] for r in tpj] == sorted((r["tokens_per_joule"] for r in tpj), reverse=True)
    cost = json.loads(run(capsys, [*argv, "--rank-by", "cost"]))["rows"]
    priced = [r for r in cost if r["cost"] is not None]
    assert priced and cost[:len(priced)] == priced  # cards without a public price come last
    assert priced[0]["cost_source"].startswith("USD")
    assert main([*argv, "--rank-by", "speed"]) == 2
    assert "--rank-by" in capsys.readouterr().err


def test_compare_clusters_and_a_card_that_cannot_hold_the_model(capsys):
    obj = json.loads(run(capsys, ["compare", "llama-3.1-70b", "--accelerators", "h100,910b", "--devices", "2",
                                  "--gbs", "16", "--json"]))
    assert [r["fits"] for r in obj["rows"]] == [False, False] and "no layout" in obj["rows"][0]["reason"]
    assert main(["compare", "llama-3.1-8b", "--clusters", "dgx-h100-1024", "--devices", "8"]) == 2


@pytest.mark.parametrize("text, value", [("15T", 15e12), ("300B", 300e9), ("1e12", 1e12), ("2.5t", 2.5e12),
                                         ("1,000,000", 1e6), ("500M", 5e8)])
def test_tokens_parser(text, value):
    assert parse_tokens(text) == pytest.approx(value)


@pytest.mark.parametrize("bad", ["15X", "abc", "", "-1T", "nan", "inf", "0", "T"])
def test_tokens_parser_rejects(bad, capsys):
    with pytest.raises(ConfigError):
        parse_tokens(bad)
    assert main(["plan", "llama-3.1-8b", "-a", "h100", "-n", "8", "--tokens", bad]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dayzero: error: --tokens") and len(err.splitlines()) == 1


def test_predict_and_plan_carry_training(capsys):
    argv = ["llama-3.1-8b", "-a", "h100", "-n", "8", "--gbs", "64", "--tokens", "300B", "--pue", "1.2"]
    pred = json.loads(run(capsys, ["predict", *argv, "--tp", "2", "--json"]))
    assert pred["training"] == json.loads(json.dumps(cost_of_prediction(pred, build_cluster("h100", 8),
                                                                        CostOptions(tokens=3e11, pue=1.2))))
    # the H100's public price, with its source
    assert pred["training"]["cost"]["price_per_device_hour"] > 0 and "AWS" in pred["training"]["cost"]["price_source"]
    plan = json.loads(run(capsys, ["plan", *argv, "--json"]))
    assert all(p["training"]["tokens"] == 3e11 for p in plan["plans"])
    out = run(capsys, ["plan", *argv])
    assert "wall time" in out and "checkpoint" in out and "TFLOP/s per W" in out
    assert main(["plan", *argv, "--pue", "0.9"]) == 2


CHROMIUM = next((c for c in ("chromium", "chromium-browser", "google-chrome") if shutil.which(c)), None)
SCREEN = (1400, 900)  # a laptop's browser window: the verdict and the decision charts must be in it
# injected into the test's copy of report.html only (the report itself has no script): the boxes of
# the verdict, every chart and every <details>, in CSS pixels from the page's top left, as the title
MEASURE = ("<script>addEventListener('load',()=>{const q=s=>[...document.querySelectorAll(s)].map(e=>{"
           "const b=e.getBoundingClientRect();return [e.id||e.dataset.chart||e.tagName,b.left,b.top,b.right,"
           "b.bottom]});document.title='BOXES'+JSON.stringify({verdict:q('#verdict'),charts:q('figure[data-chart]'),"
           "svgs:q('svg'),details:q('details')})});</script>")


def browser(tmp_path, *args):
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync", "--enable-logging=stderr",
           "--v=0", f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={SCREEN[0]},{SCREEN[1]}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (CI installs Debian's: .ci/run)")
def test_report_reads_in_one_screen_in_a_headless_browser(tmp_path, capsys):
    """Chromium opens report.html offline at 1400x900: the verdict and at least two of the decision
    charts lie wholly inside the first screen, every chart is laid out with a size, nothing is
    logged to the console, and the screenshot of that screen is not blank."""
    import html as html_lib

    from dayzero.report.day0_html import DECISION

    day0(capsys, tmp_path, str(llama_config(tmp_path)), "-a", "h100", "-n", "16", "--gbs", "64", "--no-ops")
    html = tmp_path / "report.html"
    probe = tmp_path / "probe.html"
    probe.write_text(html.read_text().replace("</body>", MEASURE + "</body>"))
    dom = browser(tmp_path, "--dump-dom", probe.as_uri())
    m = re.search(r"<title>BOXES(.*?)</title>", dom.stdout, re.S)
    assert m, dom.stdout[:500] + dom.stderr[-1000:]
    boxes = json.loads(html_lib.unescape(m.group(1)))

    def on_screen(box):
        _, left, top, right, bottom = box
        return left >= 0 and top >= 0 and right <= SCREEN[0] and bottom <= SCREEN[1] and right - left > 100

    assert len(boxes["verdict"]) == 1 and on_screen(boxes["verdict"][0]), boxes["verdict"]
    first = [b for b in boxes["charts"] if b[0] in DECISION and on_screen(b) and b[4] - b[2] > 150]
    assert len(first) >= 2, boxes["charts"]
    assert boxes["verdict"][0][4] <= min(b[2] for b in first)  # the verdict above the charts
    assert all(b[4] > SCREEN[1] * 0.5 for b in boxes["details"])  # the tables come after
    assert len(boxes["svgs"]) == html.read_text().count("<svg")
    assert all(b[3] - b[1] > 100 and b[4] - b[2] > 50 for b in boxes["svgs"])
    assert "CONSOLE" not in dom.stderr and "Uncaught" not in dom.stderr, dom.stderr[-2000:]

    Image = pytest.importorskip("PIL.Image")  # matplotlib's dependency, in the test extra
    shot = tmp_path / "report.png"
    browser(tmp_path, f"--screenshot={shot}", html.as_uri())
    img = Image.open(shot).convert("RGB")
    assert img.size == SCREEN
    colours = img.getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 50  # text, bars and points, not a blank or one-colour page
    white = next((n for n, c in (colours or []) if c == (255, 255, 255)), 0)
    assert white < 0.9 * SCREEN[0] * SCREEN[1]


def test_outputs_fit_80_columns_and_help_has_examples(tmp_path, capsys, monkeypatch):
    from dayzero.cli import common

    monkeypatch.setattr(common.console, "_width", 80)
    monkeypatch.chdir(tmp_path)  # relative paths: a path longer than a line cannot wrap
    out = run(capsys, ["compare", "llama-3.1-8b", "--accelerators", "h100,h200,b200,mi300x,910b", "--devices", "16",
                       "--gbs", "64"])
    llama_config(tmp_path)
    out += run(capsys, ["day0", "never-seen/config.json", "-a", "h100", "-n", "16", "--gbs", "64", "--no-ops",
                        "--out", "r"])
    assert [line for line in out.splitlines() if len(line) > 80] == []
    for verb in ("day0", "compare"):
        assert main([verb, "--help"]) == 0 and "Example" in capsys.readouterr().out


def test_operator_tracing_failure_is_a_note(tmp_path, monkeypatch):
    """A model transformers cannot trace still gets its report; the section says why."""
    import dayzero.ops.report as ops_report
    from dayzero.report.day0 import Day0Request, build
    from dayzero.specs.cluster import build_cluster

    def boom(*a, **k):
        raise RuntimeError("no modeling code for this config")

    monkeypatch.setattr(ops_report, "analyze", boom)
    pytest.importorskip("transformers")
    r = build(Day0Request(str(llama_config(tmp_path)), build_cluster("h100", 8), gbs=32))
    assert r["operators"]["note"] == "not traced: RuntimeError: no modeling code for this config"
    assert r["operators"]["manifest"] == "cuda" and r["plans"]


def test_unwritable_out_is_one_line(tmp_path, capsys):
    f = tmp_path / "a-file"
    f.write_text("")
    assert main(["day0", str(llama_config(tmp_path)), "-a", "h100", "-n", "8", "--gbs", "32", "--no-ops",
                 "--out", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dayzero: error: --out") and len(err.splitlines()) == 1
