"""Multi-token prediction on the last pipeline stage (DeepSeek-V3 sec. 2.2): its layer split,
FLOPs, compute and memory, each against a hand-computed value."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dayzero.planner.backtest.published import train_mtp
from dayzero.planner.memory.memory import estimate_memory
from dayzero.planner.perf.perf import mtp_class, stage_work
from dayzero.specs.counting import attention_flops_per_token, layer_matmul_params, mtp_flops_per_token
from dayzero.specs.parallel import ParallelConfig, model_split
from dayzero.specs.registry import load_model

DSV3 = load_model("deepseek-v3")


def test_the_mtp_layer_takes_a_layer_slot_of_the_last_stage():
    """Megatron-Bridge's DeepSeek layouts end '...tmL' (the MTP layer is one more layer of the
    last stage): 61 layers + 1 MTP over 16 stages is the near-even split of 62, (3, 4 x 14, 3),
    with the MTP's slot taken off the last stage: (3, 4 x 14, 2)."""
    assert DSV3.mtp_layers == 1
    assert model_split(61, 16, 1) == (3,) + (4,) * 14 + (2,)
    assert model_split(61, 16, 0) == (3,) + (4,) * 13 + (3, 3)  # without MTP: the near-even split of 61
    assert ParallelConfig(pp=16, dp=2, ep=2).stage_layers(DSV3)[-1] == range(59, 61)


def test_mtp_flops_as_megatron_counts_them():
    """Megatron-LM num_floating_point_operations: per MTP module its decoder layer, the eh_proj
    2 H^2 and another pass through the head (logits x (mtp + 1)), x 3 for training. DeepSeek-V3
    (H 7168, V 129280): 3 (2 x 2 x 7168^2 + 2 x 129280 x 7168) = 3 (205,520,896 + 1,853,358,080)
    = 6,176,636,928 FLOPs per token beyond the layer."""
    layer = 2.0 * layer_matmul_params(DSV3, "moe") + attention_flops_per_token(DSV3, 4096, 60, True)
    assert mtp_flops_per_token(DSV3, 4096, True) - 3 * layer == pytest.approx(6_176_636_928)
    assert mtp_flops_per_token(replace(DSV3, mtp_layers=0), 4096, True) == 0.0


def test_the_last_stage_runs_the_mtp_layer_and_its_embedding_lookup():
    """stage_work with one MTP layer of class 1 on pp 4: the last rank runs one more layer of
    that class and an embedding lookup (share 1) besides its head; the others are unchanged."""
    cls = (0, 0, 1, 1, 1, 1, 1, 1)
    base, first0, last0 = stage_work(cls, 2, 4, 1, None, "1f1b", (0, 0))
    with_mtp, first1, last1 = stage_work(cls, 2, 4, 1, None, "1f1b", (1, 1))
    assert model_split(8, 4, 1) == (2, 3, 2, 1)  # even_split(9, 4) = (2, 3, 2, 2), the MTP's slot off the last
    assert with_mtp[3].tolist() == [0, 2] and base[3].tolist() == [0, 2]  # 1 layer + the MTP's vs 2 layers
    assert list(first1) == [1, 0, 0, 1] and list(last1) == list(last0) == [0, 0, 0, 1]
    assert mtp_class(DSV3) == (1, 1)  # the MoE class: layers 0-2 are dense


def test_the_last_stage_holds_the_mtp_layer_the_embedding_copy_and_a_second_logits():
    """With the same split, the last stage of DeepSeek-V3 (pp 4, ep 8) holds one more MoE layer's
    weights (its dense part and its 256/8 local experts), a copy of the embedding (V x H, tp 1)
    and twice the logits; the first stage is unchanged."""
    split = (15, 15, 16, 15)
    p = ParallelConfig(pp=4, dp=8, ep=8, gbs=64, seq=4096, layer_split=split)
    on = estimate_memory(DSV3, p, 80e9).stages
    off = estimate_memory(replace(DSV3, mtp_layers=0), p, 80e9).stages
    assert on[0].terms == pytest.approx(off[0].terms)
    moe_layer = (off[3].terms["weights:layers"] + off[3].terms["weights:experts"]) / 15  # 15 MoE layers there
    got = on[3].terms["weights:layers"] + on[3].terms["weights:experts"]
    assert got == pytest.approx(16 * moe_layer, rel=1e-9)
    assert on[3].terms["weights:embedding"] == pytest.approx(2 * 129280 * 7168)  # BF16, tp 1
    assert off[3].terms["weights:embedding"] == 0
    assert on[3].terms["temporary:logits"] == pytest.approx(2 * off[3].terms["temporary:logits"])


def test_the_backtest_trains_mtp_only_where_the_row_says_so():
    """Megatron-Bridge tags its DeepSeek-V3 rows 'w/ MTP' or 'w/o MTP'."""
    assert train_mtp(DSV3, "model variant tag 'w/ MTP'; MoE benchmark").mtp_layers == 1
    assert train_mtp(DSV3, "model variant tag 'w/o MTP'").mtp_layers == 0
    assert train_mtp(DSV3, "").mtp_layers == 0
    assert np.isfinite(mtp_flops_per_token(DSV3))
