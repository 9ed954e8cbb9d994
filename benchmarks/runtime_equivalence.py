"""Layouts vs one process: the largest relative per-step loss difference, step time,
communication share and peak memory of each layout (fp32, same seed and global batch).

    PYTHONPATH=src python benchmarks/runtime_equivalence.py [--steps 10] [--out FILE]

The assertions live in tests/runtime/parallel/test_runtime_parallel.py; this script reports the numbers (for
benchmarks/RESULTS_runtime.md) and writes them as JSON to --out or $OUT/runtime_equivalence.json.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from dayzero.runtime.config import ModelSection, OptimizerSection, TrainConfig
from dayzero.runtime.metrics import read_metrics
from dayzero.runtime.train_entry import spawn
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import model_presets

B = dict(seq=32, mbs=1, gbs=8)
LAYOUTS = [  # (name, model kind, world, ParallelConfig)
    ("tp2 pp2 dp2, layer split 1,3", "dense", 8, ParallelConfig(tp=2, pp=2, dp=2, layer_split=(1, 3), **B)),
    ("tp2 dp2 zero3", "dense", 4, ParallelConfig(tp=2, dp=2, zero=3, **B)),
    ("tp2 dp2 sp zero2 selective", "dense", 4, ParallelConfig(tp=2, dp=2, zero=2, sequence_parallel=True,
                                                              recompute="selective", **B)),
    ("tp2 dp2 zero0 full", "dense", 4, ParallelConfig(tp=2, dp=2, zero=0, recompute="full", **B)),
    ("tp4 sp (kv heads replicated)", "dense", 4, ParallelConfig(tp=4, sequence_parallel=True, **B)),
    ("pp2 vpp2 interleaved 1F1B", "dense", 2, ParallelConfig(pp=2, vpp=2, **B)),
    ("pp2 vpp2 gpipe full", "dense", 2, ParallelConfig(pp=2, vpp=2, schedule="gpipe", recompute="full", **B)),
    ("MoE ep2 dp2 tp2", "moe", 4, ParallelConfig(ep=2, dp=2, tp=2, **B)),
    ("MoE ep4 dp4 zero3", "moe", 4, ParallelConfig(ep=4, dp=4, zero=3, **B)),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dayzero-equiv-"))
    moe = tmp / "tiny-moe-aux"
    moe.mkdir()
    cfg = {k: v for k, v in model_presets()["tiny-moe"].items() if not k.startswith("_")}
    cfg.update(aux_loss_alpha=0.01, n_group=2, topk_group=1)
    (moe / "config.json").write_text(json.dumps(cfg))
    models = {"dense": ModelSection("tiny-llama", hidden=128), "moe": ModelSection(str(moe))}

    def run(name, kind, world, parallel):
        m = tmp / f"{abs(hash(name))}.jsonl"
        code = spawn(TrainConfig(parallel=parallel, steps=a.steps, seed=7, compute_dtype="fp32", quiet=True,
                                 metrics=str(m), optimizer=OptimizerSection(lr=3e-3), model=models[kind]), world)
        return read_metrics(m) if code == 0 else ([], None)

    refs = {kind: run(f"ref {kind}", kind, 1, ParallelConfig(**B))[0] for kind in models}
    rows = []
    for name, kind, world, parallel in LAYOUTS:
        steps, end = run(name, kind, world, parallel)
        ref = refs[kind]
        ok = len(steps) == len(ref) == a.steps
        rel = max(abs(s["loss"] - r["loss"]) / abs(r["loss"]) for s, r in zip(steps, ref)) if ok else None
        later = steps[1:]
        rows.append({"layout": name, "model": kind, "world": world, "max_rel_loss_diff": rel,
                     "mean_step_s": sum(s["step_time_s"] for s in later) / len(later) if ok else None,
                     "comm_share": (sum(s["comm_time_s"] for s in later) / sum(s["step_time_s"] for s in later))
                     if ok else None,
                     "peak_mem_bytes": end["peak_mem_bytes"] if end else None})
        print(json.dumps(rows[-1]), flush=True)
    res = {"steps": a.steps, "reference_losses": {k: [s["loss"] for s in v] for k, v in refs.items()}, "rows": rows,
           "load_avg_1min": os.getloadavg()[0]}
    out = a.out or (os.path.join(os.environ["OUT"], "runtime_equivalence.json") if os.environ.get("OUT") else None)
    if out:
        Path(out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
