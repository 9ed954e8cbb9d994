"""Grouped expert GEMMs on an accelerator: ``GroupedExperts`` with the grouped kernel
(``torch.nn.functional.grouped_mm``) vs the per-expert Python loop, bf16, forward + backward.

    PYTHONPATH=src python benchmarks/gpu_grouped_experts.py [--out FILE]

Shapes: DeepSeek-V3-like experts scaled down (hidden 2048, expert intermediate 1408) and the
tiny-moe test proxy; 8..64 experts, skewed (Zipf-like) and even token counts. Reports ms per
forward+backward for both paths, the speedup and the largest output difference (the two paths
must agree to bf16 rounding). Without CUDA (or without grouped_mm) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _counts(tokens: int, experts: int, skew: bool) -> list[int]:
    if not skew:
        return [tokens // experts + (e < tokens % experts) for e in range(experts)]
    w = [1.0 / (e + 1) for e in range(experts)]
    raw = [int(tokens * x / sum(w)) for x in w]
    raw[0] += tokens - sum(raw)
    return raw


def bench(hidden: int, inter: int, experts: int, tokens: int, skew: bool, reps: int = 20) -> dict:
    import torch

    from dayzero.runtime.models.moe import GroupedExperts
    from dayzero.specs.model import MLPSpec

    torch.manual_seed(0)
    ex = GroupedExperts(experts, hidden, MLPSpec(intermediate=inter, activation="silu", gated=True)).cuda()
    with torch.no_grad():
        for p in ex.parameters():
            p.normal_(0, 0.02)
    ex = ex.to(torch.bfloat16)
    counts = _counts(tokens, experts, skew)
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = {}
    ys = {}
    for impl in ("loop", "grouped"):
        ex.impl = impl
        for _ in range(3):
            ex(x, counts).float().square().mean().backward()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(reps):
            ex(x, counts).float().square().mean().backward()
        torch.cuda.synchronize()
        out[f"{impl}_ms"] = (time.perf_counter() - t) / reps * 1e3
        with torch.no_grad():
            ys[impl] = ex(x, counts).float()
    out["speedup"] = out["loop_ms"] / out["grouped_ms"]
    out["max_abs_diff"] = float((ys["loop"] - ys["grouped"]).abs().max())
    out["max_abs_out"] = float(ys["loop"].abs().max())
    return {"hidden": hidden, "intermediate": inter, "experts": experts, "tokens": tokens, "skewed": skew, **out}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("gpu_grouped_experts: torch is not installed; skipped")
        return 0
    from dayzero.runtime.models.grouped_gemm import _grouped_mm, grouped_mm_supported

    if not torch.cuda.is_available():
        print("gpu_grouped_experts: no CUDA device; skipped")
        return 0
    if _grouped_mm() is None:
        print(f"gpu_grouped_experts: torch {torch.__version__} has no grouped_mm; skipped")
        return 0
    probe = torch.zeros(8, 64, device="cuda", dtype=torch.bfloat16)
    if not grouped_mm_supported(probe, torch.zeros(2, 64, 64, device="cuda", dtype=torch.bfloat16)):
        print(f"gpu_grouped_experts: {torch.cuda.get_device_name()} is below SM 8.0; grouped_mm unsupported; skipped")
        return 0
    rows = []
    for hidden, inter in ((2048, 1408), (256, 128)):
        for experts in (8, 64):
            for skew in (False, True):
                r = bench(hidden, inter, experts, 8192, skew)
                rows.append(r)
                print(f"H{hidden} I{inter} E{experts:3d} T{r['tokens']} {'zipf' if skew else 'even'}: loop "
                      f"{r['loop_ms']:.2f} ms, grouped {r['grouped_ms']:.2f} ms, x{r['speedup']:.2f}, max |diff| "
                      f"{r['max_abs_diff']:.3g} (max |y| {r['max_abs_out']:.3g})", flush=True)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
