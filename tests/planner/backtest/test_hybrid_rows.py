"""Published Nemotron 3 rows are predicted (hybrid Mamba-2 / attention / MoE), not skipped.

The name table's Nemotron 3 Nano entry is its Hugging Face config; its published total of
31.6 B parameters (NVIDIA, Nemotron 3 Nano model card: "31.6B total parameters, approximately 3.2B
active (3.6B including embeddings)") is what dayzero counts. Super's entry (Megatron-Bridge's
Nemotron3SuperProvider) gives its published 120 B total / 12 B active ("120B-A12B").
"""

from __future__ import annotations

import numpy as np
import pytest

from dayzero.planner.backtest.backtest import predict_cases
from dayzero.planner.backtest.published import case_of, read_rows
from dayzero.planner.backtest.row_arch import model_of
from dayzero.specs.counting import params_active, params_total
from helpers.paths import data_file

CSV = data_file("published_runs_dev.csv")


@pytest.fixture(scope="module")
def rows():
    return {r["id"]: r for r in read_rows(CSV)}


def test_nemotron_3_nano_row_is_predicted(rows):
    row = rows["R0261"]  # Nemotron 3 Nano, 16 x H100, FP8, full recompute
    assert "Nano" in row["model"]
    case = case_of(row)
    spec = case.spec
    assert spec.layer_mixers.count("recurrent") == 23 and spec.layer_mixers.count("attention") == 6
    assert spec.layer_kinds.count("moe") == 23 and spec.recurrent.kind == "mamba2"
    assert params_total(spec) == pytest.approx(31.6e9, rel=0.002)
    assert params_active(spec) == pytest.approx(3.6e9, rel=0.01)
    predicted = float(predict_cases([case])[0])
    assert np.isfinite(predicted) and predicted > 0


def test_nemotron_3_super_is_latent_moe_with_stated_approximation(rows):
    arch = model_of(rows["R0269"])
    spec = arch.spec
    assert params_total(spec) == pytest.approx(120.7e9, rel=0.01) and params_active(spec) == pytest.approx(12.8e9,
                                                                                                             rel=0.01)
    assert spec.moe.latent_size == 1024 and spec.moe.top_k == 22 and spec.moe.experts == 512
    assert any("LatentMoE" in n for n in arch.notes) and any("MTP" in n for n in arch.notes)
    # activations of the routed rows in the latent: 1024 wide, the experts' own 2688 inside
    from dayzero.planner.memory.activations import expert_widths

    assert expert_widths(spec) == (1024, 2688)


def test_hybrid_row_refuses_context_parallelism(rows):
    row = {**rows["R0261"], "cp": "2", "dp": "8"}
    with pytest.raises(Exception) as e:
        case_of(row)
    assert "recurrent" in str(e.value)
