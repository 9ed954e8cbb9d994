"""Checkpoints and fault recovery on gloo under torchrun, with the small harness in ckpt_toy.py.

Each test launches real ranks (2 to 8 processes of a tiny model) and restarts them with
torchrun's ``--max-restarts``; the whole file takes a few minutes on two cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
TOY = str(Path(__file__).with_name("ckpt_toy.py"))


def torchrun(nproc: int, args: list[str], restarts: int = 0, timeout: int = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           f"--max-restarts={restarts}", "--monitor-interval=0.2", TOY, *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if p.returncode != 0:
        raise AssertionError(f"torchrun exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}")
    return p


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def losses(recs: list[dict], attempt: int | None = None) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in recs if "event" not in r and (attempt is None or r["attempt"] == attempt)}


def events(recs: list[dict], name: str) -> list[dict]:
    return [r for r in recs if r.get("event") == name]


def test_kill_rank1_at_step7_resumes_bitwise(tmp_path):
    common = ["--tp", "2", "--steps", "10", "--ckpt-every", "5"]
    torchrun(4, [*common, "--metrics", str(tmp_path / "ref.jsonl"), "--ckpt-dir", str(tmp_path / "ref")])
    torchrun(4, [*common, "--metrics", str(tmp_path / "run.jsonl"), "--ckpt-dir", str(tmp_path / "run"),
                 "--inject-fault", "step=7,rank=1,kind=kill"], restarts=1)
    ref, run = records(tmp_path / "ref.jsonl"), records(tmp_path / "run.jsonl")
    assert events(run, "checkpoint_loaded")[0]["step"] == 5 and events(run, "checkpoint_loaded")[0]["attempt"] == 1
    assert sorted(losses(run, 0)) == [1, 2, 3, 4, 5, 6]  # killed at the start of step 7
    resumed = losses(run, 1)
    assert sorted(resumed) == [6, 7, 8, 9, 10]
    assert resumed == {s: v for s, v in losses(ref).items() if s > 5}  # bitwise: floats compared with ==


def test_crash_between_shard_writes_then_corrupt_shard(tmp_path):
    ck, m = tmp_path / "ck", tmp_path / "m.jsonl"
    args = ["--steps", "10", "--ckpt-every", "5", "--ckpt-dir", str(ck), "--metrics", str(m)]
    # rank 1 dies just before writing its shards of step 10: rank 0's shards exist, no commit
    p = torchrun(2, [*args, "--inject-fault", "step=10,rank=1,kind=kill,at=save"], restarts=1)
    recs = records(m)
    skipped = events(recs, "checkpoint_skipped")
    assert skipped and skipped[0]["path"].endswith("step-00000010.partial") and skipped[0]["attempt"] == 1
    assert "skipping checkpoint step-00000010.partial" in p.stderr
    assert events(recs, "checkpoint_loaded")[0]["step"] == 5
    assert losses(recs, 1) == {s: v for s, v in losses(recs, 0).items() if s > 5}
    assert sorted(d.name for d in ck.iterdir()) == ["step-00000005", "step-00000010"]

    # a bit flip in rank 1's shard of step 10 is found by the checksum and step 5 is used
    shard = ck / "step-00000010" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 3] ^= 0x04
    shard.write_bytes(bytes(data))
    m2 = tmp_path / "m2.jsonl"
    torchrun(2, ["--steps", "10", "--ckpt-every", "5", "--ckpt-dir", str(ck), "--metrics", str(m2)])
    recs2 = records(m2)
    bad = events(recs2, "checkpoint_skipped")
    assert bad[0]["path"].endswith("step-00000010") and "__1_0.distcp: sha256 mismatch" in bad[0]["problems"][0]
    assert events(recs2, "checkpoint_loaded")[0]["step"] == 5
    assert losses(recs2) == losses(recs, 1)


def test_hang_is_aborted_by_the_watchdog_and_restarted(tmp_path):
    m = tmp_path / "m.jsonl"
    torchrun(2, ["--steps", "6", "--ckpt-every", "2", "--ckpt-dir", str(tmp_path / "ck"), "--metrics", str(m),
                 "--watchdog", "8", "--inject-fault", "step=4,rank=1,kind=hang"], restarts=1)
    recs = records(m)
    abort = events(recs, "watchdog_abort")
    assert abort and abort[0]["attempt"] == 0 and abort[0]["step"] == 3
    assert events(recs, "checkpoint_loaded")[0]["step"] == 2
    assert max(losses(recs, 1)) == 6 and losses(recs, 1)[3] == losses(recs, 0)[3]


def test_reshard_tp2_pp2_dp2_to_single_process(tmp_path):
    ck, m8 = tmp_path / "ck", tmp_path / "m8.jsonl"
    torchrun(8, ["--tp", "2", "--pp", "2", "--steps", "10", "--ckpt-every", "5", "--async-save",
                 "--ckpt-dir", str(ck), "--metrics", str(m8)])
    ref = losses(records(m8))
    man = json.loads((ck / "step-00000005" / "manifest.json").read_text())
    assert man["world"] == 8 and man["layout"] == {"tp": 2, "pp": 2, "dp": 2}
    m1 = tmp_path / "m1.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    subprocess.run([sys.executable, TOY, "--steps", "10", "--ckpt-dir", str(ck), "--resume", "5",
                    "--metrics", str(m1)], check=True, env=env, timeout=300, capture_output=True)
    single = losses(records(m1))
    assert sorted(single) == [6, 7, 8, 9, 10]
    for s in single:
        assert abs(single[s] - ref[s]) <= 1e-5, (s, single[s], ref[s])
    # the 8-way sharded checkpoint exports to the same consolidated weights as a 1-process run's
    from safetensors.torch import load_file

    from dayzero.runtime.interchange import export_hf

    one = tmp_path / "one"
    subprocess.run([sys.executable, TOY, "--steps", "5", "--ckpt-dir", str(one), "--ckpt-every", "5",
                    "--metrics", str(tmp_path / "m0.jsonl")], check=True, env=env, timeout=300, capture_output=True)
    export_hf(ck / "step-00000005", tmp_path / "hf8")
    export_hf(one / "step-00000005", tmp_path / "hf1")
    w8, w1 = load_file(str(tmp_path / "hf8" / "model.safetensors")), load_file(str(tmp_path / "hf1" / "model.safetensors"))
    assert set(w8) == set(w1) and "blocks.3.w2.weight" in w8
    for k in w1:
        assert (w8[k] - w1[k]).abs().max().item() <= 1e-5, k
