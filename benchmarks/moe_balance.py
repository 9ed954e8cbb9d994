"""Auxiliary-loss-free balancing on a router that favours two experts (issue 18, done-means (a)).

tiny-moe (2 layers, hidden 64, 8 routed experts, top-2, sigmoid scores), one process, fp32. Before
the first step every MoE router's selection bias is set to +SKEW on experts 0 and 1, so nearly every
token picks those two (max/mean ~4). One run updates the bias by DeepSeek-V3's rule
(``--moe-bias-rate``, gamma = 0.001, arXiv 2412.19437 sec. 4.2), the other keeps it (rate 0).
Reports max/mean expert load per step, the first step at which it stays below 1.3, and the loss.

    PYTHONPATH=src python benchmarks/moe_balance.py [--steps 200] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SKEW = 0.05  # initial selection bias of the two favoured experts (sigmoid scores lie in (0, 1))
FAVOURED = (0, 1)
LR = 2.2e-4  # DeepSeek-V3's peak learning rate (arXiv 2412.19437 sec. 4.2), with its gamma 0.001


def one_run(rate: float, steps: int, metrics: str, gbs: int, seq: int) -> None:
    """Train in this process (a one-rank group) with the skewed router; metrics to ``metrics``."""
    import torch

    from dayzero.runtime.config import ModelSection, MoESection, OptimizerSection, TrainConfig
    from dayzero.runtime.models.moe import MoE
    from dayzero.runtime.train import build_state, train
    from dayzero.specs.parallel import ParallelConfig

    cfg = TrainConfig(model=ModelSection("tiny-moe", layers=2, hidden=64),
                      parallel=ParallelConfig(seq=seq, mbs=gbs, gbs=gbs), optimizer=OptimizerSection(lr=LR),
                      moe=MoESection(bias_rate=rate, loads_every=steps), steps=steps, seed=0, compute_dtype="fp32",
                      metrics=metrics, quiet=True, measure_comm=False)
    state = build_state(cfg)
    with torch.no_grad():
        for part in state.model.parts:
            for m in part.modules():
                if isinstance(m, MoE):
                    m.router.e_score_correction_bias[list(FAVOURED)] = SKEW
    train(cfg, state=state)


def summarize(metrics: str) -> dict:
    from dayzero.runtime.metrics import read_metrics

    steps, _ = read_metrics(metrics)
    mm = [max(r["moe"]["max_mean"]) for r in steps]  # worst MoE layer per step
    below = next((i + 1 for i in range(len(mm)) if all(v < 1.3 for v in mm[i:])), None)
    first = next((i + 1 for i, v in enumerate(mm) if v < 1.3), None)
    tail = mm[-50:]
    return {"max_mean_first": mm[0], "max_mean_last": mm[-1], "max_mean_tail_mean": sum(tail) / len(tail),
            "max_mean_tail_min": min(tail), "first_step_below_1.3": first, "stays_below_1.3_from_step": below,
            "steps_below_1.3_in_tail": sum(v < 1.3 for v in tail), "loss_first": steps[0]["loss"],
            "loss_last": steps[-1]["loss"], "loss_tail_mean": sum(r["loss"] for r in steps[-50:]) / len(steps[-50:]),
            "max_mean": [round(v, 4) for v in mm]}


def compare(steps: int, gbs: int = 8, seq: int = 64, workdir: str | None = None) -> dict:
    """Both runs, each in a process of its own; {"bias": summary, "no_bias": summary}."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="moe-balance-") as tmp:
        for name, rate in (("bias", 1e-3), ("no_bias", 0.0)):
            metrics = str(Path(workdir or tmp) / f"{name}.jsonl")
            env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
            subprocess.run([sys.executable, __file__, "--one", str(rate), "--steps", str(steps), "--gbs", str(gbs),
                            "--seq", str(seq), "--metrics", metrics], check=True, env=env)
            out[name] = summarize(metrics)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--gbs", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--out")
    ap.add_argument("--summarize", nargs=2, metavar=("BIAS_JSONL", "NO_BIAS_JSONL"),
                    help="only summarize two metrics files of earlier runs")
    ap.add_argument("--one", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--metrics", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one is not None:
        one_run(a.one, a.steps, a.metrics, a.gbs, a.seq)
        return
    res = ({"bias": summarize(a.summarize[0]), "no_bias": summarize(a.summarize[1])} if a.summarize
           else compare(a.steps, a.gbs, a.seq))
    for name, s in res.items():
        print(f"{name:8s} max/mean first {s['max_mean_first']:.3f} last {s['max_mean_last']:.3f} "
              f"(last 50 steps: mean {s['max_mean_tail_mean']:.3f}, min {s['max_mean_tail_min']:.3f}, "
              f"{s['steps_below_1.3_in_tail']} below 1.3); first below 1.3 at step {s['first_step_below_1.3']}; "
              f"loss {s['loss_first']:.4f} -> {s['loss_last']:.4f} (mean of last 50: {s['loss_tail_mean']:.4f})")
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
