"""FP8 scaling recipes and what they cost a GEMM.

* ``tensor``: one scale per tensor (Transformer Engine's delayed or current scaling): the
  planner's FP8 GEMM rate (calibration.Rates, fitted on published FP8 runs).
* ``block``: DeepSeek-V3's fine-grained recipe (arXiv 2412.19437 sec. 3.3.2): activations scaled
  per 1 x 128 tile, weights per 128 x 128 block, and on Hopper the tensor cores' partial sums
  promoted to FP32 on CUDA cores every 128 elements of K (4 WGMMAs), each with its scales. The
  promotion and the per-block scale loads cost tensor-core time that per-tensor scaling does not.

The price is measured, not derived: DeepGEMM (deepseek-ai/DeepGEMM, the kernels of this recipe;
README of the first release, 2025-02, "tested on H800 with NVCC 12.8") at its training-sized
shapes, M >= 4,096 rows per GEMM (``DEEPGEMM_H800``; the masked, decoding layout left out), over
the rate the planner gives a per-tensor FP8 GEMM of the same shape on an H800 (the catalog's median
MAMF ratio of the 1,978.9 TFLOP/s FP8 peak x gemm_scale_fp8 = 0.7747, x d / (d + gemm_half_dim)
with d the smallest dimension, x moe_gemm_scale for the grouped ones: :func:`measured_ratios`;
constants of 2026-12-03):

    normal GEMMs (M 4,096; the DeepSeek-V3 MLA, output and shared-expert shapes), measured /
    planner TFLOP/s: 1,058 / 1,507 = 0.702 (N 2,112, K 7,168), 990 / 1,498 = 0.661 (24,576 x
    1,536), 590 / 1,432 = 0.412 (32,768 x 512), 1,358 / 1,520 = 0.894 (7,168 x 16,384), 1,304 /
    1,520 = 0.858 (4,096 x 7,168), 1,025 / 1,506 = 0.680 (7,168 x 2,048): median 0.691
    grouped GEMMs, contiguous layout (the routed experts in training): 1.094, 0.935, 1.087, 0.930:
    median 1.011, taken as 1 (block scaling does not make a kernel faster than per-tensor scaling;
    the planner's grouped-GEMM constant already sits at DeepGEMM's measured level)

so the block recipe slows the dense GEMMs to 0.691 of per-tensor FP8 and leaves the routed
experts' GEMMs as they are. Later DeepGEMM releases (2025-04: "up to 1,550 TFLOPS on H800") close
much of the gap; DeepSeek-V3 was trained before either. On accelerators with block-scaled MMA in
hardware (Blackwell MXFP8, 1 x 32 blocks) there is no software promotion: use ``tensor`` there
(the backtest's MXFP8 rows are fitted so).
"""

from __future__ import annotations

import statistics

FP8_SCALINGS = ("tensor", "block")

# DeepGEMM README (2025-02), H800: (groups, M per group, N, K, TFLOP/s); groups 0: a normal GEMM
DEEPGEMM_H800 = (
    (0, 4096, 2112, 7168, 1058), (0, 4096, 24576, 1536, 990), (0, 4096, 32768, 512, 590),
    (0, 4096, 7168, 16384, 1358), (0, 4096, 4096, 7168, 1304), (0, 4096, 7168, 2048, 1025),
    (4, 8192, 4096, 7168, 1297), (4, 8192, 7168, 2048, 1099), (8, 4096, 4096, 7168, 1288),
    (8, 4096, 7168, 2048, 1093),
)
H800_FP8_PEAK = 1978.9e12  # dense FP8 FLOP/s (catalog nvidia_h800_sxm, as H100 SXM)

# measured_ratios() with the planner's constants of 2026-12-03 (test_fp8_scaling checks they agree)
BLOCK_DENSE_RATIO = 0.691  # block-scaled / per-tensor FP8 rate, dense GEMMs
BLOCK_GROUPED_RATIO = 1.0  # the same, grouped (routed-expert) GEMMs: min(1, measured median 1.011)


def measured_ratios(fp8_eff: float, half_dim: float, moe_gemm_scale: float) -> tuple[float, float]:
    """(dense, grouped) medians of DeepGEMM's measured rate over the planner's per-tensor rate
    ``H800_FP8_PEAK x fp8_eff x d / (d + half_dim)`` (x ``moe_gemm_scale`` for grouped GEMMs) at
    the same shapes."""
    dense, grouped = [], []
    for groups, m, n, k, tflops in DEEPGEMM_H800:
        d = min(m, n, k)
        planner = H800_FP8_PEAK * fp8_eff * d / (d + half_dim) * (moe_gemm_scale if groups else 1.0)
        (grouped if groups else dense).append(tflops * 1e12 / planner)
    return statistics.median(dense), statistics.median(grouped)
