"""``dayzero monitor``: one frame from a metrics stream or an exporter, its JSON, the rules file it
writes; and the Grafana dashboard names only metrics the exporter serves."""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest

from dayzero.cli.app import main
from dayzero.cli.monitor_dashboard import sparkline
from dayzero.monitor.names import BY_NAME
from dayzero.monitor.prometheus_rules import shipped_rules_path
from dayzero.monitor.rank_values import RankValues, ranks_event
from dayzero.monitor.rules import RULES

METRIC = re.compile(r"\b(dayzero_[a-z_]+|ALERTS)\b")


def cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def stream(tmp_path, steps=12, sleepy_rank=None, end=True):
    """A 4-rank run's stream with per-rank rows; ``sleepy_rank`` spends 0.5 s more outside communication."""
    lines = []
    for s in range(1, steps + 1):
        lines.append({"step": s, "loss": 5.0 - 0.1 * s, "grad_norm": 1.0, "lr": 1e-3, "tokens": 128,
                      "step_time_s": 1.0, "tokens_per_s": 128.0, "peak_mem_bytes": 2**30, "comm_time_s": 0.6,
                      "attempt": 1})
        rows = [RankValues(rank=r, step_s=1.0, comm_s=0.05 if r == sleepy_rank else (0.55 if sleepy_rank is not None
                                                                                    else 0.05),
                           tokens_per_s=128.0, mem_peak_bytes=2**30, mem_capacity_bytes=2**34, time_s=1000.0 + s)
                for r in range(4)]
        lines.append({**ranks_event(s, rows), "attempt": 1})
    if end:
        lines.append({"event": "end", "steps": steps, "attempt": 1})
    d = tmp_path / "run"
    d.mkdir()
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return d


def test_sparkline():
    assert sparkline([1, 2, 3]) == "▁▄█"
    assert sparkline([2, 2]) == "▅▅"
    assert sparkline([1, None, float("nan"), 3]) == "▁××█"
    assert len(sparkline(list(range(500)), width=40)) == 40
    assert sparkline([]) == ""


def test_once_frame_shows_curve_ranks_and_the_straggler(tmp_path, capsys):
    run = stream(tmp_path, sleepy_rank=2)
    code, out, _ = cli(capsys, "monitor", str(run), "--once")
    assert code == 0
    assert "DayzeroStragglerRank" in out and "step 12" in out and "finished" in out
    assert "▁" in out and "█" in out  # the loss sparkline
    code, out, _ = cli(capsys, "monitor", str(run), "--json")
    doc = json.loads(out)
    straggler = [a for a in doc["alerts"] if a["name"] == "DayzeroStragglerRank"]
    assert straggler and straggler[0]["ranks"] == [2]
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 3] and doc["per_rank"]
    assert doc["losses"][-1] == [12, pytest.approx(3.8)]


def test_healthy_stream_has_no_alerts(tmp_path, capsys):
    code, out, _ = cli(capsys, "monitor", str(stream(tmp_path)), "--json")
    assert code == 0 and json.loads(out)["alerts"] == []


def test_running_stream_without_new_steps_is_a_hang(tmp_path, capsys):
    run = stream(tmp_path, end=False)  # last step at unix 1012, long ago
    doc = json.loads(cli(capsys, "monitor", str(run / "metrics.jsonl"), "--json")[1])
    assert not doc["finished"] and "DayzeroHang" in [a["name"] for a in doc["alerts"]]


def test_exporter_url(capsys):
    from dayzero.monitor.exporter import Exporter, JobValues, Snapshot
    from dayzero.monitor.ports import free_port_range

    port = free_port_range(1)
    ex = Exporter(port, addr="127.0.0.1").start()
    rows = tuple(RankValues(rank=r, step_s=1.0, comm_s=0.1, tokens_per_s=99.0, mem_peak_bytes=9e9,
                            mem_capacity_bytes=1e10, time_s=1e12) for r in range(2))
    ex.update(Snapshot("urljob", JobValues(step=3, loss=4.25), rows, {0: "a", 1: "a"}))
    try:
        code, out, _ = cli(capsys, "monitor", f"http://127.0.0.1:{port}", "--json")
        assert code == 0
        doc = json.loads(out)
        assert doc["job"] == "urljob" and doc["step"] == 3 and doc["loss"] == 4.25
        assert {a["name"]: a["ranks"] for a in doc["alerts"]}["DayzeroMemoryHigh"] == [0, 1]
        code, out, _ = cli(capsys, "monitor", f"http://127.0.0.1:{port}/metrics", "--once")
        assert code == 0 and "urljob" in out and "DayzeroMemoryHigh" in out
    finally:
        ex.close()


@pytest.mark.parametrize("argv,needle", [
    (["monitor", "/nonexistent/run"], "no such run directory"),
    (["monitor"], "give a run directory"),
    (["monitor", "http://127.0.0.1:1", "--once"], "cannot scrape"),
    (["monitor", "--rules", "--alert-threshold", "memory_ratio=abc"], "KEY=NUMBER"),
])
def test_bad_input_is_one_line(capsys, argv, needle):
    code, _, err = cli(capsys, *argv)
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2 and len(lines) == 1 and needle in lines[0], err


def test_write_rules_equals_the_shipped_file(tmp_path, capsys):
    out = tmp_path / "alerts.yml"
    assert cli(capsys, "monitor", "--write-rules", str(out))[0] == 0
    assert out.read_text() == shipped_rules_path().read_text()
    assert cli(capsys, "monitor", "--write-rules", str(out), "--alert-threshold", "hang_s=60", "--json")[0] == 0
    assert "time() - dayzero_last_step_timestamp_seconds > 60" in out.read_text()
    doc = json.loads(cli(capsys, "monitor", "--rules", "--json")[1])
    assert [r["name"] for r in doc["rules"]] == [r.name for r in RULES]


def test_rules_name_only_exported_metrics():
    for r in RULES:
        names = set(METRIC.findall(r.promql()))
        assert names and names <= set(BY_NAME), (r.name, names - set(BY_NAME))


def test_grafana_dashboard_names_only_exported_metrics():
    doc = json.loads((resources.files("dayzero.monitor") / "grafana_dashboard.json").read_text())
    assert doc["title"] and doc["uid"] and doc["panels"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    used = set()
    for p in doc["panels"]:
        assert p["targets"] and {"h", "w", "x", "y"} <= set(p["gridPos"]), p["title"]
        for t in p["targets"]:
            names = set(METRIC.findall(t["expr"]))
            assert names, (p["title"], t["expr"])
            assert names - {"ALERTS"} <= set(BY_NAME), (p["title"], names - set(BY_NAME))
            used |= names
    for want in ("dayzero_loss", "dayzero_step_seconds", "dayzero_memory_peak_bytes", "dayzero_tokens_total"):
        assert want in used
