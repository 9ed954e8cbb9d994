"""``dayzero ckpt list|verify|export|import`` and the safetensors interchange."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from dayzero.cli.app import main
from dayzero.runtime.checkpoint.checkpointer import Checkpointer
from dayzero.runtime.checkpoint.interchange import export_hf, import_hf
from dayzero.runtime.checkpoint.manifest import CheckpointError
from dayzero.runtime.checkpoint.versions import prepare_partial, version_name

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 3))


@pytest.fixture
def ckdir(tmp_path):
    m = model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    ck = Checkpointer(tmp_path / "ck", model_name="tiny", spec_digest="abcd", layout={"tp": 1, "dp": 1})
    for s in (1, 2):
        m(torch.randn(2, 6)).sum().backward()
        opt.step()
        ck.save(s, m, opt, data={"batch": s})
    ck.close()  # the lock released: as after the job that wrote them
    prepare_partial(tmp_path / "ck", 3)
    return tmp_path / "ck", m


def run_cli(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_list_json(ckdir, capsys):
    code, out, _ = run_cli(capsys, "ckpt", "list", str(ckdir[0]), "--json")
    rows = json.loads(out)["versions"]
    assert code == 0 and [(r["step"], r["state"]) for r in rows] == [(1, "complete"), (2, "complete"), (3, "partial")]
    assert rows[1]["model"] == {"name": "tiny", "spec_digest": "abcd", "recipe": {}} and rows[1]["bytes"] > 0
    code, out, _ = run_cli(capsys, "ckpt", "list", str(ckdir[0]))
    assert code == 0 and "step" in out


def test_verify_exit_codes_and_problems(ckdir, capsys):
    root = ckdir[0]
    code, out, _ = run_cli(capsys, "ckpt", "verify", str(root / version_name(2)), "--json")
    assert code == 0 and json.loads(out)["ok"]
    shard = next((root / version_name(2)).glob("__0_*.distcp"))
    data = bytearray(shard.read_bytes())
    data[-5] ^= 0xFF
    shard.write_bytes(bytes(data))
    code, out, _ = run_cli(capsys, "ckpt", "verify", str(root), "--json")
    res = json.loads(out)
    assert code == 1 and not res["ok"]
    by_step = {r["step"]: r for r in res["versions"]}
    assert by_step[1]["ok"] and "xxh3-128 checksum mismatch" in by_step[2]["problems"][0]
    assert "never resumed" in by_step[3]["skipped"]  # the .partial is no version: listed, not failed
    code, _, _ = run_cli(capsys, "ckpt", "verify", str(root / version_name(2)), "--sizes-only")
    assert code == 0  # a flipped bit keeps the size
    code, _, err = run_cli(capsys, "ckpt", "verify", str(root / "nope"))
    assert code == 2 and err.startswith("dayzero: error:") and "Traceback" not in err


def test_export_import_round_trip(ckdir, tmp_path, capsys):
    root, m = ckdir
    code, out, _ = run_cli(capsys, "ckpt", "export", str(root / version_name(2)), str(tmp_path / "hf"), "--json")
    res = json.loads(out)
    assert code == 0 and res["files"] == ["model.safetensors"] and res["tensors"] == 4 and res["step"] == 2
    from safetensors.torch import load_file

    w = load_file(str(tmp_path / "hf" / "model.safetensors"))
    for k, v in m.state_dict().items():
        assert torch.equal(w[k], v)
    prov = json.loads((tmp_path / "hf" / "dayzero_export.json").read_text())
    assert prov["step"] == 2 and prov["model"]["spec_digest"] == "abcd"

    code, out, _ = run_cli(capsys, "ckpt", "import", str(tmp_path / "hf"), str(tmp_path / "ck2"), "--step", "7",
                           "--json")
    assert code == 0 and json.loads(out)["step"] == 7
    fresh = model()
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    opt = torch.optim.AdamW(fresh.parameters())
    r = Checkpointer(tmp_path / "ck2").resume(fresh, opt)  # model-only: optimizer starts fresh
    assert r.step == 7 and r.manifest.contents == ["model"]
    for a, b in zip(fresh.state_dict().values(), m.state_dict().values()):
        assert torch.equal(a, b)


def test_sharded_export_and_bf16(ckdir, tmp_path):
    # bf16 bytes: 0.weight 120 (a file alone, over 100), then 0.bias 20 + 2.weight 60 + 2.bias 6
    res = export_hf(ckdir[0] / version_name(2), tmp_path / "hf", dtype="bf16", max_shard_bytes=100)
    assert len(res.files) == 2 and (tmp_path / "hf" / "model.safetensors.index.json").exists()
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert index["metadata"]["total_size"] == res.bytes == 2 * (6 * 10 + 10 + 10 * 3 + 3)
    path = import_hf(tmp_path / "hf", tmp_path / "ck2")  # reads the index
    assert path.name == version_name(0)


def test_import_refuses_pickles_and_escaping_index(tmp_path):
    (tmp_path / "a").mkdir()
    torch.save({"w": torch.ones(1)}, tmp_path / "a" / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="safetensors only"):
        import_hf(tmp_path / "a", tmp_path / "ck")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "../a/pytorch_model.bin"}}))
    with pytest.raises(CheckpointError, match="leaves the model directory"):
        import_hf(tmp_path / "b", tmp_path / "ck")


def test_export_refuses_a_corrupt_version(ckdir, tmp_path):
    v = ckdir[0] / version_name(1)
    (v / "train_state.json").write_text("{}")
    with pytest.raises(CheckpointError, match="failed verification"):
        export_hf(v, tmp_path / "hf")


def test_help_has_examples(capsys):
    for verb in ("list", "verify", "export", "import"):
        code, out, _ = run_cli(capsys, "ckpt", verb, "--help")
        assert code == 0 and "Example" in out


def test_bad_options_are_one_line_errors(capsys):
    code, _, err = run_cli(capsys, "ckpt", "export", "x", "y", "--bogus")
    assert code == 2 and err.startswith("dayzero: error:") and "Traceback" not in err
    code, _, err = run_cli(capsys, "train", "tiny-llama", "--keep", "0")
    assert code == 2 and "--keep" in err
    code, _, err = run_cli(capsys, "train", "tiny-llama", "--inject-fault", "step=1,rank=0,kind=melt")
    assert code == 2 and "--inject-fault" in err


def test_abandoned_versions_do_not_fail_verify_and_gc_removes_them(ckdir, capsys):
    """A .partial (an interrupted save) and a .deleting (an interrupted deletion) are skipped by
    ckpt verify and removed by ckpt gc, which holds the directory lock while it works."""
    root = ckdir[0]
    (root / (version_name(4) + ".deleting")).mkdir()
    (root / (version_name(4) + ".deleting") / "x.distcp").write_bytes(b"0" * 1000)
    code, out, _ = run_cli(capsys, "ckpt", "verify", str(root), "--json")
    res = json.loads(out)
    assert code == 0 and res["ok"] and sum(1 for r in res["versions"] if r.get("skipped")) == 2
    code, out, _ = run_cli(capsys, "ckpt", "gc", str(root), "--json")
    res = json.loads(out)
    assert code == 0 and sorted(Path(r["path"]).name for r in res["removed"]) == [
        version_name(3) + ".partial", version_name(4) + ".deleting"] and res["bytes"] >= 1000
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step-")) == [version_name(1), version_name(2)]


@pytest.mark.slow
def test_ckpt_gc_refuses_while_another_job_holds_the_lock(ckdir, capsys):
    import subprocess
    import sys

    root = ckdir[0]
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl,sys,time; f=open(sys.argv[1],'a+'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(30)",
                               str(root / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        code, _, err = run_cli(capsys, "ckpt", "gc", str(root))
        assert code == 2 and "in use by another job" in err and (root / (version_name(3) + ".partial")).exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_new_checkpointer_removes_abandoned_directories(ckdir):
    """The next start that holds the lock removes what a crash left (before its first save)."""
    root = ckdir[0]
    (root / (version_name(5) + ".deleting")).mkdir()
    events = []
    ck = Checkpointer(root, model_name="m", on_event=events.append)
    try:
        assert not any(p.name.endswith((".partial", ".deleting")) for p in root.iterdir())
        assert {Path(e["path"]).name for e in events if e["event"] == "checkpoint_abandoned_removed"} == {
            version_name(3) + ".partial", version_name(5) + ".deleting"}
    finally:
        ck.close()
