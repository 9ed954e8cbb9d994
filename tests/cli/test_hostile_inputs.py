"""Hostile and odd inputs, round 3: special files, expansion bombs, hand-edited plan files, foreign
launch files, numbers at the edge and faults that must report their cause. Each case must end in
one ``dayzero: error:`` line (exit 2) naming what is wrong, or a correct answer; never a hang, a
traceback, an impossible value or a non-finite number (the fuzz targets: tests/cli/test_fuzz.py)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import socket
import time

import pytest

from dayzero.cli.app import main
from dayzero.errors import ConfigError
from dayzero.inputs import parse_json, parse_yaml, read_bytes, read_lines, read_text

TIMEOUT_S = 30


def run(argv) -> tuple[int, str, str]:
    def hang(signum, frame):
        raise AssertionError(f"no answer within {TIMEOUT_S} s: {argv}")

    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(TIMEOUT_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in argv])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return code, out.getvalue(), err.getvalue()


def refused(argv, *needles: str) -> str:
    code, out, err = run(argv)
    assert code == 2 and err.startswith("dayzero: error: ") and "Traceback" not in err + out, (argv, code, err)
    assert len(err.strip().splitlines()) == 1, err
    for n in needles:
        assert n in err, (n, err)
    return err


# -- special files -------------------------------------------------------------------------------

@pytest.fixture
def fifo(tmp_path):
    p = tmp_path / "pipe"
    os.mkfifo(p)
    return p


def special_files(tmp_path, fifo):
    sock = tmp_path / "sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    return {"named pipe": fifo, "character device": "/dev/zero", "socket": sock, "directory": tmp_path / "d"}, s


@pytest.mark.parametrize("kind", ["named pipe", "character device", "socket", "directory"])
def test_read_refuses_every_special_file_before_opening_it(tmp_path, fifo, kind):
    (tmp_path / "d").mkdir()
    files, s = special_files(tmp_path, fifo)
    try:
        with pytest.raises(ConfigError, match=re.escape(f"{files[kind]}: is a {kind}") + ".*expected a regular file"):
            read_text(files[kind])
    finally:
        s.close()


def test_size_is_checked_before_reading(tmp_path):
    big = tmp_path / "sparse.json"
    with open(big, "wb") as f:
        f.truncate(65 * 2**20)  # a sparse file: 65 MiB long, nothing to read
    t = time.perf_counter()
    with pytest.raises(ConfigError, match="is 65 MiB; a file of this kind is at most 64 MiB"):
        read_bytes(big)
    assert time.perf_counter() - t < 0.5
    with pytest.raises(ConfigError, match="at most 16 bytes"):
        read_bytes(tmp_path / "sparse.json", limit=16)


def verbs_reading(path):
    """Every verb's user-file input, given ``path``."""
    return [["inspect", path], ["plan", "llama-3.1-8b", "--cluster", path], ["predict", "llama-3.1-8b", "-a", "h100",
            "-n", "8", "--calibration", path], ["backtest", path], ["moe", "place", "--loads", path, "--ep", "4"],
            ["import", path, "--devices", "8"], ["export", path, "--to", "megatron", "-n", "8"],
            ["monitor", path], ["moe", "loads", path], ["train", "tiny-llama", "--plan", path, "--dry-run"],
            ["validate", "tiny-llama", "--plan", path, "--dry-run"]]


@pytest.mark.parametrize("name", ["config.json", "cluster.yaml", "runs.csv", "metrics.jsonl", "args.txt"])
def test_a_fifo_under_any_name_is_refused_by_every_verb(tmp_path, name):
    p = tmp_path / name
    os.mkfifo(p)
    for argv in verbs_reading(p):
        code, out, err = run(argv)
        assert code == 2 and "Traceback" not in err + out, (argv, err)
        assert str(p) in err or name in err, (argv, err)


def test_dev_zero_and_a_config_directory_holding_a_fifo(tmp_path):
    refused(["inspect", "/dev/zero"], "/dev/zero: is a character device")
    refused(["backtest", "/dev/urandom"], "/dev/urandom: is a character device")
    d = tmp_path / "model"
    d.mkdir()
    os.mkfifo(d / "config.json")
    refused(["inspect", d], "config.json: is a named pipe (FIFO)")


# -- expansion bombs and YAML surprises ------------------------------------------------------------

def billion_laughs(levels: int = 9) -> str:
    doc = 'a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    for i in range(1, levels):
        doc += f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]\n"
    return doc + "accelerator: h100\nnodes: 1\n"


def test_yaml_alias_bomb_is_refused_in_milliseconds(tmp_path):
    f = tmp_path / "bomb.yaml"
    f.write_text(billion_laughs())
    t = time.perf_counter()
    refused(["plan", "llama-3.1-8b", "--cluster", f], "expands to more than 100,000 values")
    refused(["predict", "llama-3.1-8b", "-a", "h100", "-n", "8", "--calibration", f], "expands to more")
    assert time.perf_counter() - t < 5


def test_yaml_aliases_within_bounds_and_merge_keys_still_work():
    doc = "base: &b {x: 1, y: 2}\nc: {<<: *b, y: 3}\nlist: [*b, *b]\n"
    assert parse_yaml(doc, "f") == {"base": {"x": 1, "y": 2}, "c": {"x": 1, "y": 3}, "list": [{"x": 1, "y": 2}] * 2}


def test_recursive_alias_and_duplicate_keys_are_refused():
    with pytest.raises(ConfigError, match="refers to itself"):
        parse_yaml("a: &x [1, *x]\n", "f")
    with pytest.raises(ConfigError, match="field 'nodes': appears twice"):
        parse_yaml("nodes: 1\nnodes: 2\n", "f")
    with pytest.raises(ConfigError, match="field 'tp': appears twice"):
        parse_json('{"tp": 1, "tp": 8}', "f")
    with pytest.raises(ConfigError, match="holds NaN"):
        parse_json('{"tp": NaN}', "f")


@pytest.mark.parametrize("value, needle", [("1:30", "'1:30'"), ("yes", "'yes'"), ("on", "'on'"), ("2.0", "2.0"),
                                           ("true", "True"), ("0x10", "integer")])
def test_yaml_1_1_surprises_are_not_a_node_count(tmp_path, value, needle):
    f = tmp_path / "c.yaml"
    f.write_text(f"accelerator: h100\nnodes: {value}\n")
    if value == "0x10":  # YAML 1.2 core hex: a real integer, 16 nodes
        code, out, err = run(["plan", "llama-3.1-8b", "--cluster", f, "--json", "--top", "1"])
        assert code == 0 and json.loads(out)["devices"] == 16 * 8, err
        return
    refused(["plan", "llama-3.1-8b", "--cluster", f], "field 'nodes'", needle)


def test_yaml_12_scalars():
    assert parse_yaml("a: 010\nb: 1e3\nc: 2001-12-14\nd: off\ne: ~\n", "f") == {
        "a": 10, "b": 1000.0, "c": "2001-12-14", "d": "off", "e": None}


def test_argument_file_with_a_40_mb_line_is_refused_unread(tmp_path):
    f = tmp_path / "args.txt"
    f.write_text("--tensor-model-parallel-size " + "1" * 40_000_000 + "\n")
    t = time.perf_counter()
    refused(["import", f, "--devices", "8"], "is 38 MiB")
    assert time.perf_counter() - t < 5
    g = tmp_path / "long.txt"
    g.write_text("--tensor-model-parallel-size 2 " + "x" * 100_000 + "\n")
    refused(["import", g, "--devices", "8"], "line 1 is 100,031 characters long")
    with pytest.raises(ConfigError, match="line 2 is 11 characters long; a line of this kind is at most 10"):
        read_lines(_write(tmp_path / "l.txt", "short\n" + "x" * 11 + "\n"), max_line=10)


def _write(p, text):
    p.write_text(text)
    return p


ADVERSARIAL = {"digits": "1" * 100_000, "digits and spaces": "1 " * 50_000, "dotted": "1." * 50_000,
               "rates": "1G" * 50_000, "counts": "8x " * 33_333, "words": "a1 " * 33_333, "letters": "a" * 100_000,
               "nic words": "8 x nic " * 12_500, "brackets": "[(" * 50_000}


@pytest.mark.parametrize("kind", sorted(ADVERSARIAL))
def test_every_text_parser_is_linear_on_100k_characters(kind):
    from dayzero.planner.backtest.interconnect_text import read_interconnect
    from dayzero.planner.backtest.model_names import annotations, parse_name, strip_annotations
    from dayzero.planner.backtest.row_arch import model_of
    from dayzero.planner.backtest.run_features import read_features

    text = ADVERSARIAL[kind]
    parsers = {"read_interconnect": lambda: read_interconnect(text, 8), "parse_name": lambda: parse_name(text),
               "strip_annotations": lambda: strip_annotations(text), "annotations": lambda: annotations(text),
               "read_features": lambda: read_features(text, [], text),
               "model_of": lambda: model_of({"model": text[:2000], "arch_source": text, "notes": text,
                                             "attention_type": text})}
    for name, parse in parsers.items():
        t = time.perf_counter()
        with contextlib.suppress(Exception):  # a refusal is fine; the time is what is tested
            parse()
        took = time.perf_counter() - t
        assert took < 1.0, f"{name} took {took:.2f} s on 100k characters of {kind}"


def test_interconnect_of_20000_digits_in_a_backtest_row(tmp_path):
    from dayzero.planner.backtest.published import read_rows

    row = dict(next(r for r in read_rows() if r["id"] == "R0132"), interconnect="1" * 20_000)
    f = tmp_path / "runs.csv"
    _csv(f, [row])
    t = time.perf_counter()
    code, out, err = run(["backtest", f, "--json"])
    assert code in (0, 2) and "Traceback" not in err and time.perf_counter() - t < 20


def _csv(path, rows):
    import csv

    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)


# -- hand-edited plan files ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plan_doc():
    code, out, err = run(["plan", "llama-3.1-8b", "-a", "h100", "-n", "16", "--json", "--top", "1"])
    assert code == 0, err
    return json.loads(out)


PLAN_EDITS = [("tp", 0, "tp must be >= 1"), ("tp", "2", "field 'tp': expected an integer, got '2'"),
              ("tp", None, "field 'tp': expected an integer, got None"), ("tp", 2**62, "field 'tp'"),
              ("tp", 2.0, "field 'tp': expected an integer, got 2.0"), ("tp", True, "field 'tp'"),
              ("mbs", 0, "mbs must be >= 1"), ("zero", 9, "zero must be 0-3, got 9"),
              ("layer_split", "8,8", "field 'layer_split'"), ("layer_split", 4, "field 'layer_split'"),
              ("recompute_modules", 3, "field 'recompute_modules'"), ("recompute", "bogus", "recompute must be"),
              ("sequence_parallel", "yes", "field 'sequence_parallel'"), ("schedule", 1, "field 'schedule'")]


@pytest.mark.parametrize("field, value, needle", PLAN_EDITS)
def test_hand_edited_plan_files_are_refused_naming_the_field(tmp_path, plan_doc, field, value, needle):
    doc = json.loads(json.dumps(plan_doc))
    doc["plans"][0]["parallel"][field] = value
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(doc))
    refused(["export", f, "--to", "megatron"], str(f), needle)
    if field not in ("layer_split", "sequence_parallel"):  # layouts train --plan does not read
        refused(["train", "tiny-llama", "--plan", f, "--nproc", "2", "--dry-run"], str(f))


def test_plan_dp_0_and_tp_3_for_an_8_head_model(tmp_path, plan_doc):
    doc = json.loads(json.dumps(plan_doc))
    doc["plans"][0]["parallel"]["dp"] = 0
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(doc))
    refused(["export", f, "--to", "torchtitan"], "dp must be >= 1")
    doc["plans"][0]["parallel"].update(dp=16, tp=3)
    f.write_text(json.dumps(doc))
    refused(["export", f, "--to", "megatron"], "attention heads (32) must be divisible by tp (3)")
    refused(["export", f, "--to", "slurm"], "divisible by tp (3)")


def test_an_untouched_plan_still_exports(tmp_path, plan_doc):
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(plan_doc))
    code, out, err = run(["export", f, "--to", "slurm", "--json"])
    assert code == 0 and "#SBATCH --nodes=2\n" in json.loads(out)["files"]["dayzero.sbatch"], err


# -- foreign launch files --------------------------------------------------------------------------

@pytest.mark.parametrize("text, needle", [
    ("--tensor-model-parallel-size 2 --micro-batch-size 'oops\n", "No closing quotation"),
    ("--tensor-model-parallel-size 2 --seq-length 0\n", "seq"),
    ("--tensor-model-parallel-size 2 --expert-model-parallel-size -4\n", "-4"),
    ("--tensor-model-parallel-size 2 --recompute-granularity bogus\n", "recompute must be"),
    ("--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 0\n",
     "--num-virtual-stages-per-pipeline-rank"),
])
def test_megatron_argument_files(tmp_path, text, needle):
    f = tmp_path / "megatron_args.txt"
    f.write_text(text)
    refused(["import", f, "--devices", "8"], needle)


def test_torchtitan_overrides_with_an_unclosed_quote(tmp_path):
    f = tmp_path / "overrides.txt"
    f.write_text("--parallelism.tensor_parallel_degree 2 --job.description 'x\n")
    refused(["import", f, "--devices", "8"], "No closing quotation")


@pytest.mark.parametrize("cfg, launch, needle", [
    ({"zero_optimization": {"stage": [1]}, "train_batch_size": 8}, None, "zero_optimization.stage"),
    ({"zero_optimization": {"stage": "two"}, "train_batch_size": 8}, None, "zero_optimization.stage"),
    ({"zero_optimization": {"stage": 7}, "train_batch_size": 8}, None, "zero must be 0-3, got 7"),
    ({"zero_optimization": {"stage": 1}, "train_batch_size": 8, "train_micro_batch_size_per_gpu": 0}, None,
     "mbs must be >= 1"),
    ({"zero_optimization": {"stage": 1}, "train_batch_size": 8}, "deepspeed pretrain.py --seq-length 'x\n",
     "No closing quotation"),
])
def test_deepspeed_configs(tmp_path, cfg, launch, needle):
    f = tmp_path / "ds_config.json"
    f.write_text(json.dumps(cfg))
    if launch:
        (tmp_path / "launch.sh").write_text(launch)
    refused(["import", f, "--devices", "8"], needle)


def test_a_deepspeed_launch_line_that_is_a_fifo(tmp_path):
    f = tmp_path / "ds_config.json"
    f.write_text(json.dumps({"zero_optimization": {"stage": 1}, "train_batch_size": 8}))
    os.mkfifo(tmp_path / "launch.sh")
    refused(["import", f, "--devices", "8"], "launch.sh: is a named pipe")


# -- numbers at the edge -----------------------------------------------------------------------------

def test_capacity_factor_1e308_is_a_finite_answer():
    code, out, err = run(["memory", "mixtral-8x7b", "-a", "h100", "-n", "8", "--ep", "8", "--capacity-factor", "1e308",
                          "--json"])
    big = json.loads(out)
    code2, out2, _ = run(["memory", "mixtral-8x7b", "-a", "h100", "-n", "8", "--ep", "8", "--capacity-factor", "4",
                          "--json"])  # 8 experts / top-2: every token fits; a larger factor holds no more
    assert code == 0 and code2 == 0, err
    assert big["stages"] == json.loads(out2)["stages"]
    refused(["memory", "mixtral-8x7b", "-a", "h100", "-n", "8", "--capacity-factor", "inf"], "--capacity-factor")


def test_loads_of_1e308_are_refused(tmp_path):
    f = tmp_path / "loads.json"
    f.write_text(json.dumps([[1e308, 1, 1, 1, 1, 1, 1, 1]]))
    refused(["moe", "place", "--loads", f, "--ep", "4", "--json"], "at most 2^53")


def test_backtest_rows_with_a_300_digit_hidden_size_and_a_denormal_rate(tmp_path):
    from dayzero.planner.backtest.published import read_rows

    base = next(r for r in read_rows() if r["id"] == "R0127")
    f = tmp_path / "runs.csv"
    _csv(f, [dict(base, hidden_size="9" * 300)])
    code, out, err = run(["backtest", f, "--json"])
    doc = json.loads(out)
    assert code == 0 and "hidden_size" in doc["skipped"][0]["reason"] and "at most 2^53" in doc["skipped"][0]["reason"]
    _csv(f, [dict(base, tokens_per_sec_per_gpu="5e-324")])
    code, out, err = run(["backtest", f, "--json"])
    assert code == 0 and all(r["rel_error"] is None or abs(r["rel_error"]) < 1e6 for r in json.loads(out)["rows"])


def test_json_output_refuses_a_non_finite_number(capsys):
    from dayzero.cli.common import emit_json
    from dayzero.errors import DayzeroError

    with pytest.raises(DayzeroError, match=r"the result's a.b\[1\] is not a finite number"):
        emit_json({"a": {"b": [1.0, float("inf")]}})
    assert capsys.readouterr().out == ""


T = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
         vocab_size=512, max_position_embeddings=256)


@pytest.mark.parametrize("cfg, needle", [
    (dict(T, model_type="phimoe", num_local_experts=4, num_experts_per_tok=16), "top-k (16) exceeds"),
])
def test_derived_models_are_checked_before_they_are_built(tmp_path, cfg, needle):
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))
    t = time.perf_counter()
    refused(["memory", f, "-a", "h100", "-n", "8", "--exact"], needle)
    refused(["inspect", f], needle)
    assert time.perf_counter() - t < 20


def test_the_expert_module_bound_counts_modules_not_experts(tmp_path):
    """transformers' MoE blocks hold their experts as packed tensors (one module at any count) and PEER-
    or Doge-style experts are rows of a table: 2^24 of them build on the meta device in seconds. The
    bound on expert modules applies where the code builds one module per expert."""
    from dayzero.errors import ConfigError
    from dayzero.specs.hf_config import check_bounds

    cfg = dict(T, model_type="phimoe", num_local_experts=2**24, num_experts_per_tok=2)
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))
    t = time.perf_counter()
    code, out, err = run(["inspect", f, "--json"])
    assert code == 0 and json.loads(out)["layer_kinds_derived"][0]["ffn"]["experts"] == 2**24, err
    assert time.perf_counter() - t < 30
    check_bounds(cfg, "c", lambda key: False)
    with pytest.raises(ConfigError, match="16,777,216 experts x 4 layers = 67,108,864 expert modules to build"):
        check_bounds(cfg, "c", lambda key: key == "num_local_experts")


def test_heads_that_do_not_divide_the_width_are_the_modeling_codes_to_size(tmp_path, capsys):
    """transformers' attention takes head_dim = hidden_size // heads where a config sets none: a derived
    model is read from the modules it builds (7 heads x 14, 98 wide), a parsed family states the floor."""
    f = tmp_path / "config.json"
    f.write_text(json.dumps(dict(T, model_type="olmo2", hidden_size=100, num_attention_heads=7, num_key_value_heads=7)))
    code, out, err = run(["inspect", f, "--json"])
    kind = json.loads(out)["layer_kinds_derived"][0]["mixer"]
    assert code == 0 and (kind["heads"], kind["head_dim"]) == (7, 14), err
    f.write_text(json.dumps(dict(T, model_type="llama", hidden_size=100, num_attention_heads=7, num_key_value_heads=7)))
    code, out, err = run(["inspect", f, "--json"])
    notes = json.loads(out)["config_notes"]
    assert code == 0 and any("head_dim 14 (hidden_size // heads" in n for n in notes), (err, notes)
    code, out, err = run(["inspect", f])
    said = " ".join(err.split())
    assert code == 0 and "config: hidden_size (100) is not divisible by num_attention_heads (7)" in said


def test_exact_memory_refuses_an_expert_count_it_cannot_run(tmp_path):
    f = tmp_path / "config.json"
    f.write_text(json.dumps(dict(T, model_type="mixtral", num_local_experts=2**20, num_experts_per_tok=2)))
    refused(["memory", f, "-a", "h100", "-n", "8", "--exact"], "1,048,576 experts x 4 MoE layers")


def test_routing_groups_that_do_not_divide_the_experts(tmp_path):
    mla = dict(q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
               n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
               first_k_dense_replace=1, n_group=3, topk_group=1)
    f = tmp_path / "config.json"
    f.write_text(json.dumps(dict(T, **mla, num_key_value_heads=4, model_type="deepseek_v3")))
    refused(["memory", f, "-a", "h100", "-n", "8", "--exact"], "field 'n_group'", "4 experts cannot be split into 3")


def test_tiny_bandwidths_and_efficiencies_name_the_step_time(tmp_path):
    c = tmp_path / "c.yaml"
    c.write_text("accelerator: h100\nnodes: 2\ninter_node_gbytes_per_s: 1.0e-300\n")
    err = refused(["plan", "llama-3.1-8b", "--cluster", c], "bandwidth, peak or efficiency near zero")
    assert "--restart-s" not in err
    k = tmp_path / "cal.yaml"
    k.write_text("gemm_scale_bf16: 1.0e-300\n")
    refused(["predict", "llama-3.1-8b", "-a", "h100", "-n", "16", "--calibration", k], "near zero")


# -- faults report their cause ---------------------------------------------------------------------

def test_metrics_stream_degrades_to_stderr_on_a_full_disk(tmp_path, capsys):
    import errno

    from dayzero.runtime.metrics import MetricsWriter

    w = MetricsWriter(tmp_path / "m.jsonl", enabled=True)
    w.write({"step": 1})

    class Full:
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self):
            pass

        def close(self):
            raise OSError(errno.ENOSPC, "No space left on device")

    w._f = Full()
    w.write({"step": 2})
    w.write({"step": 3})
    w.close()
    err = capsys.readouterr().err
    assert "cannot write" in err and "No space left on device" in err
    assert '"step": 2' in err and '"step": 3' in err
    assert [json.loads(x)["step"] for x in (tmp_path / "m.jsonl").read_text().splitlines()] == [1]


def test_ranks_log_on_a_full_disk_keeps_the_cause(tmp_path, capsys, monkeypatch):
    import builtins
    import errno

    from dayzero.runtime.resilience import rank_log

    real = builtins.open

    def full(path, *a, **k):
        if str(path).endswith("ranks.log"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, *a, **k)

    monkeypatch.setattr(builtins, "open", full)
    rank_log.append_attempt(tmp_path / "ranks.log", tmp_path, 0, 2)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write the ranks' log" in err and "No space left on device" in err
