"""The seed's claims (report/claims.py) against their formulas worked by hand."""

import pytest

from dayzero.report.claims import mixed_precision_claim, recompute_claim, weights_claim, zero_claim, zero_factors


def test_weights_3t_in_bf16_is_6_tb():
    c = weights_claim(70e9)
    assert c["computed"] == 6000 and c["claimed"] == 600 and c["holds"] is False
    assert "140 GB" in c["text"]  # this model: 70e9 x 2 B


def test_zero_factors_by_hand():
    """dp 64: stage 1 16 / (4 + 12/64) = 3.821; stage 2 16 / (2 + 14/64) = 7.211; stage 3 64."""
    f = zero_factors(64)
    assert f[1] == pytest.approx(16 / (4 + 12 / 64)) and f[2] == pytest.approx(16 / (2 + 14 / 64)) and f[3] == 64
    assert zero_claim(64, 1)["holds"] is True  # stage 2's 7.2x is "about 8x"
    assert zero_claim(2, 1)["holds"] is False  # at dp 2 no stage reaches 6x


def test_mixed_precision_on_states_only_grows_memory():
    """States only: BF16 mixed 18 B vs FP32 16 B a parameter: -12.5 %, not a cut of 50 %."""
    stage = {"weights": 2.0, "gradients": 4.0, "optimizer": 12.0, "activations": 0.0, "total": 18.0}
    c = mixed_precision_claim(stage)
    assert c["computed"] == pytest.approx(100 * (1 - 18 / 16)) and c["holds"] is False
    acts = {"weights": 0.0, "gradients": 0.0, "optimizer": 0.0, "activations": 10.0, "total": 10.0}
    assert mixed_precision_claim(acts)["computed"] == pytest.approx(50) and mixed_precision_claim(acts)["holds"]


def test_recompute():
    assert recompute_claim("none", 1.0, None)["computed"] == pytest.approx(100 / 3)
    c = recompute_claim("full", 1.32, 1.0)
    assert c["computed"] == pytest.approx(32) and c["holds"] is True
    assert recompute_claim("selective", 1.05, 1.0)["holds"] is False
