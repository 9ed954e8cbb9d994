"""One validation layer for every input: numbers finite and in their physical range, files read
as UTF-8 with a clear error, absurd sizes refused at once. Each case is one line on stderr and
exit 2 — never a traceback, a hang or a silent NaN."""

from __future__ import annotations

import json
import time

import pytest

from dayzero.cli.app import main
from dayzero.specs import layout_rules
from dayzero.specs.registry import model_presets


def config(**changes) -> dict:
    c = {k: v for k, v in model_presets()["tiny-llama"].items() if not k.startswith("_")}
    c.update(changes)
    return c


def write_rows(path, rows: list[dict]):
    """A published-runs CSV of ``rows`` (the shipped file's columns)."""
    import csv

    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def one_line_error(argv, capsys, needle: str = "") -> str:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("dayzero: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert needle in err, err
    return err


@pytest.mark.parametrize("key,value,needle", [
    ("rope_theta", -10000.0, "rope_theta"), ("rms_norm_eps", -1e-6, "rms_norm_eps"), ("rms_norm_eps", 0,
                                                                                      "rms_norm_eps"),
    ("num_hidden_layers", 1e9, "num_hidden_layers"), ("hidden_size", 2**40, "hidden_size"),
    ("vocab_size", -5, "vocab_size"), ("num_attention_heads", 0, "num_attention_heads"),
])
def test_model_config_values_out_of_range(tmp_path, capsys, key, value, needle):
    f = tmp_path / "config.json"
    f.write_text(json.dumps(config(**{key: value})))
    t = time.perf_counter()
    one_line_error(["inspect", f], capsys, needle)
    assert time.perf_counter() - t < 5  # refused at once, not after building a billion layers


def test_a_model_beyond_the_largest_size_is_refused(tmp_path, capsys):
    f = tmp_path / "config.json"
    f.write_text(json.dumps(config(hidden_size=2**22, intermediate_size=2**24, num_hidden_layers=10_000,
                                   num_attention_heads=4096, num_key_value_heads=4096)))
    one_line_error(["inspect", f], capsys, "parameters exceeds")


@pytest.mark.parametrize("content,needle", [
    (b'{"model_type": "llama", "x": "\xe9\xff"}', "not UTF-8"),
    (b"[" * 50_000 + b"]" * 50_000, "nested too deeply"),
    (b'{"model_type": "llama", "hidden_size": ' + b"9" * 5000 + b"}", "thousands of digits"),
])
def test_malformed_files_of_every_kind(tmp_path, capsys, content, needle):
    for name, argv in (("config.json", ["inspect", "{f}"]), ("cluster.yaml", ["predict", "tiny-llama", "--cluster",
                                                                              "{f}"]),
                       ("cal.json", ["predict", "tiny-llama", "-a", "h100", "-n", "8", "--calibration", "{f}"]),
                       ("runs.csv", ["backtest", "{f}"])):
        f = tmp_path / name
        f.write_bytes(content)
        err = one_line_error([a.format(f=f) for a in argv], capsys)
        if not (name == "runs.csv" and needle != "not UTF-8"):  # a CSV is not parsed as JSON
            assert needle in err, (name, err)


def test_a_directory_where_a_file_is_expected(tmp_path, capsys):
    d = tmp_path / "dir.yaml"
    d.mkdir()
    one_line_error(["predict", "tiny-llama", "--cluster", d], capsys, "is a directory")
    one_line_error(["backtest", d], capsys, "is a directory")


@pytest.mark.parametrize("argv,needle", [
    (["train", "tiny-llama", "--lr", "inf", "--steps", "1"], "--lr"),
    (["train", "tiny-llama", "--lr", "nan", "--steps", "1"], "--lr"),
    (["train", "tiny-llama", "--grad-clip", "-1", "--steps", "1"], "--grad-clip"),
    (["predict", "tiny-llama", "-a", "h100", "-n", "8", "--gbs", "-8"], "--gbs"),
    (["predict", "tiny-llama", "-a", "h100", "-n", "8", "--seq", "-128"], "--seq"),
    (["predict", "tiny-llama", "-a", "h100", "-n", "64", "--inter-node-gbps", "0"], "--inter-node-gbps"),
    (["predict", "tiny-llama", "-a", "h100", "-n", "64", "--devices-per-node", "0"], "--devices-per-node"),
    (["predict", "tiny-llama", "-a", "h100", "-n", "99999999"], "--devices"),
])
def test_flags_out_of_range(capsys, argv, needle):
    one_line_error(argv, capsys, needle)


@pytest.mark.parametrize("efficiency,needle", [
    ({"gemm": -0.5}, "efficiency.gemm"), ({"gemm": 50}, "efficiency.gemm"), ({"intra": 0}, "intra"),
    ({"layer_overhead_s": -1}, "layer_overhead_s"), ({"memory_scale": float("nan")}, "memory_scale"),
])
def test_cluster_efficiencies_outside_their_physical_range(tmp_path, capsys, efficiency, needle):
    import yaml

    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({"accelerator": "h100", "nodes": 1, "efficiency": efficiency}))
    one_line_error(["predict", "tiny-llama", "--cluster", f, "--dp", "8"], capsys, needle)


@pytest.mark.parametrize("field,value", [("peak_tflops", {"bf16": -989}), ("peak_tflops", {"bf16": ".nan"}),
                                         ("hbm_gb", ".inf"), ("nodes", 10**9)])
def test_cluster_numbers_outside_their_physical_range(tmp_path, capsys, field, value):
    f = tmp_path / "c.yaml"
    body = {"accelerator": "h100", "nodes": 1, field: value}
    text = json.dumps(body).replace('".nan"', ".nan").replace('".inf"', ".inf")  # YAML's float spellings
    f.write_text(text)
    one_line_error(["predict", "tiny-llama", "--cluster", f], capsys, field)


def test_calibration_constants_outside_their_range(tmp_path, capsys):
    f = tmp_path / "cal.json"
    f.write_text(json.dumps({"gemm_scale_bf16": 50.0}))
    one_line_error(["predict", "tiny-llama", "-a", "h100", "-n", "8", "--calibration", f], capsys, "gemm_scale_bf16")


@pytest.mark.parametrize("argv,needle", [
    (["predict", "tiny-llama", "-a", "a100", "-n", "8", "--dp", "8", "--precision", "fp8"], "no FP8 units"),
    (["plan", "llama-3.1-8b", "-a", "h100", "-n", "8", "--precision", "fp4"], "no FP4 units"),
    (["train", "tiny-llama", "--experts", "4", "--steps", "1"], "dense model"),
    (["validate", "tiny-llama", "--experts", "4", "--cluster", "ascend910b-8192"], "dense model"),
])
def test_inputs_that_would_be_silently_reinterpreted(capsys, argv, needle):
    one_line_error(argv, capsys, needle)


def test_a_published_row_with_an_impossible_layout_is_skipped_not_predicted(tmp_path):
    from dayzero.planner.backtest.backtest import run_backtest
    from dayzero.planner.backtest.published import read_rows

    rows = [dict(r) for r in read_rows() if r["id"] in ("R0132", "R0555")]  # rows the backtest predicts
    rows[0]["tp"] = "-2"
    rows[1]["tp"] = "0"
    result = run_backtest(write_rows(tmp_path / "runs.csv", rows))
    assert result["summary"]["n"] == 0
    assert sorted(s["reason"] for s in result["skipped"]) == ["tp '-2' is not a positive whole number",
                                                              "tp '0' is not a positive whole number"]


# -- found by the fuzz suite (tests/cli/test_fuzz.py, DAYZERO_FUZZ_EXAMPLES=1000) --------------------

def test_fuzz_finding_absurd_cluster_figures(tmp_path, capsys):
    """1e300 GB/s and MiB were finite, so accepted, and overflowed int conversion in the memory model."""
    f = tmp_path / "c.yaml"
    f.write_text("accelerator: h100\nnodes: 2\ncomm_buffer_mib: 1.0e+300\nintra_node_p2p_gbytes_per_s: 1.0e+300\n")
    one_line_error(["predict", "llama-3.1-8b", "--cluster", f], capsys, "less than or equal")
    f.write_text("accelerator: h100\nnodes: 1000000\ndevices_per_node: 1000\n")
    one_line_error(["predict", "llama-3.1-8b", "--cluster", f], capsys, "exceeds")


def test_fuzz_finding_zero_pipeline_degree(capsys):
    """--pp 0 divided by zero in the near-even split before validation."""
    one_line_error(["predict", "tiny-moe", "-a", "h100", "-n", "64", "--dp", "2", "--pp", "0"], capsys, "--pp")
    from dayzero.planner.predict import with_even_split
    from dayzero.specs.parallel import ParallelConfig
    from dayzero.specs.registry import load_model

    p = ParallelConfig(pp=0)
    assert with_even_split(load_model("tiny-moe"), p) is p and layout_rules.problems(p)


def test_fuzz_finding_a_batch_beyond_int64(tmp_path):
    """A published gbs of 21 nines overflowed the grid's int64 encoding; now the row is skipped."""
    from dayzero.planner.backtest.backtest import run_backtest
    from dayzero.planner.backtest.published import read_rows

    rows = [dict(r) for r in read_rows() if r["id"] == "R0132"]
    rows[0]["gbs"] = "999999999999999999999"
    result = run_backtest(write_rows(tmp_path / "runs.csv", rows))
    reason = result["skipped"][0]["reason"]
    assert result["summary"]["n"] == 0 and reason.startswith("gbs ") and "at most 2^53" in reason


def test_fuzz_finding_a_device_memory_that_rounds_to_zero(tmp_path, capsys):
    """hbm_gb 1e-300 was positive, so accepted: zero bytes of memory, infinite utilisation."""
    f = tmp_path / "c.yaml"
    f.write_text("accelerator: h100\nnodes: 1\nhbm_gb: 1.0e-300\n")
    one_line_error(["predict", "llama-3.1-8b", "--cluster", f], capsys, "hbm_gb")


def test_fuzz_finding_an_inter_node_bandwidth_beyond_the_bound(capsys):
    """--inter-node-gbps 1e21 reached the cluster model's own bound as a pydantic traceback."""
    one_line_error(["memory", "tiny-moe", "-a", "h100", "-n", "16", "--inter-node-gbps", "1e21"], capsys,
                   "--inter-node-gbps")


def test_fuzz_finding_a_row_with_absurd_layers(tmp_path):
    """A row whose layers column is 21 digits built a 1e21-long layer tuple: now it is skipped."""
    from dayzero.planner.backtest.backtest import run_backtest
    from dayzero.planner.backtest.published import read_rows

    rows = [dict(r) for r in read_rows() if r["id"] == "R0132"]
    rows[0].update(model="Unheard-of Model", layers="999999999999999999999")
    result = run_backtest(write_rows(tmp_path / "runs.csv", rows))
    reason = result["skipped"][0]["reason"]
    assert result["summary"]["n"] == 0 and reason.startswith("layers ") and "at most 2^53" in reason


def test_a_vocabulary_table_may_exceed_the_width_bound_but_not_its_own():
    """n-gram embedding tables reach 20M rows (transformers' qwen4_exp_text): a key naming a vocab is
    bounded at 2^28, every other integer at 2^24."""
    import pytest

    from dayzero.errors import ConfigError
    from dayzero.specs.hf_config import check_bounds, int_limit

    assert int_limit("ngram_vocab_size_base") == 2**28 and int_limit("hidden_size") == 2**24
    check_bounds({"num_hidden_layers": 2, "ngram_vocab_size_base": 20_000_000}, "c.json")
    with pytest.raises(ConfigError, match="exceeds 268,435,456"):
        check_bounds({"num_hidden_layers": 2, "ngram_vocab_size_base": 2**28 + 1}, "c.json")
    with pytest.raises(ConfigError, match="exceeds 16,777,216"):
        check_bounds({"num_hidden_layers": 2, "hidden_size": 2**24 + 1}, "c.json")
