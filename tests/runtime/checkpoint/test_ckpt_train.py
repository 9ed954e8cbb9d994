"""``dayzero train`` with checkpoints: fault recovery, corrupt checkpoints, reshard, loss guards.

The "Done means" checks of the checkpoint issue, end to end on gloo with a tiny Llama proxy.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers.train_cli import run_train

pytestmark = pytest.mark.slow
MODEL = ["tiny-llama", "--layers", "4", "--hidden", "128", "--seq", "32", "--gbs", "8", "--quiet"]


def train(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return run_train(MODEL, *args, timeout=timeout)


def stream(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def steps(recs: list[dict]) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in recs if "event" not in r]


def events(recs: list[dict], name: str) -> list[dict]:
    return [r for r in recs if r.get("event") == name]


def test_kill_rank1_at_step5_finishes_with_bitwise_losses(tmp_path):
    common = ["--nproc", "4", "--tp", "2", "--steps", "6", "--ckpt-every", "3"]
    train(*common, "--ckpt-dir", str(tmp_path / "ref"), "--metrics", str(tmp_path / "ref.jsonl"))
    train(*common, "--ckpt-dir", str(tmp_path / "run"), "--metrics", str(tmp_path / "run.jsonl"),
          "--max-restarts", "1", "--inject-fault", "step=5,rank=1,kind=kill")
    ref, run = dict(steps(stream(tmp_path / "ref.jsonl"))), stream(tmp_path / "run.jsonl")
    loaded = events(run, "checkpoint_loaded")
    assert len(loaded) == 1 and loaded[0]["step"] == 3
    at = run.index(loaded[0])
    assert [s for s, _ in steps(run[:at])] == [1, 2, 3, 4]  # rank 1 died at the start of step 5
    after = steps(run[at:])
    assert [s for s, _ in after] == [4, 5, 6]
    assert all(loss == ref[s] for s, loss in after)  # bitwise: exact float equality
    assert events(run, "end")[0]["steps"] == 6


def test_crash_between_shard_writes_then_bit_flip(tmp_path):
    ck, m = tmp_path / "ck", tmp_path / "m.jsonl"
    common = ["--nproc", "2", "--steps", "6", "--ckpt-every", "3", "--ckpt-dir", str(ck)]
    train(*common, "--metrics", str(m), "--max-restarts", "1", "--inject-fault", "step=6,rank=1,kind=kill,at=save")
    recs = stream(m)
    # the restart holds the directory's lock before its first save: it removes the abandoned .partial
    removed = events(recs, "checkpoint_abandoned_removed")
    assert removed and removed[0]["path"].endswith("step-00000006.partial")
    assert events(recs, "checkpoint_loaded")[0]["step"] == 3
    first = dict(steps(recs[:recs.index(removed[0])]))
    redone = dict(steps(recs[recs.index(removed[0]):]))
    assert sorted(redone) == [4, 5, 6] and all(redone[s] == first[s] for s in redone)

    shard = ck / "step-00000006" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    m2 = tmp_path / "m2.jsonl"
    train(*common, "--metrics", str(m2))
    recs2 = stream(m2)
    bad = events(recs2, "checkpoint_skipped")
    assert bad[0]["path"].endswith("step-00000006")
    assert "__1_0.distcp: xxh3-128 checksum mismatch" in bad[0]["problems"][0]
    assert events(recs2, "checkpoint_loaded")[0]["step"] == 3
    assert dict(steps(recs2)) == redone


def test_reshard_tp2_pp2_dp2_to_one_process(tmp_path):
    ck = tmp_path / "ck"
    train("--nproc", "8", "--tp", "2", "--pp", "2", "--steps", "6", "--ckpt-every", "3", "--async-save",
          "--ckpt-dir", str(ck), "--metrics", str(tmp_path / "m8.jsonl"))
    ref = dict(steps(stream(tmp_path / "m8.jsonl")))
    man = json.loads((ck / "step-00000003" / "manifest.json").read_text())
    assert man["world"] == 8 and (man["layout"]["tp"], man["layout"]["pp"], man["layout"]["dp"]) == (2, 2, 2)
    train("--steps", "6", "--ckpt-dir", str(ck), "--resume", "3", "--metrics", str(tmp_path / "m1.jsonl"))
    one = stream(tmp_path / "m1.jsonl")
    assert events(one, "checkpoint_loaded")[0]["saved_world"] == 8
    cont = dict(steps(one))
    assert sorted(cont) == [4, 5, 6]
    for s, loss in cont.items():
        assert abs(loss - ref[s]) <= 1e-5, (s, loss, ref[s])


GUARD_SCRIPT = textwrap.dedent("""
    import math, sys
    import dayzero.runtime.train as T
    from dayzero.runtime.config import CheckpointSection, FaultSection, ModelSection, TrainConfig
    from dayzero.runtime.train_entry import run_configs
    from dayzero.specs.parallel import ParallelConfig

    real = T.compute_step
    poisoned = {"left": 1}

    def compute_step(state, timer):
        g = real(state, timer)
        if state.step + 1 == 4 and poisoned["left"]:  # the loss of step 4 is NaN, once
            poisoned["left"] -= 1
            g.loss = math.nan
        return g

    T.compute_step = compute_step
    cfg = TrainConfig(model=ModelSection("tiny-llama", layers=2, hidden=64), parallel=ParallelConfig(seq=32, gbs=4),
                      steps=6, compute_dtype="fp32", quiet=True, metrics=sys.argv[1],
                      checkpoint=CheckpointSection(dir=sys.argv[2], every=2),
                      faults=FaultSection(on_bad_loss=None if sys.argv[3] == "none" else sys.argv[3]))
    sys.exit(run_configs([cfg]))
""")


def test_nan_loss_without_a_guard_stops_training_with_one_clear_line(tmp_path):
    m = tmp_path / "m.jsonl"
    p = subprocess.run([sys.executable, "-c", GUARD_SCRIPT, str(m), str(tmp_path / "ck"), "none"], timeout=600,
                       capture_output=True, text=True)
    assert p.returncode == 2, p.stderr
    assert "step 4: the loss is nan; training stopped" in p.stderr and "--on-bad-loss" in p.stderr
    assert "Traceback" not in p.stderr
    assert [s for s, _ in steps(stream(m))] == [1, 2, 3]  # step 4 was never applied


@pytest.mark.parametrize("action", ["skip", "rollback"])
def test_nan_loss_is_skipped_or_rolled_back(tmp_path, action):
    m = tmp_path / "m.jsonl"
    subprocess.run([sys.executable, "-c", GUARD_SCRIPT, str(m), str(tmp_path / "ck"), action], check=True,
                   timeout=600, capture_output=True)
    recs = stream(m)
    guard = events(recs, "loss_guard")
    assert len(guard) == 1 and guard[0]["reason"] == "nan" and guard[0]["action"] == action
    assert guard[0]["batches"] == [3]
    if action == "skip":
        assert [s for s, _ in steps(recs)] == [1, 2, 3, 4, 5, 6]  # step 4 counted, its update dropped
    else:
        rb = events(recs, "rollback")[0]
        assert (rb["from_step"], rb["to_step"], rb["skip_batches"]) == (4, 2, [3])
        at = recs.index(rb)
        assert [s for s, _ in steps(recs[at:])] == [3, 4, 5, 6]
        replay = dict(steps(recs[at:]))
        assert replay[3] == dict(steps(recs[:at]))[3]  # the replayed step 3 is exact


def test_export_to_transformers_and_import_back(tmp_path):
    """A tiny-llama checkpoint exports under Hugging Face names with its config.json; transformers
    loads it with no missing or unexpected tensor, and importing it back gives the same tensors."""
    from safetensors.torch import load_file

    ck = tmp_path / "ck"
    train_args = ["tiny-llama", "--seq", "32", "--gbs", "2", "--steps", "2", "--quiet", "--ckpt-dir", str(ck)]
    subprocess.run([sys.executable, "-m", "dayzero", "train", *train_args], check=True, timeout=600,
                   capture_output=True)
    out = tmp_path / "hf"
    p = subprocess.run([sys.executable, "-m", "dayzero", "ckpt", "export", str(ck / "step-00000002"), str(out),
                        "--json"],
                       check=True, timeout=600, capture_output=True, text=True)
    assert json.loads(p.stdout)["names"] == "hf"
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"

    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    exported = load_file(str(out / "model.safetensors"))
    assert torch_equal(model.state_dict()["model.layers.1.self_attn.q_proj.weight"],
                       exported["model.layers.1.self_attn.q_proj.weight"])

    back = tmp_path / "back"
    subprocess.run([sys.executable, "-m", "dayzero", "ckpt", "import", str(out), str(back), "--model", "tiny-llama",
                    "--step", "2"], check=True, timeout=600, capture_output=True)
    subprocess.run([sys.executable, "-m", "dayzero", "ckpt", "export", str(back / "step-00000002"),
                    str(tmp_path / "hf2")],
                   check=True, timeout=600, capture_output=True)
    again = load_file(str(tmp_path / "hf2" / "model.safetensors"))
    assert set(again) == set(exported) and all(torch_equal(again[k], exported[k]) for k in exported)
    # dayzero train resumes from the imported (model-only) version
    m = tmp_path / "m.jsonl"
    subprocess.run([sys.executable, "-m", "dayzero", "train", "tiny-llama", "--seq", "32", "--gbs", "2", "--steps", "3",
                    "--quiet", "--ckpt-dir", str(back), "--metrics", str(m)], check=True, timeout=600,
                   capture_output=True)
    recs = stream(m)
    assert events(recs, "checkpoint_loaded")[0]["step"] == 2 and [s for s, _ in steps(recs)] == [3]
    # ... and --hf-weights reads the export: same weights, same first batch, same loss
    m2 = tmp_path / "m2.jsonl"
    subprocess.run([sys.executable, "-m", "dayzero", "train", "tiny-llama", "--seq", "32", "--gbs", "2", "--steps", "1",
                    "--quiet", "--hf-weights", str(out), "--metrics", str(m2)], check=True, timeout=600,
                   capture_output=True)
    assert steps(stream(m2))[0][1] == steps(recs)[0][1]


def torch_equal(a, b) -> bool:
    import torch

    return a.shape == b.shape and bool(torch.equal(a.float(), b.float()))


def test_resume_of_an_older_step_keeps_the_other_run_and_auto_follows_the_branch(tmp_path):
    """Lineage-aware resume, end to end: a 2-rank job (its launcher holds the directory's lock and
    lends it to the ranks) resumes step 2 of a directory holding steps 2-8 of run A."""
    ck = tmp_path / "ck"
    train("--steps", "8", "--ckpt-every", "2", "--keep", "4", "--ckpt-dir", str(ck))
    run_a = {p.name: (p / "manifest.json").read_text() for p in sorted(ck.glob("step-*"))}
    assert sorted(run_a) == [f"step-{s:08d}" for s in (2, 4, 6, 8)]
    p = train("--nproc", "2", "--steps", "4", "--ckpt-every", "1", "--resume", "2", "--ckpt-dir", str(ck),
              "--metrics", str(tmp_path / "b.jsonl"))
    recs = stream(tmp_path / "b.jsonl")
    assert events(recs, "checkpoint_loaded")[0]["step"] == 2 and len(events(recs, "checkpoint_branch")) == 1
    assert not events(recs, "checkpoint_deleted") and "new lineage" in p.stderr
    assert {name: (ck / name / "manifest.json").read_text() for name in run_a} == run_a  # run A untouched
    assert {q.name for q in ck.glob("step-*")} == set(run_a) | {"step-00000003", "step-00000004-v2"}
    train("--steps", "5", "--ckpt-dir", str(ck), "--metrics", str(tmp_path / "c.jsonl"))
    loaded = events(stream(tmp_path / "c.jsonl"), "checkpoint_loaded")[0]
    assert loaded["step"] == 4 and loaded["path"].endswith("step-00000004-v2")

