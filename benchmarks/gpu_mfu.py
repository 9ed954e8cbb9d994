"""MFU of a Llama-3-8B-shaped proxy trained by the runtime on one GPU in BF16 (target >= 40 %).

PREPARED, NOT YET RUN: no GPU was lent to the session that wrote it. Run it on a CUDA machine:

    PYTHONPATH=src OUT=/tmp/out python benchmarks/gpu_mfu.py            # defaults below
    PYTHONPATH=src python benchmarks/gpu_mfu.py --layers 8 --seq 8192 --gbs 4 --steps 15

The proxy keeps every width of Llama-3.1-8B (hidden 4096, 32 heads / 8 KV heads of 128, SwiGLU
14336, vocab 128256) and cuts depth to ``--layers`` (default 8, about 2.8 B parameters) so the
fp32 master weights, gradients and AdamW states (16 bytes/parameter, about 45 GB) fit one H200
(141 GB) next to the activations. It runs exactly what ``dayzero train`` runs on one rank: FSDP2
with MixedPrecisionPolicy(bf16 params, fp32 reductions), fused SDPA (flash) attention, AdamW,
no torch.compile.

MFU = model FLOPs per step / step time / peak. Model FLOPs per token come from
``dayzero.specs.counting`` (6 x matmul parameters + attention scores; ``causal=True`` counts the
causal half of the score matrix, the convention of PaLM's MFU, Chowdhery et al. 2022; the full
s x s convention of Narayanan et al. 2021 is reported too). Peak: the accelerator catalog's dense
BF16 figure (H200: 989 TFLOP/s, NVIDIA H200 datasheet, via src/dayzero/specs/presets/data/hardware_catalog.json).
Step time: median over the steps after ``--warmup`` (first steps pay allocator growth and the
flash-attention autotuning). Writes ``gpu_mfu.json`` to $OUT (or --out) and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=None, help="shrink the width too (for --cpu-dry-run)")
    ap.add_argument("--vocab", type=int, default=None, help="shrink the vocabulary too (for --cpu-dry-run)")
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--mbs", type=int, default=1)
    ap.add_argument("--gbs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--recompute", default="none")
    ap.add_argument("--accelerator", default="h200", help="catalog name for the peak FLOP/s")
    ap.add_argument("--out", default=None)
    ap.add_argument("--cpu-dry-run", action="store_true",
                    help="run the same code on CPU (checks the script itself; the MFU is meaningless)")
    a = ap.parse_args()

    import torch

    if not torch.cuda.is_available() and not a.cpu_dry_run:
        print("gpu_mfu: no CUDA device here; this benchmark needs one GPU (skipped)")
        return 0

    import torch.distributed as dist

    from dayzero.runtime.config import ModelSection, TrainConfig
    from dayzero.runtime.train import build_state, train_step
    from dayzero.specs.counting import flops_per_token
    from dayzero.specs.hardware import get_accelerator
    from dayzero.specs.parallel import ParallelConfig

    parallel = ParallelConfig(seq=a.seq, mbs=a.mbs, gbs=a.gbs, recompute=a.recompute)
    cfg = TrainConfig(model=ModelSection(a.model, layers=a.layers, hidden=a.hidden, vocab=a.vocab), parallel=parallel,
                      steps=a.steps,
                      compute_dtype="fp32" if a.cpu_dry_run else "bf16", quiet=True)
    state = build_state(cfg)
    records = [train_step(state) for _ in range(a.steps)]
    steady = [r.step_time_s for r in records[a.warmup:]]
    step_s = statistics.median(steady)
    tokens = a.gbs * a.seq
    peak = get_accelerator(a.accelerator).peak("bf16")
    causal = flops_per_token(state.spec, a.seq, causal=True).train
    full = flops_per_token(state.spec, a.seq, causal=False).train
    res = {
        "device": "cpu (dry run)" if a.cpu_dry_run else torch.cuda.get_device_name(0), "torch": torch.__version__,
           "model": state.spec.name,
        "params": sum(p.numel() for p in state.model.parameters()), "layers": a.layers, "seq": a.seq,
        "mbs": a.mbs, "gbs": a.gbs, "recompute": a.recompute, "steps": a.steps, "warmup": a.warmup,
        "step_time_median_s": step_s, "tokens_per_s": tokens / step_s,
        "mfu_causal": tokens * causal / step_s / peak, "mfu_full_attention": tokens * full / step_s / peak,
        "peak_flops": peak, "peak_mem_bytes": max(r.peak_mem_bytes for r in records),
        "losses": [r.loss for r in records], "target_mfu": 0.40,
    }
    res["pass"] = res["mfu_causal"] >= 0.40
    print(json.dumps(res, indent=1))
    out = a.out or (os.path.join(os.environ["OUT"], "gpu_mfu.json") if os.environ.get("OUT") else None)
    if out:
        with open(out, "w") as f:
            json.dump(res, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
