"""Auxiliary-loss-free balancing on a router that favours two experts (issue 18, done-means (a)).

tiny-moe (2 layers, hidden 64, 8 routed experts, top-2, sigmoid scores), one process, fp32. Before
the first step every MoE router's selection bias is set to +SKEW on experts 0 and 1, so nearly every
token picks those two (max/mean ~4). One run updates the bias by DeepSeek-V3's rule
(``--moe-bias-rate``, gamma = 0.001, arXiv 2412.19437 sec. 4.2), the other keeps it (rate 0).
Reports max/mean expert load per step, the first step at which it stays below 1.3, and the loss.

The learning-rate schedule is DeepSeek-V3's: linear warm-up from 0 to 2.2e-4 over the first 2K
steps (sec. 4.2), so the 200 steps measured are the first 200 of that recipe, where the bias rate
0.001 was published for. ``--warmup 20`` compresses the warm-up tenfold (the router then learns at
the full rate from step 20 and outruns the bias: recorded in RESULTS.md as a stress case).

Per-step max/mean carries counting noise: with S routed slots per expert and step, perfectly balanced
routing still gives E[max/mean] ~ 1 + 1.4 sqrt((1 - 1/E) / S) (1.12 at this benchmark's S = 128).
DeepSeek-V3 counts each step's loads over batches of up to 15,360 x 4,096 tokens (arXiv 2412.19437
sec. 4.2), where that noise is negligible. So the summary also reports max/mean of the loads
accumulated over a sliding window of W steps, as DeepSeek's EPLB estimates expert loads from
statistics over a window (https://github.com/deepseek-ai/EPLB, README). W is chosen by a stated rule,
not by the result: the smallest W whose counting-noise floor (Monte Carlo, balanced routing) is at
most NOISE_FLOOR. The bias update itself still uses each single step's loads.

    PYTHONPATH=src python benchmarks/moe_balance.py [--steps 200] [--gbs 8] [--workdir DIR] [--out FILE]
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
NOISE_FLOOR = 1.05  # window rule: balanced-routing max/mean at most 1/6 of the way to the 1.3 target
TARGET = 1.3
LR = 2.2e-4  # DeepSeek-V3's peak learning rate (arXiv 2412.19437 sec. 4.2), with its gamma 0.001
WARMUP = 2000  # DeepSeek-V3: "linearly increases from 0 to 2.2e-4 during the first 2K steps" (sec. 4.2)


def one_run(rate: float, steps: int, metrics: str, gbs: int, seq: int, warmup: int = WARMUP) -> None:
    """Train in this process (a one-rank group) with the skewed router; metrics to ``metrics``."""
    import torch

    from dayzero.runtime.config import ModelSection, MoESection, OptimizerSection, TrainConfig
    from dayzero.runtime.models.moe import MoE
    from dayzero.runtime.train import build_state, train
    from dayzero.specs.parallel import ParallelConfig

    cfg = TrainConfig(model=ModelSection("tiny-moe", layers=2, hidden=64),
                      parallel=ParallelConfig(seq=seq, mbs=gbs, gbs=gbs),
                      optimizer=OptimizerSection(lr=LR, warmup=warmup),
                      moe=MoESection(bias_rate=rate, loads_every=1), steps=steps, seed=0, compute_dtype="fp32",
                      metrics=metrics, quiet=True, measure_comm=False)
    state = build_state(cfg)
    with torch.no_grad():
        for part in state.model.parts:
            for m in part.modules():
                if isinstance(m, MoE):
                    m.router.e_score_correction_bias[list(FAVOURED)] = SKEW
    train(cfg, state=state)


def noise_floor(slots: int, experts: int, draws: int = 4000, seed: int = 0) -> float:
    """Mean max/mean of ``slots`` routed slots spread uniformly at random over ``experts`` experts
    (balanced routing, only counting noise); a multinomial Monte Carlo with a fixed seed."""
    import numpy as np

    c = np.random.default_rng(seed).multinomial(slots, [1.0 / experts] * experts, size=draws)
    return float((c.max(1) / c.mean(1)).mean())


def pick_window(slots_per_step: int, experts: int, limit: float = NOISE_FLOOR) -> int:
    """The smallest window (steps) whose accumulated loads have a counting-noise floor <= ``limit``."""
    w = 1
    while noise_floor(slots_per_step * w, experts) > limit:
        w += 1
    return w


def summarize(metrics: str) -> dict:
    from dayzero.runtime.metrics import read_metrics

    steps, _ = read_metrics(metrics)
    mm = [max(r["moe"]["max_mean"]) for r in steps]  # worst MoE layer per step
    below = next((i + 1 for i in range(len(mm)) if all(v < TARGET for v in mm[i:])), None)
    first = next((i + 1 for i, v in enumerate(mm) if v < TARGET), None)
    tail = mm[-50:]
    loads = [r["expert_loads"] for r in steps]  # [step][layer][expert], every step (loads_every=1)
    experts = len(loads[0][0])
    slots = sum(loads[0][0])  # routed slots per step and layer (tokens x top-k)
    window = pick_window(slots, experts)
    win = []  # worst layer's max/mean of the loads summed over steps t-W+1..t, from step W on
    for t in range(window - 1, len(loads)):
        acc = [[sum(loads[s][li][e] for s in range(t - window + 1, t + 1)) for e in range(experts)]
               for li in range(len(loads[t]))]
        win.append(max(max(row) / (sum(row) / experts) for row in acc))
    wtail = win[-50:]
    wfirst = next((i + window for i, v in enumerate(win) if v < TARGET), None)
    wbelow = next((i + window for i in range(len(win)) if all(v < TARGET for v in win[i:])), None)
    return {"max_mean_first": mm[0], "max_mean_last": mm[-1], "max_mean_tail_mean": sum(tail) / len(tail),
            "max_mean_tail_min": min(tail), "first_step_below_1.3": first, "stays_below_1.3_from_step": below,
            "steps_below_1.3_in_tail": sum(v < TARGET for v in tail), "loss_first": steps[0]["loss"],
            "loss_last": steps[-1]["loss"], "loss_tail_mean": sum(r["loss"] for r in steps[-50:]) / len(steps[-50:]),
            "slots_per_step": slots, "noise_floor_per_step": noise_floor(slots, experts), "window": window,
            "noise_floor_window": noise_floor(slots * window, experts),
            "window_max_mean_last": win[-1], "window_max_mean_tail_mean": sum(wtail) / len(wtail),
            "window_max_mean_tail_max": max(wtail), "window_steps_below_1.3_in_tail": sum(v < TARGET for v in wtail),
            "window_first_step_below_1.3": wfirst, "window_stays_below_1.3_from_step": wbelow,
            "max_mean": [round(v, 4) for v in mm], "window_max_mean": [round(v, 4) for v in win]}


def compare(steps: int, gbs: int = 8, seq: int = 64, workdir: str | None = None, warmup: int = WARMUP) -> dict:
    """Both runs, each in a process of its own; {"bias": summary, "no_bias": summary}."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="moe-balance-") as tmp:
        for name, rate in (("bias", 1e-3), ("no_bias", 0.0)):
            metrics = str(Path(workdir or tmp) / f"{name}.jsonl")
            env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
            subprocess.run([sys.executable, __file__, "--one", str(rate), "--steps", str(steps), "--gbs", str(gbs),
                            "--seq", str(seq), "--warmup", str(warmup), "--metrics", metrics], check=True,
                           env=env)
            out[name] = summarize(metrics)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--gbs", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=WARMUP, help="learning-rate warm-up steps (default: DeepSeek-V3's "
                    "2,000; the run covers its first --steps)")
    ap.add_argument("--out")
    ap.add_argument("--workdir", help="keep the two runs' metrics JSONL here (default: a temporary folder)")
    ap.add_argument("--summarize", nargs=2, metavar=("BIAS_JSONL", "NO_BIAS_JSONL"),
                    help="only summarize two metrics files of earlier runs")
    ap.add_argument("--one", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--metrics", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one is not None:
        one_run(a.one, a.steps, a.metrics, a.gbs, a.seq, a.warmup)
        return
    res = ({"bias": summarize(a.summarize[0]), "no_bias": summarize(a.summarize[1])} if a.summarize
           else compare(a.steps, a.gbs, a.seq, a.workdir, a.warmup))
    for name, s in res.items():
        print(f"{name:8s} max/mean first {s['max_mean_first']:.3f} last {s['max_mean_last']:.3f} "
              f"(last 50 steps: mean {s['max_mean_tail_mean']:.3f}, min {s['max_mean_tail_min']:.3f}, "
              f"{s['steps_below_1.3_in_tail']} below 1.3); first below 1.3 at step {s['first_step_below_1.3']}; "
              f"loss {s['loss_first']:.4f} -> {s['loss_last']:.4f} (mean of last 50: {s['loss_tail_mean']:.4f})")
        print(f"{'':8s} {s['slots_per_step']} slots/step, noise floor {s['noise_floor_per_step']:.3f} per step; "
              f"window {s['window']} steps (floor {s['noise_floor_window']:.3f}): "
              f"last {s['window_max_mean_last']:.3f}, "
              f"last 50: mean {s['window_max_mean_tail_mean']:.3f}, max {s['window_max_mean_tail_max']:.3f}, "
              f"{s['window_steps_below_1.3_in_tail']} below 1.3; first below at step "
              f"{s['window_first_step_below_1.3']}, stays below from step {s['window_stays_below_1.3_from_step']}")
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
