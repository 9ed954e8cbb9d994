"""The host side of a cluster (specs/host.py): each preset's figures are its system's cited ones, a
cluster file overrides any of them, a bad one is one ConfigError, and where no document states a
figure it is the DGX H100's and plan/predict say so."""

from __future__ import annotations

import pytest

from dayzero.errors import ConfigError
from dayzero.planner.memory.offload import offloaded_optimizer_s
from dayzero.planner.perf.perf import PerfOptions, evaluate
from dayzero.specs.cluster import build_cluster, cluster_from_dict, get_cluster
from dayzero.specs.grid import encode
from dayzero.specs.host import FALLBACK, PCIE_GEN4_X16_BW, PCIE_GEN5_X16_BW, default_host
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model

GEN5 = 32e9 * 16 * 128 / 130 / 8  # 63.015 GB/s a direction (PCI-SIG PCIe 5.0: 32 GT/s, 128b/130b)
GEN4 = 16e9 * 16 * 128 / 130 / 8  # 31.508 GB/s (PCIe 4.0: 16 GT/s)

# preset -> (host memory per device, host link per direction, host DRAM bandwidth per device), each
# from the system's documents (presets/data/host_systems.json):
PRESETS = {
    # DGX H100 user guide: 2 TB for 8 GPUs; 2 x Xeon 8480C x 8 DDR5-4800 channels x 8 B over 8 GPUs; PCIe Gen5 x16
    "dgx-h100-1024": (2000e9 / 8, GEN5, 2 * 8 * 4800e6 * 8 / 8),
    "dgx-h100-16384": (250e9, GEN5, 76.8e9),
    # DGX A100 (640 GB): 2 TB; 2 x EPYC 7742 x 8 DDR4-3200 channels; PCIe Gen4 x16
    "dgx-a100-3072": (2000e9 / 8, GEN4, 2 * 8 * 3200e6 * 8 / 8),
    # Atlas 800T A2: 32 x 64 GB DDR4 for 8 NPUs; 4 Kunpeng 920 x 8 channels x 3200 MT/s x 8 B; PCIe 4.0 x16 per NPU
    "ascend910b-8192": (32 * 64e9 / 8, GEN4, 4 * 8 * 3200e6 * 8 / 8),
    # GB200 superchip: one Grace (480 GB LPDDR5X, ~500 GB/s) for 2 GPUs; NVLink-C2C 900 GB/s bidirectional,
    # 450 a direction shared by the two
    "gb200-nvl72-1152": (480e9 / 2, 900e9 / 2 / 2, 500e9 / 2),
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_presets_host_is_its_systems_cited_figures(name):
    host = get_cluster(name).host
    memory, link, dram = PRESETS[name]
    assert host.memory_bytes == pytest.approx(memory, rel=1e-12)
    assert host.link_bw == pytest.approx(link, rel=1e-12)
    assert host.memory_bw == pytest.approx(dram, rel=1e-12)
    assert host.assumed == () and host.system and host.sources


def test_the_figures_behind_the_presets():
    assert PCIE_GEN5_X16_BW == GEN5 == pytest.approx(63.015e9, rel=1e-4)
    assert PCIE_GEN4_X16_BW == GEN4 == pytest.approx(31.508e9, rel=1e-4)
    assert get_cluster("ascend910b-8192").host.memory_bw == 102.4e9
    assert get_cluster("dgx-a100-3072").host.memory_bw == 51.2e9
    # DGX B200: 2 TB, 2 x Xeon 8570 (8 DDR5-5600 channels each), PCIe Gen5
    b200 = build_cluster("b200", 8).host
    assert (b200.memory_bytes, b200.link_bw, b200.memory_bw) == (250e9, GEN5, 89.6e9)
    # the DGX H100 figures are the fallback, and the H100 preset's figures are the same numbers
    h100 = get_cluster("dgx-h100-1024").host
    assert (h100.memory_bytes, h100.link_bw, h100.memory_bw) == (FALLBACK.memory_bytes, FALLBACK.link_bw,
                                                                 FALLBACK.memory_bw)


def test_an_undocumented_figure_is_the_dgx_h100s_and_named():
    """AMD documents the MI300X's PCIe Gen5 x16 host link, not the OEM server's memory: those two
    are the DGX H100's and named; a card with no documented system has all three assumed."""
    mi300x = build_cluster("mi300x", 8).host
    assert mi300x.link_bw == GEN5 and mi300x.assumed == ("memory_bytes", "memory_bw")
    line = mi300x.assumption()
    assert line.startswith("host side assumed as a DGX H100's: host memory 250 GB, host DRAM bandwidth 76.8 GB/s")
    assert "AMD Instinct MI300X platform documents no such figure" in line and "\n" not in line
    tpu = build_cluster("tpu-v5p", 8).host
    assert tpu.assumed == ("memory_bytes", "link_bw", "memory_bw") and tpu == FALLBACK
    assert "no host is documented" in tpu.assumption()
    assert default_host("nvidia_h100_sxm").assumption() is None


def test_a_cluster_file_overrides_every_host_figure():
    c = cluster_from_dict({"accelerator": "mi300x", "nodes": 2, "host": {
        "memory_gb_per_node": 3072, "link_gbytes_per_s": 50, "memory_gbytes_per_s": 90}}, "mine.yaml")
    assert c.host.memory_bytes == 3072e9 / 8 and c.host.link_bw == 50e9 and c.host.memory_bw == 90e9
    assert c.host.assumed == () and c.host.assumption() is None
    assert c.summary()["host"]["memory_gb_per_device"] == 384
    one = cluster_from_dict({"accelerator": "tpu-v5p", "nodes": 1, "host": {"memory_gb": 100}}, "one.yaml")
    assert one.host.memory_bytes == 100e9 and one.host.assumed == ("link_bw", "memory_bw")
    assert one.host.given == ("memory_bytes",) and "(no host is documented for this card" in one.host.assumption()


@pytest.mark.parametrize("host, field", [
    ({"memory_gb": -1}, "host.memory_gb"),
    ({"link_gbytes_per_s": 0}, "host.link_gbytes_per_s"),
    ({"memory_gbytes_per_s": "fast"}, "host.memory_gbytes_per_s"),
    ({"pcie": 5}, "host.pcie"),
    ({"memory_gb": 250, "memory_gb_per_node": 2000}, "host"),
])
def test_a_bad_host_figure_is_one_config_error(host, field):
    with pytest.raises(ConfigError) as e:
        cluster_from_dict({"accelerator": "h100", "nodes": 1, "host": host}, "bad.yaml")
    assert e.value.field == field and "\n" not in str(e.value)


def test_the_offloaded_optimizer_runs_at_the_clusters_host():
    """Llama 3.1 8B, ZeRO-1 over dp 8 (a shard of 1,003,782,656 parameters, test_optimizer_offload.py):
    on 8 Atlas 800T A2 NPUs the host Adam's 28 B/param run over 102.4 GB/s and the 6 B/param copies
    over PCIe 4.0 x16, 0.27446 + 0.19115 = 0.46561 s; a cluster file halving the host link doubles
    the copies' part."""
    spec = load_model("llama-3.1-8b")
    p = ParallelConfig(tp=1, pp=1, dp=8, mbs=1, gbs=8, seq=4096, zero=1, optimizer_offload=True)
    shard = 8_030_261_248 / 8
    want = shard * 28 / 102.4e9 + shard * 6 / GEN4
    assert want == pytest.approx(0.46561, rel=1e-4)
    npu = build_cluster("910b", 8)
    assert float(evaluate(spec, encode([p]), npu, PerfOptions()).optimizer_s[0]) == pytest.approx(want, rel=1e-6)
    slow = cluster_from_dict({"accelerator": "910b", "nodes": 1, "host": {"link_gbytes_per_s": GEN4 / 2e9}}, "slow")
    got = float(evaluate(spec, encode([p]), slow, PerfOptions()).optimizer_s[0])
    assert got - want == pytest.approx(shard * 6 / GEN4, rel=1e-6)
    assert float(offloaded_optimizer_s(shard, 4, GEN4, 102.4e9)) == pytest.approx(want, rel=1e-12)


def test_predict_and_plan_name_an_assumed_host():
    """predict states the host share an offloading layout is held to and, where it is the
    fallback, the one-line assumption; plan states the cluster's host and its assumption."""
    from dayzero.planner.predict import predict
    from dayzero.planner.search.search import SearchSpace, plan

    spec = load_model("tiny-llama")
    p = ParallelConfig(tp=1, pp=1, dp=8, mbs=1, gbs=8, seq=4096, zero=1, optimizer_offload=True)
    mine = predict(spec, p, build_cluster("tpu-v5p", 8))["memory"]
    assert mine["host_limit_bytes"] == 250e9 and mine["host_assumed"] == ["memory_bytes", "link_bw", "memory_bw"]
    assert mine["host_assumption"].startswith("host side assumed as a DGX H100's")
    dgx = predict(spec, p, build_cluster("h100", 8))["memory"]
    assert dgx["host_system"] == "DGX H100 / DGX H200" and "host_assumption" not in dgx
    npu = predict(spec, p, build_cluster("910b", 8))["memory"]
    assert npu["host_limit_bytes"] == 256e9 and npu["host_fits"]
    space = SearchSpace(tp=(1,), pp=(1,), cp=(1,), mbs=(1,), zero=(1,))
    assumed = plan(spec, build_cluster("mi300x", 8), 8, 4096, top_k=1, space=space)["host"]
    assert assumed["assumed"] == ["memory_bytes", "memory_bw"] and "DGX H100" in assumed["assumption"]
    assert "assumption" not in plan(spec, build_cluster("h100", 8), 8, 4096, top_k=1, space=space)["host"]
