"""Checkpointer in one process: exact resume, async save, corruption handling, safe loading."""

from __future__ import annotations

import json
import logging
import os
import pickle

import pytest
import torch
import torch.nn as nn
from torch.distributed.checkpoint.api import CheckpointException

from dayzero.runtime.checkpoint.checkpointer import TRAIN_STATE, Checkpointer
from dayzero.runtime.checkpoint.dcp_io import SafeLoadPlanner, SafeReader, load_metadata
from dayzero.runtime.checkpoint.json_state import from_json, to_json
from dayzero.runtime.checkpoint.manifest import MANIFEST, CheckpointError, describe_file, read_manifest
from dayzero.runtime.checkpoint.versions import scan, version_name
from dayzero.runtime.resilience.faults import InjectedFault

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def make(seed=0):
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    return m, opt, sched


def step(m, opt, sched):
    x = torch.randn(4, 8)  # draws from the global RNG: resume must restore it
    loss = (m(x) + 0.1 * torch.randn(4, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    return loss.item()


def run(root, steps, every=None, resume=True, async_save=False, keep=3, **kw):
    m, opt, sched = make()
    ck = Checkpointer(root, keep=keep, async_save=async_save, **kw)
    r = ck.resume(m, opt, sched) if resume else None
    start = r.step if r else 0
    losses = {}
    for s in range(start + 1, steps + 1):
        losses[s] = step(m, opt, sched)
        if every and s % every == 0:
            ck.save(s, m, opt, scheduler=sched, data={"batch": s})
    ck.close()
    return losses, r


def test_resume_continues_bitwise(tmp_path):
    ref, _ = run(tmp_path / "ref", 8)
    first, _ = run(tmp_path / "a", 5, every=5)
    rest, r = run(tmp_path / "a", 8)
    assert r.step == 5 and r.data == {"batch": 5}
    assert {**first, **rest} == ref  # exact float equality: model, AdamW, LambdaLR and RNG restored


def test_scalar_optimizer_state_goes_to_json_and_older_layouts_still_load(tmp_path, monkeypatch):
    from dayzero.runtime.checkpoint import checkpointer as ckpt_mod

    run(tmp_path / "new", 5, every=5)
    v = tmp_path / "new" / version_name(5)
    groups = from_json(json.loads((v / "optimizer_groups.json").read_text()))
    steps = {k: t for k, t in groups.items() if k.endswith(".step")}
    assert len(steps) == 4 and all(t.dtype == torch.float32 and t.dim() == 0 and t.item() == 5 for t in steps.values())
    assert not [k for k in load_metadata(v).state_dict_metadata if k.endswith(".step")]  # no DCP entries for them

    # a checkpoint written before scalars moved to JSON (step as DCP entries) resumes bitwise
    monkeypatch.setattr(ckpt_mod, "split_small", lambda flat: (
        {k: x for k, x in flat.items() if isinstance(x, torch.Tensor)},
        {k: x for k, x in flat.items() if not isinstance(x, torch.Tensor)}))
    ref, _ = run(tmp_path / "ref", 8)
    first, _ = run(tmp_path / "old", 5, every=5)
    old = tmp_path / "old" / version_name(5)
    assert len([k for k in load_metadata(old).state_dict_metadata if k.endswith(".step")]) == 4
    monkeypatch.undo()
    rest, r = run(tmp_path / "old", 8)
    assert r.step == 5 and {**first, **rest} == ref


def test_save_plans_are_cached_per_checkpointer_and_replanned_when_the_state_changes(tmp_path):
    from torch.distributed.checkpoint.planner import SavePlanner

    m, opt, sched = make()
    step(m, opt, sched)
    ck = Checkpointer(tmp_path, keep=5)
    ck.save(1, m)  # model only
    assert ck._plan_key in SavePlanner._cached_metadata
    ck.save(2, m, opt, scheduler=sched)  # the optimizer joins: planned again
    step(m, opt, sched)
    ck.save(3, m, opt, scheduler=sched)  # same structure: the cached plan
    ck.close()
    assert ck._plan_key not in SavePlanner._cached_metadata
    keys = {s: set(load_metadata(tmp_path / version_name(s)).state_dict_metadata) for s in (1, 2, 3)}
    assert not any(k.startswith("optim.") for k in keys[1]) and keys[2] == keys[3]
    assert any(k.endswith(".exp_avg_sq") for k in keys[3])
    m2, opt2, sched2 = make(seed=1)
    r = Checkpointer(tmp_path).resume(m2, opt2, sched2)
    assert r.step == 3 and all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), m2.state_dict().values()))
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert s1.keys() == s2.keys() and all(torch.equal(s1[i][k], s2[i][k]) for i in s1 for k in s1[i])


def test_async_save_matches_sync_and_commits(tmp_path):
    ref, _ = run(tmp_path / "ref", 8)
    first, _ = run(tmp_path / "a", 6, every=3, async_save=True)
    assert [v.step for v in scan(tmp_path / "a")] == [3, 6]
    rest, r = run(tmp_path / "a", 8, async_save=True)
    assert r.step == 6 and {**first, **rest} == ref


def test_async_save_blocks_for_less_than_the_save(tmp_path):
    m, opt, sched = make()
    step(m, opt, sched)
    ck = Checkpointer(tmp_path, async_save=True)
    blocked = ck.save(1, m, opt, scheduler=sched)
    done = ck.wait()
    ck.close()
    assert isinstance(blocked, float) and done.blocked_s == blocked and done.seconds >= blocked


def test_retention_keeps_newest(tmp_path):
    run(tmp_path, 10, every=2, keep=2)
    assert [v.step for v in scan(tmp_path)] == [8, 10]


@pytest.mark.parametrize("checksum", ["xxh3-128", "sha256"])
def test_corrupt_newest_is_skipped_with_a_warning_naming_it(tmp_path, caplog, checksum):
    run(tmp_path, 6, every=3, checksum=checksum)
    files = read_manifest(tmp_path / version_name(6)).files
    assert {f.algorithm for f in files} == {checksum}  # shards hashed while written, JSON files after
    assert all(describe_file(tmp_path / version_name(6), f.path, checksum) == f for f in files)
    newest = tmp_path / version_name(6)
    shard = next(newest.glob("__0_*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10
    shard.write_bytes(bytes(data))
    events = []
    with caplog.at_level(logging.WARNING, logger="dayzero.checkpoint"):
        _, r = run(tmp_path, 6, on_event=events.append)
    assert r.step == 3
    assert any(version_name(6) in rec.getMessage() and f"{checksum} checksum mismatch" in rec.getMessage()
               for rec in caplog.records)
    assert any(e["event"] == "checkpoint_skipped" and e["path"].endswith(version_name(6)) for e in events)


def test_truncated_shard_is_skipped(tmp_path):
    run(tmp_path, 6, every=3)
    shard = next((tmp_path / version_name(6)).glob("__0_*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    _, r = run(tmp_path, 6)
    assert r.step == 3 and r.skipped and "truncated" in r.skipped[0].summary()


def test_all_corrupt_is_an_error_not_a_fresh_start(tmp_path):
    run(tmp_path, 3, every=3)
    (tmp_path / version_name(3) / TRAIN_STATE).write_text("{}")
    with pytest.raises(CheckpointError, match="passes verification"):
        run(tmp_path, 3)


def test_crash_between_shard_writes_leaves_previous_checkpoint(tmp_path):
    def boom(step):
        if step == 6:
            raise InjectedFault("drill")

    with pytest.raises(CheckpointError, match="saving step 6 .*rank 0: InjectedFault: drill"):
        run(tmp_path, 6, every=3, before_shard_write=boom)
    assert {(v.step, v.state) for v in scan(tmp_path)} == {(3, "complete"), (6, "partial")}
    _, r = run(tmp_path, 3)  # the next start (holding the lock) removed the abandoned .partial
    assert r.step == 3 and not r.skipped and (6, "partial") not in {(v.step, v.state) for v in scan(tmp_path)}


def test_spec_digest_mismatch_is_one_clear_error(tmp_path):
    run(tmp_path, 2, every=2, model_name="a", spec_digest="1111")
    with pytest.raises(CheckpointError, match="spec 1111.*spec 2222"):
        run(tmp_path, 2, model_name="b", spec_digest="2222")


def test_explicit_resume_of_a_corrupt_version_fails(tmp_path):
    run(tmp_path, 4, every=2)
    (tmp_path / version_name(4) / TRAIN_STATE).write_text("{}")
    m, opt, sched = make()
    ck = Checkpointer(tmp_path)
    with pytest.raises(CheckpointError, match="failed verification"):
        ck.resume(m, opt, sched, which="4")
    assert ck.resume(m, opt, sched, which="2").step == 2


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > pwned.txt",))


def _refresh_manifest(v):
    """An attacker who can write files can also rewrite checksums: the manifest must not be the
    only defence."""
    m = read_manifest(v)
    files = [describe_file(v, f.path) for f in m.files]
    (v / MANIFEST).write_text(m.model_copy(update={"files": files}).to_json())
    from dayzero.runtime.checkpoint.manifest import write_marker

    write_marker(v)


def test_crafted_metadata_pickle_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run(tmp_path / "c", 2, every=2)
    v = tmp_path / "c" / version_name(2)
    (v / ".metadata").write_bytes(pickle.dumps(Evil()))
    _refresh_manifest(v)
    with pytest.raises(CheckpointError, match="passes verification"):
        run(tmp_path / "c", 2)  # auto resume skips it ...
    m, opt, sched = make()
    with pytest.raises(CheckpointError, match="refusing to unpickle posix.system"):
        Checkpointer(tmp_path / "c").resume(m, opt, sched, which="2")  # ... and says why when asked for it
    assert not (tmp_path / "pwned.txt").exists()


def test_crafted_non_tensor_entry_is_refused(tmp_path, monkeypatch):
    import torch.distributed.checkpoint as dcp

    monkeypatch.chdir(tmp_path)
    with pytest.warns(UserWarning):
        dcp.save({"w": torch.ones(2), "evil": Evil()}, checkpoint_id=tmp_path / "x", no_dist=True)
    sd = {"w": torch.zeros(2), "evil": None}
    with pytest.raises(CheckpointException, match="non-plain object"), pytest.warns(UserWarning):
        dcp.load(sd, storage_reader=SafeReader(tmp_path / "x"), planner=SafeLoadPlanner(), no_dist=True)
    assert not (tmp_path / "pwned.txt").exists()


def test_metadata_naming_files_outside_the_manifest_is_refused(tmp_path):
    run(tmp_path, 2, every=2)
    v = tmp_path / version_name(2)
    with pytest.raises(CheckpointError, match="not listed in the manifest"):
        load_metadata(v, {"__0_0.distcp"} - {"__0_0.distcp"})


def test_state_json_round_trip_keeps_types_and_bits():
    t = torch.tensor([1.5, float("nan"), -0.0], dtype=torch.bfloat16)
    scalar = torch.tensor(7.0)  # AdamW's per-parameter step
    s = {"a": (1, 2.5, None), "b": [True, "x"], "t": t, "n": {"k": (3,)}, "s": scalar, "e": torch.empty(0, 3)}
    back = from_json(json.loads(json.dumps(to_json(s))))
    assert back["a"] == (1, 2.5, None) and back["b"] == [True, "x"] and back["n"] == {"k": (3,)}
    assert back["t"].dtype == torch.bfloat16 and torch.equal(back["t"].view(torch.int16), t.view(torch.int16))
    assert back["s"].shape == () and back["s"].dtype == torch.float32 and back["s"].item() == 7.0
    assert back["e"].shape == (0, 3)
    with pytest.raises(CheckpointError, match="cannot store a function"):
        to_json({"f": lambda: 0})


def _net_parts(split):
    """ckpt_toy's Net (4 blocks) cut into parts at ``split`` (block indices), names kept."""
    from helpers import ckpt_toy

    torch.manual_seed(0)
    net = ckpt_toy.Net(4)
    if split is None:
        return [net]
    parts = []
    for lo, hi in split:
        part = ckpt_toy.Net(0)
        part.blocks = nn.ModuleDict({str(i): net.blocks[str(i)] for i in range(lo, hi)})
        part.inp = net.inp if lo == 0 else None
        part.out = net.out if hi == 4 else None
        parts.append(part)
    return parts


def _train(parts, opt, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(4, 32, generator=g), torch.randn(4, 32, generator=g)
        h = x
        for p in parts:
            h = p(h)
        loss = nn.functional.mse_loss(h, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_parts_with_one_optimizer_reshard_to_a_whole_model(tmp_path):
    parts = _net_parts([(0, 1), (1, 4)])  # two virtual stages on one rank, one AdamW over both
    opt = torch.optim.AdamW([p for part in parts for p in part.parameters()], lr=1e-2)
    _train(parts, opt, 3)
    Checkpointer(tmp_path).save(3, parts, opt)
    ref = _train(parts, opt, 3, seed=2)

    whole = _net_parts(None)
    opt2 = torch.optim.AdamW(whole[0].parameters(), lr=1e-2)
    assert Checkpointer(tmp_path).resume(whole[0], opt2).step == 3
    assert _train(whole, opt2, 3, seed=2) == ref
