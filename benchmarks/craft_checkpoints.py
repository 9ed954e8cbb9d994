"""Crafted checkpoint side files (valid checksums, bad content) through the verbs that read them.

Trains tiny-llama for 2 steps into a temporary checkpoint directory, then for each crafted
train_state.json / optimizer_groups.json / rng-00000.json (manifest and marker updated so only the
content is wrong) runs `dayzero ckpt verify` and `dayzero train --ckpt-dir`, and counts tracebacks
and exits other than 0/1/2. Usage: PYTHONPATH=src python benchmarks/craft_checkpoints.py
"""
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from dayzero.runtime.checkpoint.manifest import describe_file, read_manifest, write_json_durable, write_marker

WORK = Path(tempfile.mkdtemp(prefix="dz-craft-"))
subprocess.run(["dayzero", "train", "tiny-llama", "--steps", "2", "--ckpt-dir", "ck", "--ckpt-every", "1",
                "--metrics", "m.jsonl", "--quiet"], cwd=WORK, check=True, capture_output=True)
BASE = WORK / "ck"
ts = json.loads((BASE / "step-00000002/train_state.json").read_text())
og = json.loads((BASE / "step-00000002/optimizer_groups.json").read_text())
rng = json.loads((BASE / "step-00000002/rng-00000.json").read_text())
k0 = next(iter(og))


def T(**kw):
    d = json.loads(json.dumps(ts))
    d.update(kw)
    return d



CASES = {
 "train_state.json": [[], "x", {}, T(step="two"), T(step=-3), T(step=10**30), T(data=None), T(data={"stream": 5}),
   T(data={"stream": {"samples": -1, "seed": 0, "seq": 256, "fingerprint": "6f955ddda70fbeb1"}, "batch": 2}),
   T(scheduler=None), T(scheduler={"base_lrs": "x"}), T(extra=None), T(extra={"guard": 5, "skipped_batches": "x"}),
   T(scheduler={**ts["scheduler"], "base_lrs": [1e400]})],
 "optimizer_groups.json": [[], {}, {k0: {"__tensor__": {"dtype": "float32", "shape": [3], "data": "AAAA"}}},
   {**og, k0: {"__tuple__": 5}}, {**og, k0: "bogus"}, {**og, "param_groups.nonexistent.lr": 1.0},
   {k: ("x" if k.endswith(".lr") else v) for k, v in og.items()},
   {k: (None if k.endswith(".betas") else v) for k, v in og.items()}],
 "rng-00000.json": [[], {}, {k: None for k in rng}, {k: "x" for k in rng},
   {**rng, "torch": {"__tensor__": {"dtype": "uint8", "shape": [4], "data": "AAAAAA=="}}},
   {**rng, "python": [1, 2]}, {**rng, "numpy": {"a": 1}}],
}
bad = 0
for fname, variants in CASES.items():
    for i, v in enumerate(variants):
        d = WORK / f"{fname}-{i}"
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(BASE, d / "ck")
        ver = d / "ck/step-00000002"
        (ver / fname).write_text(json.dumps(v))
        m = read_manifest(ver)
        files = [describe_file(ver, f.path) if f.path == fname else f for f in m.files]
        write_json_durable(ver / "manifest.json", m.model_copy(update={"files": files}).to_json())
        write_marker(ver)
        for cmd in (["dayzero", "ckpt", "verify", "ck"],
                    ["dayzero", "train", "tiny-llama", "--steps", "3", "--ckpt-dir", "ck", "--metrics", "m.jsonl",
                     "--quiet"]):
            r = subprocess.run(cmd, cwd=d, capture_output=True, text=True, timeout=300)
            tb = "Traceback" in r.stderr
            if tb or r.returncode not in (0, 1, 2):
                bad += 1
                last = (r.stderr.strip().splitlines() or [""])[-1][:200]
                print(f"BAD {fname}[{i}] {' '.join(cmd[:3])}: rc={r.returncode} {last}")
            else:
                last = (r.stderr.strip().splitlines() or [""])[-1][:160]
                print(f"ok  {fname}[{i}] {' '.join(cmd[:3])}: rc={r.returncode} {last}")
print("bad", bad)
