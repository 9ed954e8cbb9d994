"""Fuzzing every input a user hands the planner and production verbs: generated model configs,
cluster files, layout flags, calibration files and published-runs rows; export flags for every
engine and scheduler, engine files for `dayzero import`, expert-load matrices for `dayzero moe
place`, metrics streams for `dayzero monitor` and `dayzero moe loads`, and the flags of `dayzero
train --dry-run` and `dayzero validate --dry-run` (the runs' own pre-flight; a few accepted draws are
then trained for real, slow-marked) (checkpoints: tests/runtime/checkpoint/test_ckpt_fuzz.py).

For each generated input the verb must exit 0 or 2 (a usage or input error), print no traceback,
finish within ``TIMEOUT_S``, and when it exits 0 its JSON must hold only finite numbers (no value
was turned into ``null`` for being NaN or infinite) that are physically possible (no negative
time, size, rate or count; utilisations and MFU at most 1).

CI runs ``FUZZ_EXAMPLES`` (default 25) examples per target with a fixed seed (derandomized);
``DAYZERO_FUZZ_EXAMPLES=1000 pytest tests/cli/test_fuzz.py`` is the long run recorded in
benchmarks/RESULTS.md; ``DAYZERO_FUZZ_TALLY=FILE`` appends each pre-flight draw's verb and exit code
to FILE (how many were accepted).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import signal

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import dayzero.jsonable as jsonable
from dayzero.cli.app import main
from dayzero.planner.backtest.published import read_rows
from dayzero.specs.registry import model_presets

EXAMPLES = int(os.environ.get("DAYZERO_FUZZ_EXAMPLES", "25"))
TIMEOUT_S = 30
# no shrinking: a failing input is reported as generated (shrinking a slow verb took minutes)
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SMALL_MODELS = ("tiny-llama", "tiny-moe", "llama-3.1-8b", "mixtral-8x7b", "deepseek-v3", "gpt-oss-120b", "gpt3-175b")
NONNEGATIVE = ("_s", "bytes", "flops", "tokens", "params", "devices", "seconds", "gbytes", "utilization", "mfu",
               "ratio", "layers")
AT_MOST_ONE = ("mfu", "ratio", "utilization_of_peak")
SIGNED = ("change", "delta", "bias", "error", "diff")  # differences: either sign is physical


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"no answer within {TIMEOUT_S} s")


def physical_problems(obj, path: str = "") -> list[str]:
    """Negative times/sizes/rates/counts and fractions above 1, anywhere in a JSON document."""
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += physical_problems(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += physical_problems(v, f"{path}[{i}]")
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        key = path.rsplit(".", 1)[-1].split("[")[0].lower()
        if any(w in key for w in SIGNED):
            return out
        if any(w in key for w in NONNEGATIVE) and obj < 0:
            out.append(f"{path} = {obj} < 0")
        if any(key == w or key.endswith("_" + w) for w in AT_MOST_ONE) and obj > 1 + 1e-9:
            out.append(f"{path} = {obj} > 1")
    return out


def run(argv: list[str]) -> tuple[int, str, str, list[str]]:
    """(exit code, stdout, stderr, paths of non-finite values the JSON encoder replaced)."""
    replaced: list[str] = []
    real = jsonable.finite

    def recording(obj, path="", found=None):
        return real(obj, path, replaced if found is None else found)

    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(TIMEOUT_S)
    jsonable.finite = recording
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in argv])
    finally:
        jsonable.finite = real
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return code, out.getvalue(), err.getvalue(), replaced


def check(argv: list[str]) -> None:
    code, out, err, replaced = run(argv)
    assert code in (0, 2), (argv, code, err[-2000:])
    assert "Traceback" not in err and "Traceback" not in out, (argv, err[-2000:])
    if code == 2:
        assert err.startswith("dayzero: error: ") and err.strip(), (argv, err)
        return
    assert not replaced, (argv, "non-finite values in the output", replaced[:5])
    if "--json" in argv and out.strip():
        problems = physical_problems(json.loads(out))
        assert not problems, (argv, problems[:5])


# -- values ------------------------------------------------------------------------------------

def odd_numbers():
    return st.one_of(st.integers(-10, 10), st.integers(-2**70, 2**70), st.sampled_from([0, 1, 2, 3, 7, 64, 10**9]),
                     st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.5, -1e-6, 1e300, 1e-300]))


def odd_values():
    return st.one_of(odd_numbers(), st.none(), st.booleans(), st.text(max_size=8),
                     st.lists(st.integers(-3, 5), max_size=4), st.dictionaries(st.text(max_size=4), st.integers(),
                                                                               max_size=2))


def flag_values():
    return st.one_of(st.integers(-4, 9).map(str), st.sampled_from(["0", "1", "2", "8", "64", "-1", "1e9", "nan", "inf",
                                                                   "x", "", "3.5", "999999999999999999999"]))


# -- targets -----------------------------------------------------------------------------------

@FUZZ
@given(base=st.sampled_from(SMALL_MODELS), edits=st.dictionaries(st.sampled_from([
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
    "vocab_size", "head_dim", "rope_theta", "rms_norm_eps", "num_local_experts", "num_experts_per_tok",
    "n_routed_experts", "n_group", "topk_group", "first_k_dense_replace", "moe_intermediate_size",
    "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "sliding_window", "layer_types", "tie_word_embeddings",
    "model_type", "max_position_embeddings", "n_embd", "n_layer"]), odd_values(), min_size=1, max_size=3),
    verb=st.sampled_from(["inspect", "memory", "predict"]))
def test_fuzz_model_configs(tmp_path_factory, base, edits, verb):
    cfg = {k: v for k, v in model_presets()[base].items() if not k.startswith("_")}
    for k, v in edits.items():
        cfg[k] = v
    f = tmp_path_factory.mktemp("cfg") / "config.json"
    f.write_text(json.dumps(cfg, allow_nan=True))
    argv = [verb, f, "--json"] + ([] if verb == "inspect" else ["-a", "h100", "-n", "64"])
    check(argv)


CLUSTER_FIELDS = ["accelerator", "nodes", "devices_per_node", "scaleup_domain", "topology", "intra_node_gbytes_per_s",
                  "intra_node_p2p_gbytes_per_s", "inter_node_gbytes_per_s", "intra_latency_us", "inter_latency_us",
                  "peak_tflops", "hbm_gb", "hbm_tbytes_per_s", "efficiency", "runtime_context_mib", "comm_buffer_mib"]


@FUZZ
@given(edits=st.dictionaries(st.sampled_from(CLUSTER_FIELDS), st.one_of(
    odd_values(), st.dictionaries(st.sampled_from(["bf16", "fp8", "gemm", "intra", "inter", "memory_scale",
                                                  "layer_overhead_s", "attention"]), odd_numbers(), max_size=3),
    st.sampled_from(["h100", "910b", "a100", "mi300x", "nope", "switch", "mesh"])), min_size=1, max_size=4),
    verb=st.sampled_from(["memory", "predict"]))
def test_fuzz_cluster_files(tmp_path_factory, edits, verb):
    import yaml

    body = {"accelerator": "h100", "nodes": 2, **edits}
    f = tmp_path_factory.mktemp("cl") / "c.yaml"
    f.write_text(yaml.safe_dump(body, allow_unicode=True))
    check([verb, "llama-3.1-8b", "--cluster", f, "--json"])


LAYOUT_FLAGS = ["--tp", "--pp", "--dp", "--cp", "--ep", "--etp", "--vpp", "--mbs", "--gbs", "--seq", "--zero",
                "--recompute", "--schedule", "--precision", "--layer-split", "--devices", "--devices-per-node",
                "--inter-node-gbps"]
WORDS = {"--recompute": ["none", "full", "selective", "x"], "--schedule": ["1f1b", "interleaved", "gpipe", "zb", "x"],
         "--precision": ["bf16", "fp8", "fp4", "fp16"], "--layer-split": ["1,1", "16,16", "0,32", "a,b", "-1,33"]}


@FUZZ
@given(model=st.sampled_from(["llama-3.1-8b", "tiny-moe", "deepseek-v3"]), flags=st.dictionaries(
    st.sampled_from(LAYOUT_FLAGS), st.one_of(flag_values(), st.sampled_from(sum(WORDS.values(), []))),
    min_size=1, max_size=6), verb=st.sampled_from(["memory", "predict"]))
def test_fuzz_layout_flags(model, flags, verb):
    argv = [verb, model, "-a", "h100", "--json"]
    if "--devices" not in flags:
        argv += ["-n", "64"]
    for k, v in flags.items():
        argv += [k, v]
    check(argv)


@FUZZ
@given(constants=st.dictionaries(st.sampled_from(["gemm_scale_bf16", "gemm_half_dim", "attention_eff", "memory_scale",
                                                  "layer_overhead_s", "intra_eff", "inter_eff", "unknown_key"]),
                                 odd_values(), min_size=1, max_size=3))
def test_fuzz_calibration_files(tmp_path_factory, constants):
    f = tmp_path_factory.mktemp("cal") / "cal.json"
    f.write_text(json.dumps(constants, allow_nan=True))
    check(["predict", "llama-3.1-8b", "-a", "h100", "-n", "64", "--calibration", f, "--json"])


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, 2), st.sampled_from(
    ["tp", "pp", "dp", "cp", "ep", "vp", "mbs", "gbs", "seq_len", "num_accelerators", "layers", "hidden_size",
     "attention_heads", "kv_heads", "ffn_hidden_size", "vocab_size", "tokens_per_sec_per_gpu", "precision",
     "accelerator", "model", "moe_num_experts", "moe_top_k", "interconnect"]), flag_values()), min_size=1, max_size=4))
def test_fuzz_published_rows(tmp_path_factory, edits):
    import csv

    rows = [dict(r) for r in read_rows()[:3]]
    for i, col, v in edits:
        if col in rows[i]:
            rows[i][col] = v
    f = tmp_path_factory.mktemp("csv") / "runs.csv"
    with f.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    check(["backtest", f, "--json"])


EXPORT_FLAGS = ["--tp", "--pp", "--dp", "--ep", "--vpp", "--mbs", "--gbs", "--seq", "--zero", "--recompute",
                "--precision", "--devices", "--devices-per-node", "--steps", "--ckpt-every", "--max-requeues", "--time",
                "--exclude", "--cpus-per-node", "--mem-per-node", "--job-name", "--device", "--run-dir"]
EXPORT_WORDS = ["none", "full", "fp8", "bf16", "cuda", "npu", "cpu", "gpu[01-03]", "1-2:30", "a b", "../x", "-1"]


@FUZZ
@given(model=st.sampled_from(["tiny-llama", "tiny-moe", "llama-3.1-8b"]),
       to=st.sampled_from(["megatron", "deepspeed", "torchtitan", "slurm", "kubernetes"]),
       flags=st.dictionaries(st.sampled_from(EXPORT_FLAGS), st.one_of(flag_values(), st.sampled_from(EXPORT_WORDS)),
                             min_size=1, max_size=5))
def test_fuzz_export_flags(tmp_path_factory, model, to, flags):
    argv = ["export", model, "--to", to, "-o", tmp_path_factory.mktemp("exp") / "out", "--json"]
    if "--devices" not in flags:
        argv += ["-n", "16"]
    if to == "kubernetes":
        argv += ["--image", "registry/dayzero:1"]
    for k, v in flags.items():
        argv += [k, v]
    check(argv)


IMPORT_KEYS = ["--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--micro-batch-size",
               "--global-batch-size", "--seq-length", "--num-layers", "--expert-model-parallel-size",
               "--parallelism.tensor_parallel_degree", "--parallelism.pipeline_parallel_degree",
               "--training.local_batch_size", "--training.seq_len"]


@FUZZ
@given(kind=st.sampled_from(["megatron", "torchtitan", "deepspeed"]), pairs=st.lists(st.tuples(
    st.sampled_from(IMPORT_KEYS), flag_values()), min_size=1, max_size=5), ds=st.dictionaries(st.sampled_from(
        ["train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "zero_optimization",
         "bf16", "pipeline", "gradient_clipping"]), odd_values(), min_size=1, max_size=4), devices=flag_values())
def test_fuzz_import_files(tmp_path_factory, kind, pairs, ds, devices):
    d = tmp_path_factory.mktemp("imp")
    if kind == "deepspeed":
        f = d / "ds_config.json"
        f.write_text(json.dumps(ds, allow_nan=True))
    else:
        f = d / ("megatron_args.txt" if kind == "megatron" else "torchtitan_args.txt")
        lead = ["--parallelism.data_parallel_shard_degree", "1"] if kind == "torchtitan" else []
        f.write_text(" ".join(lead + [x for kv in pairs for x in kv]) + "\n")
    check(["import", f, "--devices", devices, "--json"])


@FUZZ
@given(loads=st.one_of(odd_values(), st.lists(st.lists(odd_numbers(), min_size=1, max_size=9), min_size=1,
                                                max_size=3)),
       ep=flag_values(), nodes=flag_values(), redundant=flag_values(),
       policy=st.sampled_from(["hierarchical", "global", "x"]))
def test_fuzz_moe_place(tmp_path_factory, loads, ep, nodes, redundant, policy):
    f = tmp_path_factory.mktemp("moe") / "loads.json"
    f.write_text(json.dumps(loads, allow_nan=True))
    check(["moe", "place", "--loads", f, "--ep", ep, "--nodes", nodes, "--redundant", redundant, "--policy", policy,
           "--json"])


@FUZZ
@given(records=st.lists(st.one_of(st.dictionaries(st.sampled_from(
    ["step", "loss", "step_time_s", "tokens_per_s", "peak_mem_bytes", "comm_time_s", "event", "moe", "expert_loads",
     "ranks", "attempt"]), odd_values(), max_size=5), odd_values()), min_size=1, max_size=6),
    verb=st.sampled_from(["monitor", "moe loads"]))
def test_fuzz_metrics_streams(tmp_path_factory, records, verb):
    f = tmp_path_factory.mktemp("run") / "metrics.jsonl"
    f.write_text("".join(json.dumps(r, allow_nan=True) + "\n" for r in records))
    check([*verb.split(), f, *(["--once"] if verb == "monitor" else []), "--json"])


# -- round 3: special files, bombs, hand-edited plans, foreign launch files, edge numbers ---------------

SMALL = settings(FUZZ, max_examples=max(5, EXAMPLES // 3))
EDGE_TEXT = ("0", "-1", "1e308", "5e-324", "1e-300", "inf", "nan", "9" * 300, str(2**53 + 1), "2.0", "1:30", "yes",
             "", "0x10")
FILE_VERBS = (("inspect", "{p}"), ("plan", "llama-3.1-8b", "--cluster", "{p}"),
              ("predict", "llama-3.1-8b", "-a", "h100", "-n", "8", "--calibration", "{p}"), ("backtest", "{p}"),
              ("moe", "place", "--loads", "{p}", "--ep", "4"), ("import", "{p}", "--devices", "8"),
              ("export", "{p}", "--to", "megatron", "-n", "8"), ("monitor", "{p}", "--once"), ("moe", "loads", "{p}"))


def _edge_json(text: str):
    for conv in (int, float):
        with contextlib.suppress(ValueError):
            return conv(text)
    return text


@SMALL
@given(kind=st.sampled_from(["fifo", "/dev/zero", "/dev/urandom", "dir", "dir-fifo"]), verb=st.sampled_from(FILE_VERBS),
       name=st.sampled_from(["config.json", "cluster.yaml", "runs.csv", "metrics.jsonl", "megatron_args.txt"]))
def test_fuzz_special_files(tmp_path_factory, kind, verb, name):
    p = tmp_path_factory.mktemp("special") / name
    if kind == "fifo":
        os.mkfifo(p)
    elif kind.startswith("dir"):
        p.mkdir()
        if kind == "dir-fifo":
            os.mkfifo(p / "config.json")
    else:
        p = kind
    argv = [str(p) if a == "{p}" else a for a in verb]
    code, _, err, _ = run(argv)
    assert code == 2 and "Traceback" not in err and err.startswith("dayzero: error: "), (argv, err)


@SMALL
@given(levels=st.integers(1, 10), width=st.integers(1, 12), extra=st.sampled_from(
    ["", "nodes: 2\n", "host: &h {x: [*h]}\n", "nodes: 1:30\n", "nodes: yes\n", "devices_per_node: on\n"]),
    target=st.sampled_from(["cluster", "calibration"]))
def test_fuzz_yaml_bombs(tmp_path_factory, levels, width, extra, target):
    doc = "a0: &a0 [" + ",".join(["1"] * width) + "]\n" + "".join(
        f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]\n" for i in range(1, levels))
    f = tmp_path_factory.mktemp("bomb") / "f.yaml"
    f.write_text(doc + "accelerator: h100\nnodes: 1\n" + extra)
    argv = (["plan", "llama-3.1-8b", "--cluster", f, "--top", "1"] if target == "cluster" else
            ["predict", "llama-3.1-8b", "-a", "h100", "-n", "8", "--calibration", f])
    code, _, err, _ = run(argv)
    # every draw here carries keys a cluster or calibration file does not have, or a bomb: refused
    assert code == 2 and "Traceback" not in err, (argv, err)


@pytest.fixture(scope="module")
def plan_file_doc():
    code, out, err, _ = run(["plan", "llama-3.1-8b", "-a", "h100", "-n", "16", "--json", "--top", "1"])
    assert code == 0, err
    return json.loads(out)


@SMALL
@given(edits=st.dictionaries(st.sampled_from(["tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs", "gbs", "seq", "zero",
                                              "recompute", "recompute_modules", "layer_split", "schedule",
                                              "sequence_parallel", "microbatches", "activation_offload_layers"]),
                             st.one_of(odd_values(), st.sampled_from(EDGE_TEXT).map(_edge_json)), min_size=1,
                             max_size=3),
       to=st.sampled_from(["megatron", "torchtitan", "deepspeed", "slurm", "kubernetes"]))
def test_fuzz_plan_files(tmp_path_factory, plan_file_doc, edits, to):
    doc = json.loads(json.dumps(plan_file_doc))
    doc["plans"][0]["parallel"].update(edits)
    f = tmp_path_factory.mktemp("plan") / "plan.json"
    f.write_text(json.dumps(doc, allow_nan=True))
    check(["export", f, "--to", to, "--json"])
    code, out, _, _ = run(["export", f, "--to", to, "--json"])
    if code == 0:  # what was written is what the rules accept: no float degree, no zero
        par = json.loads(out)["parallel"]
        assert all(isinstance(par[k], int) and par[k] >= 1 for k in ("tp", "pp", "dp", "cp", "ep", "mbs")), par


@SMALL
@given(kind=st.sampled_from(["megatron", "torchtitan", "deepspeed"]), words=st.lists(st.one_of(
    st.sampled_from(["'", '"', "\\", "'x", "--x", "#", "bogus", "full", "-4", "0"]), st.sampled_from(EDGE_TEXT)),
    min_size=1, max_size=8), stage=st.one_of(odd_values(), st.sampled_from(EDGE_TEXT).map(_edge_json)))
def test_fuzz_foreign_launch_files(tmp_path_factory, kind, words, stage):
    d = tmp_path_factory.mktemp("launch")
    if kind == "deepspeed":
        f = d / "ds_config.json"
        f.write_text(json.dumps({"train_batch_size": 8, "train_micro_batch_size_per_gpu": stage,
                                 "zero_optimization": {"stage": stage}}, allow_nan=True))
        (d / "launch.sh").write_text("deepspeed pretrain.py --seq-length " + " ".join(words) + "\n")
    else:
        lead = "--tensor-model-parallel-size 2 --seq-length" if kind == "megatron" else \
            "--parallelism.tensor_parallel_degree 2 --training.seq_len"
        f = d / f"{kind}_args.txt"
        f.write_text(lead + " " + " ".join(words) + "\n")
    check(["import", f, "--devices", "8", "--json"])


@SMALL
@given(value=st.sampled_from(EDGE_TEXT), where=st.sampled_from(["capacity", "loads", "hidden_size",
                                                                 "tokens_per_sec_per_gpu", "num_accelerators",
                                                                 "inter_node_gbytes_per_s", "attention_eff"]))
def test_fuzz_edge_numbers(tmp_path_factory, value, where):
    d = tmp_path_factory.mktemp("edge")
    if where == "capacity":
        argv = ["memory", "mixtral-8x7b", "-a", "h100", "-n", "8", "--ep", "8", "--capacity-factor", value, "--json"]
    elif where == "loads":
        f = d / "loads.json"
        f.write_text(json.dumps([[_edge_json(value), 1, 2, 3]], allow_nan=True))
        argv = ["moe", "place", "--loads", f, "--ep", "2", "--json"]
    elif where in ("hidden_size", "tokens_per_sec_per_gpu", "num_accelerators"):
        rows = [dict(r) for r in read_rows() if r["id"] == "R0127"]
        rows[0][where] = value
        f = d / "runs.csv"
        with open(f, "w", newline="") as fh:
            import csv

            w = csv.DictWriter(fh, list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        argv = ["backtest", f, "--json"]
    elif where == "inter_node_gbytes_per_s":
        f = d / "c.yaml"
        f.write_text(f"accelerator: h100\nnodes: 2\n{where}: {value or 0}\n")
        argv = ["predict", "llama-3.1-8b", "--cluster", f, "--json"]
    else:
        f = d / "cal.json"
        f.write_text(json.dumps({where: _edge_json(value)}, allow_nan=True))
        argv = ["predict", "llama-3.1-8b", "-a", "h100", "-n", "16", "--calibration", f, "--json"]
    check(argv)


# -- pre-flight of train and validate (--dry-run) ----------------------------------------------------

@pytest.fixture(scope="module")
def runtime_imported():
    """The runtime's modules imported before the first timed draw: a cold import of torch.distributed
    took over TIMEOUT_S on the loaded 2-core CI host, which is not the verb hanging."""
    import dayzero.runtime.preflight  # noqa: F401
    import dayzero.runtime.resilience.loop  # noqa: F401
    import dayzero.validate.host_cache  # noqa: F401
    import dayzero.validate.preflight  # noqa: F401
    import dayzero.validate.run  # noqa: F401


def preflight_problems(argv: list[str], doc: dict) -> list[str]:
    """What an accepted pre-flight must say: a world that is the layout's, a need that fits what it
    says is usable, positive sizes, and the flags it was given."""
    out = []
    par, mem = doc["parallel"], doc["memory"]
    if doc["ranks"] != par["world"] or doc["ranks"] < 1:
        out.append(f"ranks {doc['ranks']} vs layout world {par['world']}")
    if par["tp"] * par["pp"] * par["dp"] * par["cp"] != par["world"]:
        out.append(f"tp*pp*dp*cp != world: {par}")
    if doc["tokens_per_step"] != par["gbs"] * par["seq"] or doc["tokens_per_step"] < 1:
        out.append(f"tokens_per_step {doc['tokens_per_step']}")
    if par["gbs"] != par["mbs"] * par["dp"] * par["microbatches"]:
        out.append(f"gbs != mbs * dp * microbatches: {par}")
    if doc["model"]["params"] < 1 or doc["model"]["layers"] < 1 or doc["steps"] < 1:
        out.append(f"model {doc['model']}, steps {doc['steps']}")
    if mem is not None and not (0 < mem["per_rank_bytes"] and mem["need_bytes"] <= mem["usable_bytes"]
                                <= mem["available_bytes"] and mem["fits"]):
        out.append(f"accepted although it does not fit: {mem}")
    given = dict(zip(argv, argv[1:]))
    for flag, key in (("--steps", "steps"), ("--nproc", "ranks")):
        if flag in given and given[flag].isdigit() and int(given[flag]) != doc[key]:
            out.append(f"{flag} {given[flag]} but the plan says {doc[key]}")
    for flag in ("--tp", "--pp", "--ep", "--seq", "--mbs"):
        if flag in given and given[flag].isdigit() and int(given[flag]) != par[flag[2:]]:
            out.append(f"{flag} {given[flag]} but the plan says {par[flag[2:]]}")
    return out


def check_preflight(argv: list[str]) -> int:
    """``check`` for a --dry-run verb, plus :func:`preflight_problems` on an accepted one."""
    code, out, err, replaced = run(argv)
    if os.environ.get("DAYZERO_FUZZ_TALLY"):  # exit codes, to tell how many draws were accepted
        with open(os.environ["DAYZERO_FUZZ_TALLY"], "a") as f:
            f.write(f"{argv[0]} {code}\n")
    assert code in (0, 2), (argv, code, err[-2000:])
    assert "Traceback" not in err and "Traceback" not in out, (argv, err[-2000:])
    if code == 2:
        assert err.startswith("dayzero: error: ") and err.count("\n") == 1, (argv, err)
        return code
    assert not replaced, (argv, "non-finite values in the output", replaced[:5])
    doc = json.loads(out)
    assert doc["ok"] is True and not physical_problems(doc), (argv, physical_problems(doc)[:5])
    if "model" in doc:
        assert not preflight_problems(argv, doc), (argv, preflight_problems(argv, doc))
    return code


@contextlib.contextmanager
def empty_profile_cache(tmp_path_factory):
    """No measured profile of this host: ``validate --dry-run`` must say the run measures one, never measure."""
    old = os.environ.get("DAYZERO_CACHE_DIR")
    cache = tmp_path_factory.mktemp("cache")
    os.environ["DAYZERO_CACHE_DIR"] = str(cache)
    try:
        yield cache
    finally:
        if old is None:
            os.environ.pop("DAYZERO_CACHE_DIR", None)
        else:
            os.environ["DAYZERO_CACHE_DIR"] = old
        assert not any(cache.iterdir()), "validate --dry-run wrote into the profile cache"


def odd_floats():
    return st.one_of(st.sampled_from(["0", "1e-3", "0.5", "1", "3", "-1", "-0.0", "nan", "inf", "-inf", "1e308",
                                      "1e-320", "x", "", "1,5"]),
                     st.floats(allow_nan=True, allow_infinity=True).map(str))


def fault_specs():
    keys = st.sampled_from(["step", "rank", "kind", "sleep", "at", "attempt", "when"])
    vals = st.one_of(flag_values(), st.sampled_from(["kill", "exception", "hang", "straggler", "save", "step", "x"]))
    return st.one_of(st.lists(st.tuples(keys, vals), max_size=5).map(lambda kv: ",".join(f"{k}={v}" for k, v in kv)),
                     st.builds(lambda s, r, k: f"step={s},rank={r},kind={k}", st.integers(-1, 12), st.integers(-1, 3),
                               st.sampled_from(["kill", "exception", "hang", "straggler"])),
                     st.text(max_size=12))


PREFLIGHT_INTS = ["--tp", "--pp", "--dp", "--cp", "--ep", "--etp", "--vpp", "--mbs", "--gbs", "--seq", "--zero",
                  "--nproc", "--steps", "--seed", "--layers", "--hidden", "--experts", "--vocab"]
PREFLIGHT_WORDS = {"--compute-dtype": ["bf16", "fp32", "auto", "fp16", "x"], "--precision": ["bf16", "fp8", "fp4"],
                   "--recompute": ["none", "full", "selective", "x"],
                   "--schedule": ["1f1b", "interleaved", "gpipe", "zb", "x"], "--device": ["cpu", "cuda", "npu", "x"]}
TRAIN_WORDS = {"--moe-aux-loss": ["model", "none", "seq", "global", "micro", "x"],
               "--resume": ["auto", "never", "0", "2", "7", "-1", "x", "../ck"],
               "--on-bad-loss": ["skip", "rollback", "x"], "--on-rank-failure": ["restart", "exclude", "x"],
               "--ckpt-checksum": ["xxh3-128", "sha256", "md5"],
               "--on-alert": ["all=log", "straggler=checkpoint", "x=y", "nan_loss=exclude", "="]}
TRAIN_FLOATS = ["--lr", "--grad-clip", "--watchdog", "--save-timeout", "--spike-factor", "--moe-bias-rate",
                "--moe-aux-coef", "--moe-z-loss", "--moe-capacity-factor", "--metrics-linger", "--peak-tflops"]
TRAIN_INTS = ["--warmup", "--ckpt-every", "--keep", "--max-restarts", "--spares", "--moe-loads-every"]
TRAIN_BOOLS = ["--async-save", "--ckpt-prune-other-lineages", "--skip-memory-check", "--alerts", "--quiet"]
CKPT_DIRS = ["none", "fresh", "empty", "file", "corrupt", "under-file"]


def ckpt_dir_arg(d, kind: str) -> list[str]:
    """A --ckpt-dir of each kind a user can give, in the folder ``d``: new, empty, a file, with a
    corrupt version, below a file."""
    if kind == "none":
        return []
    if kind == "fresh":
        return ["--ckpt-dir", str(d / "new" / "ck")]
    if kind in ("file", "under-file"):
        (d / "f").write_text("x")
        return ["--ckpt-dir", str(d / "f" / ("ck" if kind == "under-file" else ""))]
    if kind == "corrupt":
        v = d / "step-00000002"
        v.mkdir()
        (v / "COMPLETE").write_text("")
        (v / "manifest.json").write_text('{"format": "dayzero-checkpoint/1", "step": 2}')
    return ["--ckpt-dir", str(d)]


def tree(d) -> dict:
    """Every path under ``d`` with its size and modification time."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(d.rglob("*"))}


def flagged(flags: dict, bools: list[str]) -> list[str]:
    out = [x for k, v in flags.items() for x in (k, v)]
    return out + bools


@FUZZ
@given(model=st.sampled_from(["tiny-llama", "tiny-moe", "llama-3.1-8b", "deepseek-v3", "gpt-oss-120b"]),
       ints=st.dictionaries(st.sampled_from(PREFLIGHT_INTS + TRAIN_INTS), flag_values(), max_size=6),
       floats=st.dictionaries(st.sampled_from(TRAIN_FLOATS), odd_floats(), max_size=3),
       words=st.dictionaries(st.sampled_from(sorted({**PREFLIGHT_WORDS, **TRAIN_WORDS})), st.sampled_from(
           sorted({w for ws in {**PREFLIGHT_WORDS, **TRAIN_WORDS}.values() for w in ws})), max_size=3),
       faults=st.lists(fault_specs(), max_size=2), bools=st.lists(st.sampled_from(TRAIN_BOOLS), max_size=3,
                                                                   unique=True),
       ckpt=st.sampled_from(CKPT_DIRS), paths=st.dictionaries(st.sampled_from(["--metrics", "--data"]),
                                                               st.sampled_from(["fresh", "dir", "under-file"]),
                                                               max_size=2))
def test_fuzz_train_check(runtime_imported, tmp_path_factory, model, ints, floats, words, faults, bools, ckpt, paths):
    d = tmp_path_factory.mktemp("train")
    (d / "file").write_text("x")
    where = {"fresh": d / "new" / "m.jsonl", "dir": d, "under-file": d / "file" / "m.jsonl"}
    argv = ["train", model, "--dry-run", "--json", *flagged({**ints, **floats, **words}, bools),
            *[x for f in faults for x in ("--inject-fault", f)], *ckpt_dir_arg(d, ckpt),
            *[x for k, v in paths.items() for x in (k, str(where[v]))]]
    before = tree(d)
    check_preflight(argv)
    assert tree(d) == before, (argv, "train --dry-run wrote something")


@FUZZ
@given(model=st.sampled_from(["tiny-llama", "tiny-moe", "llama-3.1-8b", "mixtral-8x7b"]),
       nproc=st.sampled_from(["1", "2", "4", "8"]),
       degrees=st.dictionaries(st.sampled_from(["--tp", "--pp", "--dp", "--ep", "--vpp", "--zero"]),
                               st.sampled_from(["1", "2", "4"]), max_size=3),
       batch=st.dictionaries(st.sampled_from(["--mbs", "--gbs", "--seq"]),
                             st.sampled_from(["1", "2", "8", "64", "512"]), max_size=3),
       proxy=st.fixed_dictionaries({"--layers": st.sampled_from(["1", "2", "4"]),
                                    "--hidden": st.sampled_from(["64", "128", "256"])},
                                   optional={"--experts": st.sampled_from(["2", "4", "8"]),
                                             "--vocab": st.sampled_from(["257", "512", "1024"])}),
       run=st.dictionaries(st.sampled_from(["--steps", "--warmup", "--moe-loads-every", "--seed"]),
                           st.sampled_from(["1", "5", "100"]), max_size=3),
       rates=st.dictionaries(st.sampled_from(["--lr", "--grad-clip", "--moe-z-loss", "--moe-capacity-factor",
                                              "--watchdog", "--save-timeout"]), st.sampled_from(["1e-3", "0.5", "2"]),
                             max_size=2),
       bools=st.lists(st.sampled_from(["--async-save", "--sequence-parallel"]), max_size=1),
       ckpt=st.sampled_from(["none", "fresh", "fresh", "empty", "corrupt"]))
def test_fuzz_train_check_plausible(runtime_imported, tmp_path_factory, model, nproc, degrees, batch, proxy, run,
                                    rates, bools, ckpt):
    """Draws from values a user would type, so that many are accepted and their plans are checked."""
    d = tmp_path_factory.mktemp("train")
    argv = ["train", model, "--dry-run", "--json", "--nproc", nproc,
            *flagged({**degrees, **batch, **proxy, **run, **rates}, bools), *ckpt_dir_arg(d, ckpt)]
    before = tree(d)
    check_preflight(argv)
    assert tree(d) == before, (argv, "train --dry-run wrote something")


VALIDATE_FLOATS = ["--lr", "--grad-clip", "--step-tolerance"]
VALIDATE_WORDS = {**PREFLIGHT_WORDS, "--fit-keys": ["gemm_bf16", "gemm_bf16,intra", "x", ",", ""]}


@FUZZ
@given(model=st.sampled_from(["tiny-llama", "tiny-moe", "llama-3.1-8b", "deepseek-v3", "none"]),
       ints=st.dictionaries(st.sampled_from(PREFLIGHT_INTS), flag_values(), max_size=6),
       floats=st.dictionaries(st.sampled_from(VALIDATE_FLOATS), odd_floats(), max_size=2),
       words=st.dictionaries(st.sampled_from(sorted(VALIDATE_WORDS)), st.sampled_from(
           sorted({w for ws in VALIDATE_WORDS.values() for w in ws})), max_size=3),
       cluster=st.sampled_from(["none", "preset", "file", "missing", "bad"]),
       extras=st.lists(st.sampled_from(["--calibrate", "--runs", "--out", "--profile-out", "--strict"]), max_size=3,
                       unique=True))
def test_fuzz_validate_check(runtime_imported, tmp_path_factory, model, ints, floats, words, cluster, extras):
    d = tmp_path_factory.mktemp("val")
    argv = ["validate", *([] if model == "none" else [model]), "--dry-run", "--json", *flagged({**ints, **floats,
                                                                                                **words}, [])]
    if cluster != "none":
        f = d / "host.yaml"
        if cluster == "file":
            f.write_text("accelerator: h100\nnodes: 1\n")
        elif cluster == "bad":
            f.write_text("accelerator: [1, 2\n")
        argv += ["--cluster", "dgx-h100-1024" if cluster == "preset" else str(f)]
    if "--runs" in extras:
        (d / "validation.json").write_text(json.dumps({"record": {"label": "x"}}))
        argv += ["--runs", str(d / "validation.json")]
    argv += ["--out", str(d / "out")] if "--out" in extras else []
    argv += ["--profile-out", str(d / "p.yaml")] if "--profile-out" in extras else []
    argv += [x for x in extras if x in ("--calibrate", "--strict")]
    before = tree(d)
    with empty_profile_cache(tmp_path_factory):
        check_preflight(argv)
    assert tree(d) == before, (argv, "validate --dry-run wrote something")


RUNNABLE = settings(FUZZ, max_examples=int(os.environ.get("DAYZERO_FUZZ_RUNNABLE_DRAWS", "60")))


@pytest.mark.slow
def test_fuzz_check_accepted_means_runnable(runtime_imported, tmp_path_factory):
    """The first 3 draws the check accepts, trained for one step: accepted means it runs."""
    import subprocess
    import sys

    accepted: list[list[str]] = []

    @RUNNABLE
    @given(model=st.sampled_from(["tiny-llama", "tiny-moe"]), nproc=st.sampled_from(["1", "2"]),
           layout=st.dictionaries(st.sampled_from(["--tp", "--dp", "--ep", "--pp", "--mbs", "--gbs"]),
                                  st.sampled_from(["1", "2", "3", "4"]), max_size=3),
           seq=st.sampled_from(["16", "32", "33", "64"]), lr=odd_floats(), warmup=st.sampled_from(["0", "1", "5"]),
           dtype=st.sampled_from(["fp32", "auto", "bf16"]),
           moe=st.dictionaries(st.sampled_from(["--moe-aux-loss", "--moe-z-loss", "--moe-capacity-factor"]),
                               st.sampled_from(["seq", "micro", "0", "1e-3", "1.25"]), max_size=2),
           ckpt=st.booleans())
    def draw(model, nproc, layout, seq, lr, warmup, dtype, moe, ckpt):
        if len(accepted) >= 3:
            return
        argv = ["train", model, "--nproc", nproc, "--steps", "1", "--seq", seq, "--lr", lr, "--warmup", warmup,
                "--compute-dtype", dtype, "--layers", "2", "--hidden", "64", "--quiet", *flagged({**layout, **moe}, [])]
        if ckpt:
            argv += ["--ckpt-dir", str(tmp_path_factory.mktemp("ck") / "ck")]
        if check_preflight([*argv, "--dry-run", "--json"]) == 0:
            accepted.append(argv)

    draw()
    assert len(accepted) == 3, accepted
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [os.path.abspath("src"),
                                                                   os.environ.get("PYTHONPATH")] if p)}
    for argv in accepted:
        p = subprocess.run([sys.executable, "-m", "dayzero", *argv, "--json"], capture_output=True, text=True, env=env,
                           timeout=300)
        assert p.returncode == 0, (argv, p.stderr[-2000:])
        doc = json.loads(p.stdout)
        assert [r["step"] for r in doc["steps"]] == [1] and math.isfinite(doc["steps"][0]["loss"]), (argv, doc)


@pytest.mark.parametrize("argv", [["plan", "tiny-llama", "-a", "h100", "-n", "8", "--json"],
                                  ["plan", "tiny-moe", "-a", "910b", "-n", "16", "--seq", "512", "--json"]])
def test_physical_checker_accepts_real_outputs(argv):
    """The checker itself: real outputs pass it, and a planted negative time does not."""
    code, out, err, replaced = run(argv)
    assert code == 0 and not replaced and not physical_problems(json.loads(out)), err
    assert physical_problems({"time": {"step_s": -1.0}}) == [".time.step_s = -1.0 < 0"]
