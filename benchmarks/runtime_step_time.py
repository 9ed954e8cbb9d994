"""Runtime overhead on one CPU process: the runtime's train_step vs a plain PyTorch loop on the
same model, batches and optimizer.

The runtime side is everything ``dayzero train`` runs on one rank: FSDP2 over a one-rank mesh
(with its mixed-precision policy installed), the cross-dimension grad-norm clipping, the
warmup-cosine scheduler, the data stream. The plain loop is the textbook one: the zoo model
without parallelize, ``loss.backward()``, ``torch.nn.utils.clip_grad_norm_``, the same fused
``AdamW`` and LR schedule.

Both run fp32, in the same process, on one thread, in alternating blocks of steps so that machine
load hits both alike. Two statistics per side: the median wall-clock step time, and the median
CPU time of the process per step (``time.process_time``), which other processes' load on a
shared machine does not inflate. Target: runtime within 5 %.

    PYTHONPATH=src python benchmarks/runtime_step_time.py [--model tiny-llama] [--steps 30] [--out FILE]

Writes a JSON summary to --out (default: $OUT/runtime_step_time.json when $OUT is set).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

from dayzero.runtime.config import ModelSection, TrainConfig
from dayzero.runtime.models.model import build_model, initial_value
from dayzero.runtime.optim import build_scheduler
from dayzero.runtime.train import build_state, train_step
from dayzero.specs.parallel import ParallelConfig


def plain_loop(cfg: TrainConfig, spec, data):
    """The same model and data as the runtime, trained the way a single-GPU tutorial does."""
    p = cfg.parallel
    model = build_model(spec, p.seq).to_empty(device="cpu")
    model.init_buffers()
    with torch.no_grad():
        for name, w in model.named_parameters():
            w.copy_(initial_value(name, tuple(w.shape), cfg.seed))
    decay = [w for w in model.parameters() if w.ndim >= 2]
    rest = [w for w in model.parameters() if w.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.optimizer.weight_decay},
                             {"params": rest, "weight_decay": 0.0}], lr=cfg.optimizer.lr, betas=(0.9, 0.95), eps=1e-8,
                            fused=True)  # the runtime's optimizer too: measure overhead, not optimizer choice
    sched = build_scheduler(opt, cfg.warmup_steps, cfg.steps, cfg.optimizer.min_lr_ratio)
    n = p.microbatches

    def step() -> None:
        x, y = data.batch(p.gbs)
        x, y = torch.from_numpy(x), torch.from_numpy(y)
        total = 0.0
        for xb, yb in zip(x.split(p.mbs), y.split(p.mbs)):
            loss = F.cross_entropy(model(xb).flatten(0, 1), yb.flatten()) / n
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optimizer.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)

    return step


def timed(fn) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one call."""
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--layers", type=int, default=None, help="proxy depth (ModelSpec.shrink)")
    ap.add_argument("--hidden", type=int, default=None, help="proxy width (ModelSpec.shrink)")
    ap.add_argument("--vocab", type=int, default=None, help="proxy vocabulary (ModelSpec.shrink)")
    ap.add_argument("--steps", type=int, default=30, help="measured steps per side (after warm-up)")
    ap.add_argument("--block", type=int, default=2, help="steps per alternating block")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--gbs", type=int, default=8)
    ap.add_argument("--mbs", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    total = a.steps + 2 * a.block
    cfg = TrainConfig(model=ModelSection(a.model, layers=a.layers, hidden=a.hidden, vocab=a.vocab),
                      parallel=ParallelConfig(seq=a.seq, gbs=a.gbs, mbs=a.mbs), steps=total * 2,
                      compute_dtype="fp32", quiet=True)
    state = build_state(cfg)
    from dayzero.runtime.data import TokenStream, resolve_data

    data = TokenStream(resolve_data(None), a.seq, cfg.seed, state.spec.vocab)
    plain = plain_loop(cfg, state.spec, data)

    runtime_t, plain_t = [], []
    for _ in range(a.block):  # warm-up both (allocator, first-touch, FSDP lazy init)
        train_step(state)
        plain()
    while len(runtime_t) < a.steps:
        runtime_t += [timed(lambda: train_step(state)) for _ in range(a.block)]
        plain_t += [timed(plain) for _ in range(a.block)]
    med = statistics.median
    rw, rc = med(t[0] for t in runtime_t), med(t[1] for t in runtime_t)
    pw, pc = med(t[0] for t in plain_t), med(t[1] for t in plain_t)
    params = sum(p.numel() for p in state.model.parameters())
    res = {"model": state.spec.name, "params": params, "seq": a.seq, "gbs": a.gbs, "mbs": a.mbs,
           "threads": a.threads, "steps_each": len(runtime_t),
           "runtime_wall_median_s": rw, "plain_wall_median_s": pw, "overhead_wall": rw / pw - 1,
           "runtime_cpu_median_s": rc, "plain_cpu_median_s": pc, "overhead_cpu": rc / pc - 1,
           "torch": torch.__version__, "load_avg_1min": os.getloadavg()[0]}
    print(json.dumps(res, indent=1))
    out = a.out or (os.path.join(os.environ["OUT"], "runtime_step_time.json") if os.environ.get("OUT") else None)
    if out:
        with open(out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
