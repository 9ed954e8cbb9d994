"""The exporter: what a scrape returns (names, labels, units), counters across a restart, and the
one-line errors of bad --metrics-* input."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import urllib.request
from dataclasses import fields

import pytest

from dayzero.cli.app import main
from dayzero.monitor.counters import Counters, counters_path
from dayzero.monitor.exporter import Exporter, JobValues, Snapshot, series
from dayzero.monitor.names import BY_NAME, METRICS
from dayzero.monitor.ports import PortError, check_ports, free_port_range
from dayzero.monitor.rank_values import RankValues, step_sample, vector_size

prom = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402


def row(rank, **kw):
    base = dict(rank=rank, step_s=1.0, comm_s=0.25, tokens_per_s=100.0, mem_peak_bytes=5e8, mem_capacity_bytes=1e9,
                steps_total=7, tokens_total=700, comm_s_total=1.75, rss_bytes=3e8, cpu_s_total=12.5, time_s=1e9)
    return RankValues(**{**base, **kw})


MOE = {"layers": [1, 3], "max_mean": [1.5, 2.0], "cv": [0.1, 0.2], "dropped": [0.0, 0.0], "rank_max_mean": [1.1, 1.2]}


def snap(**kw):
    job = {**dict(step=7, loss=2.5, grad_norm=1.0, lr=1e-3, checkpoint_step=5, moe=MOE), **kw}
    return Snapshot("job1", JobValues(**job),
                    (row(0), row(1, step_s=2.0)), {0: "nodeA", 1: "nodeA"})


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def test_names_follow_prometheus_conventions():
    for m in METRICS:
        assert m.name.startswith("dayzero_") and m.name == m.name.lower()
        assert m.name.endswith("_total") == (m.kind == "counter"), m.name
        assert {"job", "rank", "node"} <= set(m.labels)
        assert not any(m.name.endswith(bad) for bad in ("_ms", "_mb", "_gb", "_percent", "_kb")), m.name


def test_rank_values_round_trip_through_a_vector():
    r = row(3, temperature_c=None, power_w=412.0)
    v = r.to_vector()
    names = [f.name for f in fields(RankValues)]
    assert len(v) == vector_size() and math.isnan(v[names.index("temperature_c")])
    assert RankValues.from_vector(v) == r
    s = step_sample(7, 2.5, [row(1, comm_s=0.0), row(0)], last_checkpoint_step=5)
    assert s.ranks == (0, 1) and s.busy_s == (0.75, 1.0) and s.last_checkpoint_step == 5


def test_scrape_serves_every_series_with_labels():
    port = free_port_range(1)
    ex = Exporter(port, addr="127.0.0.1").start()
    try:
        assert "dayzero_" not in scrape(port)  # nothing before the first step
        ex.update(snap())
        fams = {f.name: f for f in text_string_to_metric_families(scrape(port))}
    finally:
        ex.close()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fams.values() for s in f.samples}
    names = {name for name, _ in samples}
    assert names <= set(BY_NAME), names - set(BY_NAME)  # nothing the table does not declare
    lab = (("job", "job1"), ("node", "nodeA"), ("rank", "1"))
    assert samples[("dayzero_loss", lab)] == 2.5
    assert samples[("dayzero_step_seconds", lab)] == 2.0
    assert samples[("dayzero_step_busy_seconds", lab)] == 1.75
    assert samples[("dayzero_steps_total", lab)] == 7
    assert samples[("dayzero_checkpoint_last_step", lab)] == 5
    assert samples[("dayzero_moe_load_max_mean_ratio", (lab[0], ("layer", "3"), *lab[1:]))] == 2.0
    assert fams["dayzero_steps"].type == "counter"  # the parser strips _total from the family name
    assert ("dayzero_device_power_watts", lab) not in samples  # unknown values are not invented


def test_nonfinite_loss_is_exported_as_such():
    got = {(n, lab["rank"]): v for n, lab, v in series(snap(loss=None))}
    assert ("dayzero_loss", "0") not in got
    nan = {(n, lab["rank"]): v for n, lab, v in series(
        Snapshot("j", JobValues(loss=math.nan), (row(0),)))}
    assert math.isnan(nan[("dayzero_loss", "0")])


def test_taken_port_is_one_line(capsys):
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(PortError, match=f"port {port} is taken"):
            check_ports(port, 1)
        code = main(["train", "tiny-llama", "--steps", "1", "--metrics-port", str(port), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "taken" in err[0]
    with pytest.raises(PortError, match="past 65535"):
        check_ports(65535, 2)


def test_a_port_the_previous_run_left_in_time_wait_is_free():
    """The exporter's server binds with SO_REUSEADDR (http.server), so a port whose last connection
    is in TIME_WAIT (a run that was just scraped and stopped) is free to it, and to the check; a
    port someone listens on is still taken. (Before, a resumed run on the same --metrics-port was
    refused as "taken".)"""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = srv.accept()
    conn.close()  # the server side closes first: its end of the connection waits in TIME_WAIT
    client.close()
    srv.close()
    check_ports(port, 1)


def test_bad_alert_threshold_is_one_line(capsys):
    code = main(["train", "tiny-llama", "--steps", "1", "--alert-threshold", "nope=3", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "unknown" in err[0]


def test_counters_survive_a_bad_file(tmp_path):
    p = counters_path(tmp_path / "m.jsonl", 1)
    assert p == tmp_path / "m.jsonl.counters" / "rank-1.json" and counters_path(None, 0) is None
    c = Counters(steps=4, tokens=40, saves=1)
    c.save(p)
    assert Counters.load(p) == c
    p.write_text("{not json")
    assert Counters.load(p) == Counters()
    p.write_text(json.dumps({"format": "other", "steps": 9}))
    assert Counters.load(p) == Counters()


def _train(*args):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    p = subprocess.run([sys.executable, "-m", "dayzero", "train", "tiny-llama", "--layers", "2", "--hidden", "64",
                        "--vocab", "512", "--seq", "32", "--gbs", "4", "--quiet", "--compute-dtype", "fp32", *args],
                       capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-4000:]
    return p


@pytest.mark.slow
def test_counters_continue_across_a_resume(tmp_path):
    m, ck = tmp_path / "metrics.jsonl", tmp_path / "ck"
    port = free_port_range(2)
    common = ["--nproc", "2", "--metrics", str(m), "--ckpt-dir", str(ck), "--ckpt-every", "3", "--metrics-port",
              str(port)]
    _train("--steps", "3", *common)
    first = [Counters.load(counters_path(m, r)) for r in (0, 1)]
    assert [c.steps for c in first] == [3, 3] and first[0].saves == 1 and first[0].restarts == 0
    _train("--steps", "6", *common)  # resumes at step 3
    second = [Counters.load(counters_path(m, r)) for r in (0, 1)]
    assert [c.steps for c in second] == [6, 6] and second[0].tokens == 6 * 4 * 32
    assert second[0].saves == 2 and second[0].restarts == 1 and second[0].cpu_s > first[0].cpu_s > 0


@pytest.mark.slow
def test_aggregate_rank0_serves_every_rank(tmp_path):
    """--metrics-aggregate: one port, both ranks' series (read while the exporter lingers)."""
    import time

    port = free_port_range(2)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.Popen([sys.executable, "-m", "dayzero", "train", "tiny-llama", "--layers", "2", "--hidden", "64",
                             "--vocab", "512", "--seq", "32", "--gbs", "4", "--quiet", "--compute-dtype", "fp32",
                             "--nproc", "2", "--steps", "4", "--metrics", str(tmp_path / "m.jsonl"),
                             "--metrics-port", str(port), "--metrics-aggregate", "--metrics-linger", "20"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    got = {}
    try:
        t0 = time.time()
        while time.time() - t0 < 400 and proc.poll() is None:
            try:
                got = {(s.name, s.labels["rank"]): s.value
                       for f in text_string_to_metric_families(scrape(port)) for s in f.samples}
            except OSError:
                got = {}
            if got.get(("dayzero_step", "0")) == 4:
                break
            time.sleep(0.5)
        assert got.get(("dayzero_step", "0")) == 4, proc.stderr.read() if proc.poll() is not None else got
        assert got[("dayzero_step", "1")] == 4 and got[("dayzero_steps_total", "1")] == 4
        assert got[("dayzero_step_seconds", "1")] > 0
        with pytest.raises(OSError):  # rank 1 serves nothing of its own
            scrape(port + 1)
    finally:
        proc.wait(timeout=120)
    assert proc.returncode == 0
