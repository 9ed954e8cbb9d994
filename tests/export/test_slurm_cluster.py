"""The exported sbatch script on a real one-node Slurm cluster (slurmctld + slurmd + munged on
127.0.0.1, :mod:`helpers.slurm_cluster`): it trains a tiny plan on 2 CPU ranks, and after its step
is killed, or its batch shell gets the time-limit warning, the job requeues itself and resumes from
the checkpoint."""

import json
import os
import re
import time
from pathlib import Path

import pytest

from dayzero.export import slurm
from dayzero.export.job import JobOptions
from dayzero.specs.parallel import ParallelConfig as P
from dayzero.specs.registry import load_model
from helpers.slurm_cluster import SlurmCluster, missing_binaries

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(missing_binaries()), reason=f"Slurm/munge not installed (missing "
                                 f"{', '.join(missing_binaries())}; apt-get install slurm-wlm munge)"),
              pytest.mark.skipif(os.geteuid() != 0, reason="slurmd launches jobs only as root (CI runs as root)")]
PLAN = P(dp=2, gbs=4, seq=64)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        yield c.start()
    finally:
        c.stop()


def _submit(cluster: SlurmCluster, run: Path, steps: int, ckpt_every: int) -> str:
    job = JobOptions(name="dz-test", devices_per_node=2, device="cpu", run_dir=str(run), steps=steps,
                     ckpt_every=ckpt_every, max_requeues=2)
    run.mkdir(parents=True)
    slurm.export(load_model("tiny-llama"), PLAN, job=job).write(run)
    return cluster.run("sbatch", "--parsable", f"--chdir={run}", str(run / slurm.SCRIPT_FILE)).strip().split(";")[0]


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _complete_steps(ckpt: Path) -> list[int]:
    from dayzero.runtime.checkpoint.versions import scan

    return sorted(v.step for v in scan(ckpt) if v.state == "complete")


def test_the_exported_script_trains_the_plan(cluster, tmp_path):
    run = tmp_path / "run"
    job = _submit(cluster, run, steps=4, ckpt_every=2)
    state = cluster.wait_job(job, timeout=150)
    log = (run / f"slurm-{job}.out").read_text() if (run / f"slurm-{job}.out").exists() else ""
    assert state == "COMPLETED", f"job {job}: {state}\n{log}\n{cluster.logs()}"
    recs = _records(run / "metrics.jsonl")
    assert [r["step"] for r in recs if "loss" in r] == [1, 2, 3, 4]
    end = next(r for r in recs if r.get("event") == "end")
    assert end["world"] == 2 and end["steps"] == 4
    assert _complete_steps(run / "ckpt") == [2, 4]


@pytest.mark.parametrize("stop, says", [
    (["--signal=KILL", "{job}.0"], "step exited"),  # a killed step: torchrun and both ranks die
    (["--batch", "--signal=USR1", "{job}"], "time limit near"),  # what --signal sends the batch shell before the limit
], ids=["killed-step", "time-limit-warning"])
def test_a_stopped_job_requeues_and_resumes_from_the_checkpoint(cluster, tmp_path, stop, says):
    run = tmp_path / "run"
    job = _submit(cluster, run, steps=24, ckpt_every=4)
    deadline = time.monotonic() + 120
    while not _complete_steps(run / "ckpt") and time.monotonic() < deadline:
        assert cluster.job_state(job) in ("PENDING", "RUNNING", "CONFIGURING"), cluster.logs()
        time.sleep(0.5)
    saved = _complete_steps(run / "ckpt")
    assert saved, f"no checkpoint within 120 s\n{cluster.logs()}"
    cluster.run("scancel", *[w.format(job=job) for w in stop])
    state = cluster.wait_job(job, timeout=240)
    log = (run / f"slurm-{job}.out").read_text()
    assert state == "COMPLETED", f"job {job}: {state}\n{log}\n{cluster.logs()}"
    assert re.search(rf"dayzero-slurm: {says}[^:\n]*: requeue \(restart 0 of 2\)", log), log
    assert cluster.job_field(job, "Restarts") == "1"
    recs = _records(run / "metrics.jsonl")
    first = [r["step"] for r in recs if "loss" in r and r["attempt"] == 1]
    loaded = [r for r in recs if r.get("event") == "checkpoint_loaded"]
    second = [r["step"] for r in recs if "loss" in r and r["attempt"] == 2]
    assert len(loaded) == 1 and loaded[0]["attempt"] == 2  # the requeued run resumed, appending as attempt 2
    resumed = loaded[0]["step"]
    assert saved[0] <= resumed <= first[-1] and resumed % 4 == 0  # a checkpoint the killed run had committed
    assert second == list(range(resumed + 1, 25))  # and it trained on from there to the end
    assert next(r for r in recs if r.get("event") == "end")["steps"] == 24
