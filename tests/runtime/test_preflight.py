"""``dayzero train --dry-run`` and ``dayzero validate --dry-run``: the real run's own pre-flight
(:mod:`dayzero.runtime.preflight`, :mod:`dayzero.validate.preflight`), stopped before any rank
starts. What the check refuses the run refuses with the same line; what it accepts starts; it
writes nothing and takes no lock."""

from __future__ import annotations

import json
import os
import re

import pytest

pytest.importorskip("torch")

from dayzero.cli.app import main  # noqa: E402
from dayzero.runtime import memory_check as mc  # noqa: E402

GiB = 2**30
CLUSTER = "dgx-h100-1024"  # a profile that needs no measurement of this host


@pytest.fixture(autouse=True)
def host_24gib(monkeypatch):
    """Free memory fixed, so that a refusal's numbers are the same in the check and the run."""
    monkeypatch.setattr(mc, "host_available_bytes", lambda: 24 * GiB)
    monkeypatch.setattr(mc, "device_available_bytes", lambda: None)


def _run(argv, capsys):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def _files(root):
    """Every path under ``root`` with its size and modification time."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            st = os.stat(p)
            out[p] = (st.st_size, st.st_mtime_ns)
    return out


def _bad_train_flags(tmp):
    placement = tmp / "placement.json"
    placement.write_text("{}")
    a_file = tmp / "a_file"
    a_file.write_text("x")
    corrupt = tmp / "corrupt"
    (corrupt / "step-00000002").mkdir(parents=True)
    (corrupt / "step-00000002" / "COMPLETE").write_text("")
    (corrupt / "step-00000002" / "manifest.json").write_text("{not json")
    return [
        (["tiny-llama", "--tp", "3", "--nproc", "3"], "divisible by tp"),
        (["tiny-llama", "--tp", "2", "--pp", "2", "--nproc", "2"], "not divisible"),
        (["tiny-llama", "--pp", "2", "--nproc", "2", "--gbs", "1"], "micro-batches"),
        (["tiny-llama", "--compute-dtype", "fp16"], "fp16"),
        (["tiny-llama", "--placement", placement], "no MoE layers"),
        (["tiny-moe", "--moe-aux-loss", "bogus"], "--moe-aux-loss"),
        (["tiny-moe", "--moe-capacity-factor", "0"], "--moe-capacity-factor"),
        (["tiny-llama", "--ckpt-every", "5"], "applies only with --ckpt-dir"),
        (["tiny-llama", "--async-save"], "applies only with --ckpt-dir"),
        (["tiny-llama", "--resume", "3"], "needs --ckpt-dir"),
        (["tiny-llama", "--ckpt-dir", tmp / "empty", "--resume", "7"], "failed verification"),
        (["tiny-llama", "--ckpt-dir", corrupt], "passes verification"),
        (["tiny-llama", "--ckpt-dir", corrupt, "--resume", "2"], "failed verification"),
        (["tiny-llama", "--ckpt-dir", a_file], "is a file"),
        (["tiny-llama", "--ckpt-dir", a_file / "sub"], "--ckpt-dir"),
        (["tiny-llama", "--metrics", tmp], "is a directory"),
        (["tiny-llama", "--steps", "4", "--inject-fault", "step=9,rank=0,kind=kill"], "past the last step"),
        (["tiny-llama", "--inject-fault", "step=1,rank=3,kind=kill"], "does not exist"),
        (["tiny-llama", "--inject-fault", "step=1,rank=0,kind=melt"], "--inject-fault"),
        (["tiny-llama", "--on-bad-loss", "rollback"], "needs --ckpt-dir"),
        (["tiny-llama", "--spike-factor", "2"], "applies only with"),
        (["tiny-llama", "--save-timeout", "0"], "--save-timeout"),
        (["tiny-llama", "--on-alert", "bogus=log"], "bogus"),
        (["tiny-llama", "--data", tmp / "nothing" / "*.txt"], "--data"),
        (["tiny-llama", "--hf-weights", tmp / "no-weights"], "--hf-weights"),
        (["tiny-llama", "--layers", "64", "--hidden", "8192"], "needs about"),
        (["tiny-llama", "--lr", "nan"], "not a finite number"),
        (["tiny-llama", "--grad-clip", "-1"], "negative"),
    ]


def _same(a: str, b: str) -> bool:
    """One refusal, whatever the paths of temporary files and probes."""
    norm = re.compile(r"\.dayzero-write-test-\S+|[\d.,]+")
    return norm.sub("N", a) == norm.sub("N", b)


def test_every_refusal_of_the_run_is_made_by_the_check(tmp_path, capsys):
    for argv, expect in _bad_train_flags(tmp_path):
        argv = ["train", *argv] + ([] if "--steps" in argv else ["--steps", "1"])  # should one pass: a short run
        code, _, run_err = _run(argv, capsys)
        assert code == 2 and expect in run_err and run_err.count("\n") == 1, (argv, run_err)
        code, out, err = _run([*argv, "--dry-run"], capsys)
        assert code == 2 and _same(err, run_err), (argv, err, run_err)


def test_validate_refusals_are_made_by_the_check(tmp_path, capsys):
    (tmp_path / "out_file").write_text("x")
    profile = tmp_path / "host.yaml"
    profile.write_text("accelerator: h100\n")
    for argv in (["tiny-llama", "--tp", "3", "--nproc", "3"], ["tiny-llama", "--pp", "2", "--nproc", "2", "--gbs", "1"],
                 ["tiny-llama", "--layers", "64", "--hidden", "8192"], ["tiny-llama", "--runs", profile],
                 ["deepseek-v3", "--dp", "0"], ["tiny-llama", "--gbs", "0"],  # found by the fuzz: ZeroDivisionError
                 ["tiny-llama", "--calibrate"], ["tiny-llama", "--calibrate", "--cluster", profile, "--fit-keys", "x"],
                 ["tiny-llama", "--calibrate", "--cluster", profile, "--runs", profile]):
        argv = ["validate", *argv] + ([] if "--cluster" in argv else ["--cluster", CLUSTER])
        code, _, run_err = _run(argv, capsys)
        assert code == 2 and run_err.count("\n") == 1, (argv, run_err)
        code, _, err = _run([*argv, "--dry-run"], capsys)
        assert code == 2 and _same(err, run_err), (argv, err, run_err)


def test_the_check_writes_nothing(tmp_path, capsys):
    root = tmp_path / "w"
    root.mkdir()
    code, out, err = _run(["train", "tiny-llama", "--dry-run", "--json", "--ckpt-dir", root / "ck", "--ckpt-every", "2",
                           "--metrics", root / "m" / "metrics.jsonl"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["ok"] and doc["checkpoint"]["exists"] is False and doc["checkpoint"]["resume"]["step"] is None
    assert doc["memory"]["need_bytes"] <= doc["memory"]["usable_bytes"] and doc["ranks"] == 1
    code, out, err = _run(["validate", "tiny-llama", "--cluster", CLUSTER, "--dry-run", "--out", root / "v"], capsys)
    assert code == 0 and "dry run passed" in out, err
    assert list(root.iterdir()) == []


def test_a_held_checkpoint_directory_is_refused_without_touching_the_lock(tmp_path, capsys):
    from dayzero.runtime.checkpoint.dirlock import DirLock

    ck = tmp_path / "ck"
    with DirLock(ck):
        before = (ck / ".lock").read_text()
        code, _, err = _run(["train", "tiny-llama", "--dry-run", "--ckpt-dir", ck], capsys)
        assert code == 2 and "in use by another job" in err and f"pid {os.getpid()}" in err, err
        assert (ck / ".lock").read_text() == before
    code, out, err = _run(["train", "tiny-llama", "--dry-run", "--ckpt-dir", ck], capsys)  # released: free again
    assert code == 0 and "dry run passed" in out, err


def test_validate_check_does_not_measure_the_host(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DAYZERO_CACHE_DIR", str(tmp_path / "cache"))
    code, out, err = _run(["validate", "tiny-llama", "--dry-run", "--json", "--nproc", "2", "--gbs", "2"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["profile"]["measured_first"] and doc["ranks"] == 2 and doc["memory"]["ranks_sharing"] == 2
    assert not (tmp_path / "cache").exists()


@pytest.mark.slow
def test_what_the_check_accepts_starts_and_resumes_as_planned(tmp_path, capsys):
    """One tiny run the check accepted, then the check on its checkpoint directory: it names the
    version the run resumes, changes nothing there, and refuses a step that is not there."""
    ck = tmp_path / "ck"
    argv = ["train", "tiny-llama", "--layers", "1", "--hidden", "64", "--seq", "32", "--steps", "2", "--ckpt-dir", ck,
            "--compute-dtype", "fp32", "--quiet"]
    code, out, err = _run([*argv, "--dry-run"], capsys)
    assert code == 0 and "dry run passed" in out, err
    code, out, err = _run(argv, capsys)
    assert code == 0, err
    before = _files(ck)
    code, out, err = _run([*argv, "--steps", "4", "--dry-run", "--json"], capsys)
    assert code == 0, err
    plan = json.loads(out)["checkpoint"]
    assert plan["exists"] and plan["complete_versions"] == 1
    assert plan["resume"]["step"] == 2 and plan["resume"]["path"].endswith("step-00000002")
    code, _, err = _run([*argv, "--resume", "9", "--dry-run"], capsys)
    assert code == 2 and "step-00000009" in err, err
    code, _, err = _run([*argv, "--layers", "2", "--dry-run"], capsys)  # another model: nothing fits
    assert code == 2 and "passes verification and fits this run" in err, err
    assert _files(ck) == before
    code, out, err = _run([*argv, "--steps", "4", "--json"], capsys)  # and the run resumes where the check said
    assert code == 0, err
    steps = [s["step"] for s in json.loads(out)["steps"]]
    assert steps == [3, 4], steps
