"""``dayzero memory``: the seed scenario, the JSON contract, one-line errors, timeline and balancing."""

from __future__ import annotations

import json

from dayzero.cli.app import main

SEED = ["memory", "dense-3t", "--cluster", "ascend910b-8192", "--tp", "8", "--pp", "16", "--dp", "64", "--zero", "3",
        "--recompute", "full"]


def run(capsys, argv):
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_seed_scenario_table_shows_the_classic_arithmetic(capsys):
    rc, out, _ = run(capsys, SEED + ["--no-simulate"])
    assert rc == 0
    for text in ("6.00 TB", "23.98 TB", "11.99 TB", "18 B/param", "8.00x", "64.00x", "fits"):
        assert text in out, text


def test_seed_scenario_json_follows_the_contract(capsys):
    rc, out, _ = run(capsys, SEED + ["--json"])
    assert rc == 0
    d = json.loads(out)
    assert {"peak_bytes", "capacity_bytes", "utilization", "stages", "fits"} <= set(d)
    assert d["capacity_bytes"] == 64 * 2**30 and len(d["stages"]) == 16  # device "GB" are GiB (HBM_GB)
    for s in d["stages"]:
        assert s["total"] == sum(s[c] for c in ("weights", "gradients", "optimizer", "activations", "temporary",
                                                "overhead"))
    assert d["peak_bytes"] == max(s["total"] for s in d["stages"]) and d["fits"] is True
    assert d["stages"][0]["terms"]["weights:embedding"] > 0 and d["stages"][-1]["terms"]["temporary:logits"] > 0
    assert [r["zero"] for r in d["zero_comparison"]] == [0, 1, 2, 3]
    assert d["model_states"]["weights"] == 2 * d["model_states"]["params"]
    assert d["allocator"]["peak_reserved"] >= d["allocator"]["peak_allocated"] > 0


def test_bad_layouts_exit_2_with_one_line(capsys):
    rc, out, err = run(capsys, ["memory", "llama-3.1-8b", "--accelerator", "h100", "--devices", "8", "--tp", "3",
                                "--dp", "1"])
    assert rc == 2 and out == "" and err.count("\n") == 1 and "tp*cp*dp*pp" in err and "heads" in err
    rc, _, err = run(capsys, ["memory", "llama-3.1-8b", "--accelerator", "h100", "--devices", "8", "--grad-dtype",
                              "fp16"])
    assert rc == 2 and "--grad-dtype" in err


def test_timeline_png_and_balanced_split(capsys, tmp_path):
    png = tmp_path / "t.png"
    rc, out, _ = run(capsys, ["memory", "llama-3.1-8b", "--accelerator", "h100", "--devices", "8", "--pp", "4", "--dp",
                              "2",
                              "--gbs", "32", "--timeline", str(png), "--balance", "--json"])
    assert rc == 0 and png.read_bytes()[:4] == b"\x89PNG"
    d = json.loads(out)
    split = d["parallel"]["layer_split"]
    assert sum(split) == 32 and split[0] < split[-1]  # stage 0 holds the most micro-batches: fewer layers


def test_over_target_stage_is_flagged(capsys):
    rc, out, _ = run(capsys, ["memory", "llama-3.1-70b", "--accelerator", "h100", "--devices", "8", "--tp", "8",
                              "--zero", "1",
                              "--no-simulate", "--json"])
    d = json.loads(out)
    assert rc == 0 and d["fits"] is False and d["within_target"] is False and d["utilization"] > 1
