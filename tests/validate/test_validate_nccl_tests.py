"""Importing nccl-tests output into a profile."""

import pytest
import yaml

from dayzero.errors import ConfigError
from dayzero.planner.perf.collectives import Link
from dayzero.specs.cluster import cluster_from_dict
from dayzero.validate.nccl_tests import import_runs, parse
from dayzero.validate.profile import collective_time

HEADER = """# nThread 1 nGpus 1 minBytes 1048576 maxBytes 1073741824 step: 4(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
{ranks}#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
"""


def output(kind: str, link: Link, hosts=("node1",), per_host=8, old=False, intra: Link | None = None):
    n = per_host * len(hosts)
    ranks = "".join(f"#  Rank {r:2d} Group  0 Pid {1000 + r:6d} on {hosts[r // per_host]:>10} device {r % per_host:2d} "
                    f"[0x{r:02x}] NVIDIA H100 80GB HBM3\n" for r in range(n))
    text = f"# Collective test starting: {kind}_perf\n" + HEADER.format(ranks=ranks)
    planner_kind = {"alltoall": "all_to_all", "sendrecv": "send_recv"}.get(kind, kind)
    for size in (2**20, 2**22, 2**24, 2**26, 2**28, 2**30):
        if planner_kind == "send_recv":
            t = link.alpha + size / link.p2p_bw
        elif intra is None:
            t = float(collective_time(planner_kind, size, n, link))
        else:
            t = float(collective_time(planner_kind, size, n, link, per_host, intra))
        us = t * 1e6
        algbw = size / t / 1e9
        cols = f"{size:12d} {size // 4:13d}     float     sum" + ("" if old else "      -1")
        text += f"{cols} {us:8.1f} {algbw:7.2f} {algbw:7.2f}      0 {us:8.1f} {algbw:7.2f} {algbw:7.2f}      0\n"
    return text + "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 100\n"


def test_parse_new_and_old_formats():
    link = Link(360e9, 360e9, 8e-6)
    for old in (False, True):
        run = parse(output("all_reduce", link, old=old))
        assert run.collective == "all_reduce" and run.ranks == 8 and run.hosts == ("node1",)
        assert "H100" in run.device and len(run.rows) == 6
        assert run.rows[0]["group"] == 8 and run.rows[0]["bytes"] == 2**20


def test_collective_from_file_name_and_errors():
    link = Link(360e9, 360e9, 8e-6)
    text = output("all_gather", link).split("\n", 1)[1]  # drop the banner
    assert parse(text, "all_gather_perf.log").collective == "all_gather"
    with pytest.raises(ConfigError, match="which test"):
        parse(text, "results.txt")
    with pytest.raises(ConfigError, match="Rank"):
        parse("# nothing here\n", "all_reduce_perf.txt")


def test_single_node_import_recovers_the_link(tmp_path):
    link = Link(370e9, 370e9, 9e-6)
    files = []
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv"):
        p = tmp_path / f"{kind}_perf.txt"
        p.write_text(output(kind, link))
        files.append(p)
    prof = import_runs(files)
    assert prof["accelerator"] == "nvidia_h100_sxm" and prof["nodes"] == 1 and prof["devices_per_node"] == 8
    assert prof["intra_node_gbytes_per_s"] == pytest.approx(370, rel=0.03)
    assert prof["intra_latency_us"] == pytest.approx(9, rel=0.1)
    assert prof["efficiency"]["intra"] == 1.0
    cl = cluster_from_dict(yaml.safe_load(yaml.safe_dump(prof)), "imported")
    assert cl.tiers[0].bw == pytest.approx(370e9, rel=0.03)


def test_multi_node_import_fits_the_scale_out_tier(tmp_path):
    from dayzero.planner.perf.calibration import constants_for, rates
    from dayzero.specs.cluster import build_cluster

    ref = build_cluster("h100", 16, 8)
    intra = rates(ref, constants_for(ref)).intra
    nic = Link(42e9, 42e9, 25e-6)
    p = tmp_path / "all_reduce_perf.txt"
    p.write_text(output("all_reduce", nic, hosts=("a", "b"), intra=intra))
    prof = import_runs([p])
    assert prof["nodes"] == 2 and prof["measurements"]["nccl_tests"]["tier"] == "scale-out"
    assert prof["inter_node_gbytes_per_s"] == pytest.approx(42, rel=0.05)
