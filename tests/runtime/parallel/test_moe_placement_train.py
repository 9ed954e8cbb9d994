"""``dayzero train --placement``: a placement that replicates experts trains exactly like no
placement (fp32, gloo, ep 2 with 2 redundant slots per layer), a run re-placed at a checkpoint
continues the unplaced run, and the expert-load telemetry is in the metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
MODEL = ["tiny-moe", "--layers", "3", "--hidden", "64", "--seq", "32", "--gbs", "4", "--dp", "2", "--ep", "2",
         "--nproc", "2", "--compute-dtype", "fp32", "--quiet", "--skip-memory-check", "--moe-loads-every", "4"]
STEPS = 6
# layers 1 and 2 are the MoE layers of a 3-layer tiny-moe; 5 slots per rank, two experts twice each
PLACEMENT = {"format": "dayzero-expert-placement/1", "experts": 8, "ep": 2,
             "layers": {"1": [[0, 1, 2, 3, 6], [4, 5, 6, 7, 0]], "2": [[7, 1, 2, 3, 0], [4, 5, 6, 3, 0]]}}


def train(*args: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    p = subprocess.run([sys.executable, "-m", "dayzero", "train", *MODEL, *args], capture_output=True, text=True,
                       timeout=600, env=env)
    if p.returncode != 0:
        raise AssertionError(f"dayzero train exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}")


def records(path: Path) -> dict[int, dict]:
    out = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if "event" not in r:
            out[r["step"]] = r
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("placed")
    (d / "placement.json").write_text(json.dumps(PLACEMENT))
    train("--steps", str(STEPS), "--metrics", str(d / "ref.jsonl"), "--ckpt-dir", str(d / "ck_ref"),
          "--ckpt-every", "3")
    train("--steps", str(STEPS), "--metrics", str(d / "placed.jsonl"), "--placement", str(d / "placement.json"))
    # resume the unplaced run's step-3 checkpoint under the placement
    train("--steps", str(STEPS), "--metrics", str(d / "replaced.jsonl"), "--placement", str(d / "placement.json"),
          "--ckpt-dir", str(d / "ck_new"), "--resume", str(d / "ck_ref" / "step-00000003"))
    return {n: records(d / f"{n}.jsonl") for n in ("ref", "placed", "replaced")}


def test_replicated_placement_equals_no_placement_per_step(runs):
    ref, placed = runs["ref"], runs["placed"]
    assert sorted(placed) == list(range(1, STEPS + 1))
    for s in ref:
        assert abs(placed[s]["loss"] - ref[s]["loss"]) <= 1e-5 * abs(ref[s]["loss"]), s
        assert abs(placed[s]["grad_norm"] - ref[s]["grad_norm"]) <= 1e-5 * ref[s]["grad_norm"], s
        # the same tokens reach the same experts; only the ranks that run them differ
        assert placed[s]["moe"]["max_mean"] == ref[s]["moe"]["max_mean"]
    assert ref[STEPS]["loss"] < ref[1]["loss"]


def test_replaced_at_a_checkpoint_continues_the_unplaced_run(runs):
    ref, replaced = runs["ref"], runs["replaced"]
    assert sorted(replaced) == [4, 5, 6]
    for s in replaced:
        assert abs(replaced[s]["loss"] - ref[s]["loss"]) <= 1e-5 * abs(ref[s]["loss"]), s


def test_expert_load_telemetry_in_the_metrics(runs):
    ref = runs["ref"]
    for s, r in ref.items():
        moe = r["moe"]
        assert moe["layers"] == [1, 2]
        assert all(len(moe[k]) == 2 for k in ("max_mean", "cv", "dropped", "rank_max_mean"))
        assert moe["dropped"] == [0.0, 0.0] and all(v >= 1.0 for v in moe["max_mean"] + moe["rank_max_mean"])
        assert ("expert_loads" in r) == (s % 4 == 0 or s == STEPS)
        if "expert_loads" in r:
            loads = r["expert_loads"]
            # every token of the global batch (4 x 32) routes top-2 slots in each MoE layer
            assert len(loads) == 2 and all(len(row) == 8 and sum(row) == 4 * 32 * 2 for row in loads)
            assert all(isinstance(v, int) for row in loads for v in row)


SMALL = ["tiny-moe", "--layers", "2", "--hidden", "64", "--seq", "32", "--gbs", "4", "--compute-dtype", "fp32",
         "--quiet", "--skip-memory-check", "--steps", "3", "--moe-bias-rate", "0"]


def _run(tmp: Path, name: str, *args: str) -> dict[int, dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    m = tmp / f"{name}.jsonl"
    p = subprocess.run([sys.executable, "-m", "dayzero", "train", *SMALL, *args, "--metrics", str(m)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-4000:]
    return records(m)


@pytest.mark.parametrize("losses, layout", [
    (["--moe-aux-loss", "global", "--moe-aux-coef", "1.0", "--moe-z-loss", "0.5"], ["--dp", "2", "--ep", "2"]),
    (["--moe-aux-loss", "seq", "--moe-aux-coef", "1.0"], ["--tp", "2", "--sequence-parallel"]),
])
def test_router_losses_are_layout_independent(tmp_path, losses, layout):
    """The global-batch and sequence-wise balance losses and the z-loss train as in one process
    (the whole batch as one micro-batch) when dp/ep or tp/sp split the tokens. (Losses, not grad
    norms: the norm differs between these layouts by ~6e-4 relative even with no router loss.)"""
    ref = _run(tmp_path, "ref", "--mbs", "4", *losses)
    got = _run(tmp_path, "split", "--nproc", "2", "--mbs", "2" if "--dp" in layout else "4", *layout, *losses)
    plain = _run(tmp_path, "plain", "--mbs", "4", "--moe-aux-loss", "none")
    for s in ref:
        assert abs(got[s]["loss"] - ref[s]["loss"]) <= 1e-5 * ref[s]["loss"], s
    # loads are counted over the global batch: every dp/ep/tp rank and micro-batch (last step: full vector)
    assert sum(got[3]["expert_loads"][0]) == 4 * 32 * 2
    assert got[3]["expert_loads"] == ref[3]["expert_loads"]
    assert abs(plain[3]["loss"] - ref[3]["loss"]) > 1e-4 * ref[3]["loss"]  # the losses change the run
