"""Accelerators, clusters and parallel layouts."""

from __future__ import annotations

import pytest

from dayzero.errors import ConfigError, LayoutError
from dayzero.specs import layout_rules
from dayzero.specs.cluster import build_cluster, cluster_from_dict, get_cluster
from dayzero.specs.hardware import catalog, get_accelerator, resolve_accelerator
from dayzero.specs.parallel import ParallelConfig, even_split
from dayzero.specs.registry import load_model


@pytest.mark.parametrize("alias,acc_id", [
    ("a100-40gb", "nvidia_a100_40gb_sxm"), ("A100-80GB", "nvidia_a100_80gb_sxm"), ("h100", "nvidia_h100_sxm"),
    ("H800", "nvidia_h800_sxm"), ("h200", "nvidia_h200_sxm"), ("b200", "nvidia_b200_hgx"),
    ("gb200", "nvidia_gb200_per_gpu"), ("MI300X", "amd_mi300x"), ("910b", "huawei_ascend_910b"),
    ("tpu-v5p", "google_tpu_v5p"), ("tpu_v5p", "google_tpu_v5p"), ("nvidia_h100_sxm", "nvidia_h100_sxm"),
    ("NVIDIA H100 SXM5 80GB", "nvidia_h100_sxm"),
])
def test_accelerator_names(alias, acc_id):
    assert get_accelerator(alias).id == acc_id


@pytest.mark.parametrize("text,acc_id", [
    ("H100 80GB SXM5 (DGX H100)", "nvidia_h100_sxm"), ("GB200 (DGX-GB200)", "nvidia_gb200_per_gpu"),
    ("A100 40GB", "nvidia_a100_40gb_sxm"), ("A100 80GB", "nvidia_a100_80gb_sxm"), ("B200 (DGX-B200)",
                                                                                   "nvidia_b200_hgx"),
])
def test_free_text_accelerators(text, acc_id):
    assert resolve_accelerator(text).id == acc_id


def test_catalog_units():
    h100 = catalog()["nvidia_h100_sxm"]
    assert h100.peak("bf16") == pytest.approx(989.4e12)
    assert h100.hbm_bytes == 80 * 2**30 and h100.inter_node_bw == pytest.approx(50e9)  # HBM "GB" are GiB
    assert h100.gemm_efficiency("bf16") == pytest.approx(794.5 / 989.4)
    assert get_accelerator("910b").peak("bf16") == 313e12  # fp16 stand-in, recorded as an assumption
    assert get_accelerator("910b").assumptions


def test_cluster_tiers_and_spans():
    c = get_cluster("ascend910b-8192")
    assert c.devices == 8192 and c.tiers[0].topology == "mesh" and c.tiers[0].p2p_bw == 56e9
    assert c.tier_for_span(8).name == "scale-up" and c.tier_for_span(16).name == "scale-out"
    nvl = get_cluster("gb200-nvl72-1152")
    assert nvl.tier_for_span(72).name == "scale-up" and nvl.tier_for_span(144).name == "scale-out"


def test_build_cluster_from_accelerator():
    c = build_cluster("h100", 64)
    assert (c.nodes, c.devices_per_node) == (8, 8)
    assert build_cluster("h100", 4).devices_per_node == 4
    with pytest.raises(ConfigError, match="whole number"):
        build_cluster("h100", 12)
    overridden = cluster_from_dict({"accelerator": "h100", "nodes": 2, "peak_tflops": {"bf16": 500},
                                    "efficiency": {"gemm": 0.7}}, "test")
    assert overridden.accelerator.peak("bf16") == 500e12 and overridden.efficiency["gemm"] == 0.7


def test_parallel_validation_messages():
    spec = load_model("tiny-moe")  # 8 heads, 8 experts, 4 layers
    layout_rules.validate(ParallelConfig(tp=2, pp=2, dp=2, ep=2), spec, devices=8)
    with pytest.raises(LayoutError, match=r"must equal the 16 devices"):
        layout_rules.validate(ParallelConfig(tp=2, pp=2, dp=2), spec, devices=16)
    with pytest.raises(LayoutError, match=r"heads \(8\) must be divisible by tp \(3\)"):
        layout_rules.validate(ParallelConfig(tp=3), spec)
    with pytest.raises(LayoutError, match=r"experts \(8\) must be divisible by ep \(3\)"):
        layout_rules.validate(ParallelConfig(dp=3, ep=3), spec)
    with pytest.raises(LayoutError, match=r"layers \(4\) must be divisible by pp\*vpp"):
        layout_rules.validate(ParallelConfig(pp=3), spec)
    with pytest.raises(LayoutError, match=r"gbs 6 must be divisible by mbs\*dp"):
        layout_rules.validate(ParallelConfig(dp=4, gbs=6), spec)
    layout_rules.validate(ParallelConfig(pp=3, layer_split=(1, 2, 1)), spec)


def test_layer_assignment_interleaved():
    spec = load_model("tiny-llama")
    p = ParallelConfig(pp=2, vpp=2, gbs=4)
    assert p.schedule == "interleaved"
    assert [list(r) for r in p.stage_layers(spec)] == [[0], [1], [2], [3]]
    assert p.rank_layers(spec) == [[0, 2], [1, 3]]
    assert even_split(10, 4) == (2, 3, 3, 2)
    assert p.edp == 1 and ParallelConfig(tp=2, dp=4, ep=4).edp == 2
