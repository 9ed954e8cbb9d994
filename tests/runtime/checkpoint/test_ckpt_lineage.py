"""Checkpoint lineage, lineage-aware retention and resume, import that never overwrites, and the
directory lock, driven through the Checkpointer in one process."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn

from dayzero.cli.app import main
from dayzero.runtime.checkpoint.checkpointer import Checkpointer
from dayzero.runtime.checkpoint.dirlock import LOCK_FILE, CheckpointLocked, DirLock, read_holder
from dayzero.runtime.checkpoint.interchange import export_hf, import_hf
from dayzero.runtime.checkpoint.manifest import MANIFEST, CheckpointError, read_manifest, verify_version, write_marker
from dayzero.runtime.checkpoint.versions import SEQUENCE, commit, prepare_partial, scan, version_name

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def make(seed=0):
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    return m, opt


def train_step(m, opt):
    loss = (m(torch.randn(4, 8)) - 1).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def job(root, steps, *, every=1, resume="auto", keep=3, **kw):
    """One training job: resume (unless "never"), train to ``steps``, save every ``every`` steps.
    Returns (the Resumed or None, the events)."""
    events: list[dict] = []
    m, opt = make()
    ck = Checkpointer(root, keep=keep, on_event=events.append, **kw)
    try:
        r = ck.resume(m, opt, which=resume) if resume != "never" else None
        for s in range((r.step if r else 0) + 1, steps + 1):
            train_step(m, opt)
            if s % every == 0 or s == steps:
                ck.save(s, m, opt, data={"batch": s})
    finally:
        ck.close()
    return r, events


def complete(root) -> dict[str, tuple[int, str, int]]:
    """{directory: (step, lineage, seq)} of the complete versions under ``root``."""
    out = {}
    for v in scan(root):
        if v.state == "complete":
            m = read_manifest(v.path)
            out[v.name] = (m.step, m.lineage, m.seq)
    return out


def run_a(root, keep=4):
    """Run A: steps 2, 4, 6, 8 in one lineage (the newest ``keep`` of them kept)."""
    job(root, 8, every=2, keep=keep)
    versions = complete(root)
    assert [s for s, _, _ in versions.values()] == [2, 4, 6, 8][-keep:]
    return versions


# -- retention and resume by lineage --------------------------------------------------------------

@pytest.mark.parametrize("async_save", [False, True])
def test_resume_of_an_older_step_branches_and_retention_keeps_the_other_run(tmp_path, caplog, async_save):
    a = run_a(tmp_path)
    (lineage_a,) = {lin for _, lin, _ in a.values()}
    with caplog.at_level(logging.WARNING, logger="dayzero.checkpoint"):
        r, events = job(tmp_path, 3, resume="2", async_save=async_save)  # --resume 2, saves step 3
    assert r.step == 2
    branch = [e for e in events if e["event"] == "checkpoint_branch"]
    assert len(branch) == 1 and branch[0]["parent_lineage"] == lineage_a
    assert branch[0]["newer"] == [version_name(s) for s in (4, 6, 8)]
    assert any("new lineage" in rec.getMessage() and version_name(2) in rec.getMessage() for rec in caplog.records)
    assert not [e for e in events if e["event"] == "checkpoint_deleted"]
    after = complete(tmp_path)
    assert {k: v for k, v in after.items() if k in a} == a  # every version of run A survives ...
    assert all(verify_version(tmp_path / name).ok for name in a)
    b = after[version_name(3)]
    assert b[1] != lineage_a and b[2] > max(seq for _, _, seq in a.values())  # ... beside the branch's
    m3 = read_manifest(tmp_path / version_name(3))
    assert m3.parent.name == version_name(2) and m3.fork.name == version_name(2) and m3.fork.lineage == lineage_a

    # --resume auto follows the branch (written last), not run A's higher step 8
    r, events = job(tmp_path, 6, resume="auto", keep=3)  # saves 4, 5, 6: 4 and 6 are also run A's steps
    assert r.step == 3 and not [e for e in events if e["event"] == "checkpoint_branch"]
    after = complete(tmp_path)
    assert {k: v for k, v in after.items() if k in a} == a
    mine = {k: v for k, v in after.items() if v[1] == b[1]}
    assert set(mine) == {version_name(4, 2), version_name(5), version_name(6, 2)}  # keep 3 of the branch
    deleted = [e["path"] for e in events if e["event"] == "checkpoint_deleted"]
    assert [os.path.basename(p) for p in deleted] == [version_name(3)]
    assert job(tmp_path, 6, resume="auto")[0].path.name == version_name(6, 2)


def test_prune_other_lineages_is_explicit(tmp_path):
    a = run_a(tmp_path)
    _, events = job(tmp_path, 3, resume="2", prune_other_lineages=True)
    assert sorted(complete(tmp_path)) == [version_name(3)]
    gone = [e for e in events if e["event"] == "checkpoint_deleted"]
    assert sorted(os.path.basename(e["path"]) for e in gone) == sorted(a)
    assert all(e["reason"] == "--ckpt-prune-other-lineages" for e in gone)


def test_resume_auto_falls_back_along_the_branch_when_its_versions_are_corrupt(tmp_path):
    run_a(tmp_path)
    job(tmp_path, 4, resume="2")  # branch: steps 3 and 4 (step-00000004-v2)
    for name in (version_name(3), version_name(4, 2)):
        shard = next((tmp_path / name).glob("__0_*.distcp"))
        shard.write_bytes(shard.read_bytes()[:50])
    r, events = job(tmp_path, 2, resume="auto")  # loads, nothing more to train
    assert r.path.name == version_name(2)  # the branch's own history, not run A's step 8
    assert [os.path.basename(e["path"]) for e in events if e["event"] == "checkpoint_skipped"] == \
        [version_name(4, 2), version_name(3)]


def test_resume_of_the_newest_version_continues_its_lineage(tmp_path):
    a = run_a(tmp_path, keep=3)
    assert sorted(a) == [version_name(s) for s in (4, 6, 8)]
    r, events = job(tmp_path, 10, every=2, resume="8", keep=3)
    assert r.step == 8 and not [e for e in events if e["event"] == "checkpoint_branch"]
    after = complete(tmp_path)
    assert sorted(after) == [version_name(s) for s in (6, 8, 10)]  # one lineage: its oldest retires
    assert len({lin for _, lin, _ in after.values()}) == 1


def test_rollback_before_a_branch_saves_returns_to_its_fork(tmp_path):
    """A loss-guard rollback in a branch that has not saved yet reloads the version it branched
    from, not the other lineage's newest."""
    from helpers import ckpt_toy

    ck = str(tmp_path / "ck")
    ckpt_toy.main(["--metrics", str(tmp_path / "a.jsonl"), "--steps", "10", "--ckpt-dir", ck, "--ckpt-every", "2",
                   "--keep", "5"])
    m = tmp_path / "b.jsonl"
    ckpt_toy.main(["--metrics", str(m), "--steps", "10", "--ckpt-dir", ck, "--resume", "2", "--poison", "6",
                   "--spike-factor", "5", "--on-bad-loss", "rollback"])
    recs = [json.loads(line) for line in m.read_text().splitlines()]
    rb = [r for r in recs if r.get("event") == "rollback"]
    assert rb and rb[0]["to_step"] == 2 and os.path.basename(rb[0]["path"]) == version_name(2)
    assert [r for r in recs if r.get("event") == "checkpoint_branch"]


def test_sequence_numbers_only_grow(tmp_path):
    job(tmp_path, 3, keep=1)
    assert list(complete(tmp_path).values()) == [(3, read_manifest(tmp_path / version_name(3)).lineage, 3)]
    import shutil

    shutil.rmtree(tmp_path / version_name(3))  # the newest, deleted by hand
    job(tmp_path, 1, resume="never")
    assert complete(tmp_path)[version_name(1)][2] == 4 and (tmp_path / SEQUENCE).read_text().strip() == "4"


def test_commit_never_replaces_another_lineages_version(tmp_path):
    job(tmp_path, 2, every=2)
    m = read_manifest(tmp_path / version_name(2))
    partial = prepare_partial(tmp_path, 2)
    (partial / MANIFEST).write_text(m.model_copy(update={"lineage": "other"}).to_json())
    with pytest.raises(CheckpointError, match="belongs to lineage"):
        commit(partial, 2)
    assert verify_version(tmp_path / version_name(2)).ok


# -- legacy manifests ------------------------------------------------------------------------------

def make_legacy(root, steps):
    """Versions as dayzero wrote them before lineage: no lineage, seq, parent or fork fields."""
    job(root, max(steps), every=steps[0], keep=len(steps))
    for v in scan(root):
        raw = json.loads((v.path / MANIFEST).read_text())
        for k in ("lineage", "seq", "parent", "fork"):
            raw.pop(k)
        (v.path / MANIFEST).write_text(json.dumps(raw, indent=1, sort_keys=True) + "\n")
        write_marker(v.path)
    (root / SEQUENCE).unlink()


def test_legacy_manifests_load_as_one_lineage_that_a_run_continues(tmp_path):
    make_legacy(tmp_path, [2, 4, 6])
    assert all(verify_version(v.path).ok and read_manifest(v.path).lineage == "legacy" for v in scan(tmp_path))
    r, events = job(tmp_path, 8, every=2, keep=2)
    assert r.step == 6 and not [e for e in events if e["event"] == "checkpoint_branch"]
    after = complete(tmp_path)
    assert after == {version_name(6): (6, "legacy", 0), version_name(8): (8, "legacy", 1)}  # continued, retired
    assert read_manifest(tmp_path / version_name(8)).parent.name == version_name(6)


def test_legacy_older_step_branches(tmp_path):
    make_legacy(tmp_path, [2, 4, 6])
    _, events = job(tmp_path, 3, resume="2", keep=1)
    assert [e["parent_lineage"] for e in events if e["event"] == "checkpoint_branch"] == ["legacy"]
    assert sorted(complete(tmp_path)) == [version_name(s) for s in (2, 3, 4, 6)]


# -- import never overwrites -------------------------------------------------------------------------

def run_cli(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_import_refuses_an_existing_step_and_force_keeps_a_backup(tmp_path, capsys):
    ck = tmp_path / "ck"
    a = run_a(ck)
    hf = tmp_path / "hf"
    export_hf(ck / version_name(8), hf)
    before = (ck / version_name(8) / MANIFEST).read_text()
    code, out, err = run_cli(capsys, "ckpt", "import", str(hf), str(ck), "--step", "8")
    assert code == 2 and err.count("\n") == 1 and err.startswith("dayzero: error:")
    assert version_name(8) in err and "--force" in err and "Traceback" not in err
    assert complete(ck) == a and (ck / version_name(8) / MANIFEST).read_text() == before

    code, out, err = run_cli(capsys, "ckpt", "import", str(hf), str(ck), "--step", "8", "--force", "--json")
    res = json.loads(out)
    assert code == 0 and res["backup"] and os.path.basename(res["backup"]).startswith(version_name(8) + ".backup-")
    backup = tmp_path / "ck" / os.path.basename(res["backup"])
    assert (backup / MANIFEST).read_text() == before and verify_version(backup).ok  # the trained step 8, intact
    after = complete(ck)
    assert {k: after[k] for k in (version_name(s) for s in (2, 4, 6))} == {k: a[k] for k in after if k in a
                                                                         and k != version_name(8)}
    assert read_manifest(ck / version_name(8)).contents == ["model"]
    r, _ = job(ck, 8)
    assert r.path.name == version_name(8) and r.manifest.contents == ["model"]


def test_import_deletes_nothing_and_an_unfit_import_does_not_block_resume(tmp_path, caplog):
    from safetensors.torch import save_file

    a = run_a(tmp_path / "ck", keep=4)
    (tmp_path / "other").mkdir()
    save_file({"w": torch.ones(3)}, str(tmp_path / "other" / "model.safetensors"))
    import_hf(tmp_path / "other", tmp_path / "ck", step=10, keep=1)
    assert {k: v for k, v in complete(tmp_path / "ck").items() if k in a} == a and len(complete(tmp_path / "ck")) == 5
    with caplog.at_level(logging.WARNING, logger="dayzero.checkpoint"):
        r, _ = job(tmp_path / "ck", 8)  # the newest version is not this model's: fall back, do not refuse
    assert r.path.name == version_name(8)
    assert any(version_name(10) in rec.getMessage() and "holds no tensor" in rec.getMessage() for rec in caplog.records)
    with pytest.raises(CheckpointError, match="does not fit this run"):
        job(tmp_path / "ck", 10, resume="10")


# -- one job per checkpoint directory -----------------------------------------------------------------

HOLD = textwrap.dedent("""
    import sys, time
    from dayzero.runtime.checkpoint.checkpointer import Checkpointer
    ck = Checkpointer(sys.argv[1])
    print("ready", flush=True)
    time.sleep(120)
""")


@pytest.mark.slow
def test_a_second_job_is_refused_naming_the_holder_and_a_dead_holders_lock_is_taken_over(tmp_path, capsys):
    ck = tmp_path / "ck"
    job(ck, 2, every=2)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [os.path.abspath("src"),
                                                                   os.environ.get("PYTHONPATH")] if p)}
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(ck)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "ready"
        info = read_holder(ck)
        assert info.pid == holder.pid
        with pytest.raises(CheckpointLocked, match=rf"in use by another job: pid {holder.pid} on {info.host}"):
            job(ck, 4)
        code, _, err = run_cli(capsys, "train", "tiny-llama", "--layers", "2", "--hidden", "64", "--steps", "1",
                               "--ckpt-dir", str(ck), "--quiet")
        assert code == 2 and f"pid {holder.pid}" in err and info.started in err and err.count("\n") == 1
        export_hf(ck / version_name(2), tmp_path / "hf")
        code, _, err = run_cli(capsys, "ckpt", "import", str(tmp_path / "hf"), str(ck), "--step", "5")
        assert code == 2 and f"pid {holder.pid}" in err and err.count("\n") == 1
        assert list(complete(ck)) == [version_name(2)]
    finally:
        holder.kill()
        holder.wait()
    r, _ = job(ck, 4)  # the holder died without releasing: the lock is free again
    assert r.step == 2 and read_holder(ck) is None


@pytest.mark.slow
def test_a_launcher_lends_its_lock_to_the_processes_it_starts(tmp_path):
    child = ("import sys; from dayzero.runtime.checkpoint.dirlock import DirLock; "
             "l = DirLock(sys.argv[1]).acquire(); print(l.owned)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [os.path.abspath("src"),
                                                                   os.environ.get("PYTHONPATH")] if p)}
    for lend, expect in ((True, "False"), (False, None)):
        with DirLock(tmp_path, lend_to_children=lend):
            p = subprocess.run([sys.executable, "-c", child, str(tmp_path)], capture_output=True, text=True, env=env)
        if expect is None:
            assert p.returncode != 0 and "in use by another job" in p.stderr
        else:
            assert p.returncode == 0 and p.stdout.strip() == expect  # shared, not taken
    assert (tmp_path / LOCK_FILE).read_text() == ""


def test_checkpointers_of_one_process_share_its_lock_and_close_releases_it(tmp_path):
    a = Checkpointer(tmp_path)
    b = Checkpointer(tmp_path)  # same process: the same job
    assert read_holder(tmp_path).pid == os.getpid()
    b.close()
    a.close()
    assert read_holder(tmp_path) is None
