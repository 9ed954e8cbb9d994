"""Profiles: fits with the planner's own formulas, inline accelerators, the runtime-dtype view."""

import pytest

from dayzero.errors import ConfigError
from dayzero.planner.memory.memory_options import MemoryOptions
from dayzero.planner.perf.calibration import constants_for, rates
from dayzero.planner.perf.collectives import Link
from dayzero.runtime.planner_view import memory_options
from dayzero.specs.cluster import cluster_from_dict, get_cluster
from dayzero.validate.predicted import compute_view
from dayzero.validate.profile import build_profile, fit_gemm, fit_link, write_profile
from helpers.measurements import coll_rows, gemm_rows, measurements


def test_fit_gemm_recovers_rate_and_half_dim():
    f = fit_gemm(gemm_rows("fp32", 20e9, 40), "fp32")
    assert f.peak_flops == pytest.approx(20e9, rel=0.01) and f.half_dim == pytest.approx(40, rel=0.03)
    assert f.mape < 0.01
    with pytest.raises(ConfigError):
        fit_gemm([], "bf16")


def test_fit_link_recovers_bandwidth_latency_and_p2p():
    link = Link(0.5e9, 0.8e9, 400e-6)
    f = fit_link(coll_rows(link))
    assert f.bw == pytest.approx(0.5e9, rel=0.02) and f.alpha == pytest.approx(400e-6, rel=0.05)
    assert f.p2p_bw == pytest.approx(0.8e9, rel=0.05)
    assert max(f.mape.values()) < 0.05


def test_cpu_profile_is_a_cluster_the_planner_uses(tmp_path):
    prof = build_profile(measurements())
    path = write_profile(prof, tmp_path / "host.yaml")
    cl = get_cluster(str(path))
    acc = cl.accelerator
    assert cl.devices == 8 and acc.id == "cpu-host"
    assert acc.peak("bf16") == pytest.approx(35e9, rel=0.02)
    assert acc.hbm_bw == pytest.approx(3e9)
    assert acc.hbm_bytes == pytest.approx(3e9, rel=1e-3)  # 24 GB shared by 8 ranks
    r = rates(cl, constants_for(cl))
    assert r.gemm_eff["bf16"] == 1.0 and r.intra.bw == pytest.approx(0.5e9, rel=0.02)
    assert constants_for(cl).gemm_half_dim == pytest.approx(90, rel=0.05)
    # attention: 3.5 x forward FLOPs / forward+backward seconds, over the bf16 peak
    assert r.attention_flops == pytest.approx(1e10, rel=0.02)
    opts = MemoryOptions.for_accelerator(acc)
    assert opts.runtime_context_bytes == 300 * 2**20 and opts.comm_buffer_bytes == 2**20


def test_gpu_profile_keeps_the_catalog_peak():
    from dayzero.specs.hardware import get_accelerator

    h100 = get_accelerator("h100")
    prof = build_profile(measurements("cuda"), catalog_accelerator=h100)
    cl = cluster_from_dict(prof, "gpu")
    assert cl.accelerator.peak("bf16") == h100.peak("bf16")
    assert prof["efficiency"]["gemm_bf16"] == pytest.approx(35e9 / h100.peak("bf16"), rel=0.02)
    assert cl.tiers[0].bw == pytest.approx(0.5e9, rel=0.02)


def test_fp32_view_halves_bandwidths_and_uses_fp32_rates():
    cl = cluster_from_dict(build_profile(measurements()), "host")
    v = compute_view(cl, "fp32")
    assert v.accelerator.peak("bf16") == pytest.approx(20e9, rel=0.02)
    assert v.accelerator.hbm_bw == pytest.approx(cl.accelerator.hbm_bw / 2)
    assert v.tiers[0].bw == pytest.approx(cl.tiers[0].bw / 2) and v.tiers[0].latency_s == cl.tiers[0].latency_s
    c = constants_for(v)
    assert c.gemm_half_dim == pytest.approx(40, rel=0.05) and c.optimizer_bytes_per_param == 14
    assert constants_for(compute_view(cl, "bf16")).optimizer_bytes_per_param == 28
    m = memory_options(cl, "fp32")
    assert (m.param_bytes, m.master_bytes, m.grad_bytes, m.act_bytes) == (4, 4, 4, 4)
    with pytest.raises(ConfigError):
        compute_view(cl, "fp8")


def test_inline_accelerator_errors_are_one_line():
    base = {"nodes": 1, "accelerator": {"id": "x", "peak_tflops": {"fp32": 1.0}, "hbm_gb": 1, "hbm_tbytes_per_s": 0.01,
                                        "intra_node_gbytes_per_s": 1}}
    with pytest.raises(ConfigError, match="bf16"):
        cluster_from_dict(base, "p.yaml")
    bad = {**base, "accelerator": {**base["accelerator"], "peak_tflops": {"bf16": 1}, "hbm_gb": -1}}
    with pytest.raises(ConfigError, match="accelerator.hbm_gb") as e:
        cluster_from_dict(bad, "p.yaml")
    assert "\n" not in str(e.value)
    # catalog names keep working
    assert cluster_from_dict({"accelerator": "h100", "nodes": 1}, "c").accelerator.id == "nvidia_h100_sxm"
