"""End to end: the real Prometheus server (Debian's binary) scrapes a 2-rank ``dayzero train
--metrics-port`` run on 127.0.0.1, and the loss series read back through its HTTP query API is
the loss the run wrote to its metrics stream. Skips, saying why, without the binary."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from dayzero.monitor.ports import free_port_range
from dayzero.monitor.prometheus_rules import shipped_rules_path
from dayzero.runtime.metrics import read_metrics

PROMETHEUS = shutil.which("prometheus")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (apt-get install prometheus)")]


def query(base: str, q: str) -> list:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': q})}"
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def wait_ready(base: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        try:
            with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError("prometheus did not become ready")


def test_prometheus_scrapes_the_loss_of_a_two_rank_run(tmp_path):
    exporter, web = free_port_range(2), None
    web = free_port_range(1, start=exporter + 2)
    cfg = tmp_path / "prometheus.yml"
    # honor_labels: the exporter's own job/rank/node labels are kept as they are
    cfg.write_text(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [{shipped_rules_path()}]
scrape_configs:
  - job_name: dayzero
    honor_labels: true
    static_configs:
      - targets: ['127.0.0.1:{exporter}', '127.0.0.1:{exporter + 1}']
""")
    base = f"http://127.0.0.1:{web}"
    prom = subprocess.Popen([PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{web}"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        wait_ready(base, prom)
        m = tmp_path / "metrics.jsonl"
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        p = subprocess.run([sys.executable, "-m", "dayzero", "train", "tiny-llama", "--layers", "2", "--hidden", "64",
                            "--vocab", "512", "--seq", "32", "--gbs", "4", "--nproc", "2", "--steps", "30",
                            "--compute-dtype", "fp32", "--quiet", "--metrics", str(m), "--metrics-port", str(exporter),
                            "--metrics-job", "e2e", "--metrics-linger", "4", "--alerts"],
                           capture_output=True, text=True, timeout=600, env=env)
        assert p.returncode == 0, p.stderr[-4000:]
        steps, _ = read_metrics(m)
        written = {r["step"]: r["loss"] for r in steps}
        # every sample Prometheus stored over the run, for rank 0's loss and step
        loss = query(base, 'dayzero_loss{job="e2e",rank="0"}[10m]')
        step = query(base, 'dayzero_step{job="e2e",rank="0"}[10m]')
        assert len(loss) == 1 and loss[0]["metric"]["node"], loss
        stored = [(float(v), float(s)) for (_, v), (_, s) in zip(loss[0]["values"], step[0]["values"])]
        assert len(stored) >= 3, stored  # at least a few scrapes happened during the run
        for value, at in stored:  # each scraped loss is the one the stream has for that step
            assert value == pytest.approx(written[int(at)], rel=1e-6), (at, value)
        assert max(at for _, at in stored) == 30  # the lingering exporter served the last step
        # the run is over: its series are stale now, so read their last values
        ranks = {r["metric"]["rank"] for r in query(base, 'last_over_time(dayzero_step_seconds{job="e2e"}[10m])')}
        assert ranks == {"0", "1"}
        total = query(base, 'last_over_time(dayzero_tokens_total{job="e2e",rank="1"}[10m])')
        assert float(total[0]["value"][1]) == 30 * 4 * 32
        rules = json.loads(urllib.request.urlopen(f"{base}/api/v1/rules", timeout=10).read())
        assert len(rules["data"]["groups"][0]["rules"]) == 10  # the shipped rules loaded and evaluated
    finally:
        prom.terminate()
        try:
            prom.wait(timeout=20)
        except subprocess.TimeoutExpired:
            prom.kill()
