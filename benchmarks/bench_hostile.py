"""Hostile-input sweep: thousands of generated bad inputs across every verb, run in-process through
the CLI's own entry point (``dayzero.cli.app.main``), each with a time limit.

Categories (issue #42): special files given where a file is expected, expansion bombs and YAML
1.1 surprises, hand-edited plan files, foreign launch files, numbers at the edge (and odd model
configs). An input fails when the verb exits with anything but 0 or 2, prints a traceback, takes
longer than ``--timeout`` seconds, or exits 0 with a non-finite number (turned into ``null``) or a
negative time/size/count in its JSON.

    PYTHONPATH=src python benchmarks/bench_hostile.py --n 5000 --seed 42 --out runs/hostile.json

Prints one summary line per category and the failures (argv, exit code, last error line); the
result is recorded in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import random
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

import dayzero.jsonable as jsonable
from dayzero.cli.app import main

MODELS = ("tiny-llama", "tiny-moe", "llama-3.1-8b", "mixtral-8x7b", "deepseek-v3")
EDGE = ("0", "-1", "1e308", "-1e308", "5e-324", "1e-300", "inf", "-inf", "nan", "9" * 300, str(2**53 + 1),
        str(2**62), "2.0", "1:30", "yes", "", "0x10", "1e3", "-0.0")
NONNEGATIVE = ("_s", "bytes", "flops", "tokens", "params", "devices", "seconds", "gbytes", "utilization", "mfu",
               "layers")
SIGNED = ("change", "delta", "bias", "error", "diff")


class Hang(Exception):
    pass


def negatives(obj, path: str = "") -> list[str]:
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += negatives(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += negatives(v, f"{path}[{i}]")
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        key = path.rsplit(".", 1)[-1].split("[")[0].lower()
        if not any(w in key for w in SIGNED) and any(w in key for w in NONNEGATIVE) and obj < 0:
            out.append(f"{path} = {obj}")
    return out


def run(argv: list[str], timeout: int) -> dict:
    replaced: list[str] = []
    real = jsonable.finite

    def recording(obj, path="", found=None):
        return real(obj, path, replaced if found is None else found)

    def alarm(signum, frame):
        raise Hang()

    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(timeout)
    jsonable.finite = recording
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in argv])
    except Hang:
        code = "hang"
    except BaseException as e:  # noqa: BLE001 - anything escaping main is a failure to record
        code = f"escaped {type(e).__name__}"
    finally:
        jsonable.finite = real
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    seconds = time.perf_counter() - t0
    o, e = out.getvalue(), err.getvalue()
    problem = None
    if code == "hang":
        problem = f"hang (> {timeout} s)"
    elif code not in (0, 2):
        problem = f"exit {code}"
    elif "Traceback" in o or "Traceback" in e:
        problem = "traceback"
    elif code == 0 and replaced:
        problem = f"non-finite output: {replaced[:3]}"
    elif code == 0 and "--json" in argv and o.strip():
        try:
            bad = negatives(json.loads(o))
        except ValueError:
            bad = ["stdout is not JSON"]
        if bad:
            problem = f"impossible value: {bad[:3]}"
    last = (e.strip().splitlines() or [""])[-1][:300]
    return {"argv": [str(a) for a in argv], "code": code, "seconds": round(seconds, 3), "problem": problem,
            "error": last}


# -- generators: each returns an argv (writing whatever files it needs under d) -----------------------

class Gen:
    def __init__(self, rng: random.Random, root: Path, plan_doc: dict, rows: list[dict]):
        self.r, self.root, self.plan_doc, self.rows, self.n = rng, root, plan_doc, rows, 0

    def path(self, name: str) -> Path:
        self.n += 1
        d = self.root / f"i{self.n}"
        d.mkdir()
        return d / name

    def pick(self, xs):
        return xs[self.r.randrange(len(xs))]

    def edge(self):
        return self.pick(EDGE)

    def edge_json(self):
        v = self.edge()
        for conv in (int, float):
            with contextlib.suppress(ValueError):
                return conv(v)
        return v if self.r.random() < 0.7 else self.pick([None, True, [1, 2], {"a": 1}])

    def verbs_reading(self, p):
        m = self.pick(MODELS)
        return self.pick([["inspect", p], ["memory", p, "-a", "h100", "-n", "8"], ["plan", m, "--cluster", p],
                          ["predict", m, "-a", "h100", "-n", "8", "--calibration", p], ["backtest", p],
                          ["moe", "place", "--loads", p, "--ep", "4"], ["import", p, "--devices", "8"],
                          ["export", p, "--to", "megatron", "-n", "8"], ["monitor", p, "--once"], ["moe", "loads", p],
                          ["train", "tiny-llama", "--plan", p, "--dry-run"],
                          ["validate", "tiny-llama", "--plan", p, "--dry-run"]])

    # special files
    def special(self):
        kind = self.pick(["fifo", "/dev/zero", "/dev/urandom", "/dev/null", "socket", "dir", "dir-fifo"])
        name = self.pick(["config.json", "cluster.yaml", "runs.csv", "metrics.jsonl", "megatron_args.txt",
                          "plan.json", "ds_config.json"])
        p = self.path(name)
        if kind == "fifo":
            os.mkfifo(p)
        elif kind == "socket":
            s = socket.socket(socket.AF_UNIX)
            s.bind(str(p))
            self.keep = getattr(self, "keep", []) + [s]
        elif kind == "dir":
            p.mkdir()
        elif kind == "dir-fifo":
            p.mkdir()
            os.mkfifo(p / "config.json")
        else:
            p = Path(kind)
        return self.verbs_reading(p)

    # bombs and YAML surprises
    def bomb(self):
        what = self.pick(["laughs", "recursive", "duplicate", "yaml11", "deep-json", "long-line", "many-tokens",
                          "big-int"])
        if what == "laughs":
            levels, width = self.r.randint(2, 10), self.r.randint(2, 12)
            doc = "a0: &a0 [" + ",".join(["x"] * width) + "]\n" + "".join(
                f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]\n" for i in range(1, levels))
            text = doc + "accelerator: h100\nnodes: 1\n"
        elif what == "recursive":
            text = "accelerator: h100\nnodes: 1\nhost: &h {x: [*h]}\n"
        elif what == "duplicate":
            text = "accelerator: h100\nnodes: 1\nnodes: 2\n"
        elif what == "yaml11":
            field = self.pick(["nodes", "devices_per_node", "intra_node_gbytes_per_s", "scaleup_domain"])
            value = self.pick(["1:30", "yes", "on", "off", "0o17", "~", "2001-12-14", ".inf", "1_000"])
            text = f"accelerator: h100\nnodes: 1\n{field}: {value}\n"
            text = text.replace("nodes: 1\nnodes:", "nodes:")
        elif what == "deep-json":
            p = self.path("config.json")
            p.write_text("[" * self.r.randint(60, 100_000))
            return self.pick([["inspect", p], ["moe", "place", "--loads", p, "--ep", "2"]])
        elif what == "long-line":
            p = self.path("megatron_args.txt")
            p.write_text("--tensor-model-parallel-size " + "1" * self.r.randint(60_000, 3_000_000) + "\n")
            return ["import", p, "--devices", "8"]
        elif what == "many-tokens":
            p = self.path("megatron_args.txt")
            p.write_text("--tensor-model-parallel-size 2 " + " ".join(["--x"] * self.r.randint(1000, 100_000)))
            return ["import", p, "--devices", "8"]
        else:
            p = self.path("config.json")
            p.write_text('{"model_type": "llama", "hidden_size": ' + "9" * self.r.randint(300, 5000) + "}")
            return ["inspect", p]
        p = self.path(self.pick(["cluster.yaml", "cal.yaml"]))
        p.write_text(text)
        return (["plan", self.pick(MODELS), "--cluster", p] if p.name == "cluster.yaml" else
                ["predict", self.pick(MODELS), "-a", "h100", "-n", "8", "--calibration", p])

    # hand-edited plan files
    def plan(self):
        doc = json.loads(json.dumps(self.plan_doc))
        par = doc["plans"][0]["parallel"]
        for _ in range(self.r.randint(1, 3)):
            par[self.pick(sorted(par))] = self.edge_json() if self.r.random() < 0.7 else self.r.randint(-2, 9)
        p = self.path("plan.json")
        p.write_text(json.dumps(doc))
        return self.pick([["export", p, "--to", self.pick(["megatron", "torchtitan", "deepspeed", "slurm",
                                                            "kubernetes"]), "--json"],
                          ["export", p, "--to", "megatron", "--json"],
                          ["train", "tiny-llama", "--plan", p, "--nproc", "2", "--dry-run", "--json"]]
                         if self.r.random() < 0.1 else [["export", p, "--to", self.pick(
                             ["megatron", "torchtitan", "deepspeed", "slurm", "kubernetes"]), "--json"]])

    # foreign launch files
    def launch(self):
        kind = self.pick(["megatron", "torchtitan", "deepspeed"])
        if kind == "deepspeed":
            cfg = {"train_batch_size": self.edge_json(), "train_micro_batch_size_per_gpu": self.edge_json(),
                   "zero_optimization": self.pick([{"stage": self.edge_json()}, self.edge_json(), {}])}
            for k in list(cfg):
                if self.r.random() < 0.3:
                    del cfg[k]
            cfg.setdefault("train_batch_size", 8)
            p = self.path("ds_config.json")
            p.write_text(json.dumps(cfg, allow_nan=True))
            if self.r.random() < 0.5:
                p.with_name("launch.sh").write_text("deepspeed pretrain.py --seq-length "
                                                    + self.pick(["4096", "'x", '"', "\\", self.edge(), "0"])
                                                    + " --ep-size " + self.pick(["2", "-4", "0", self.edge()]) + "\n")
            return ["import", p, "--devices", self.pick(["8", "16", "1"]), "--json"]
        flags = (["--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--expert-model-parallel-size",
                  "--seq-length", "--micro-batch-size", "--global-batch-size", "--num-virtual-stages-per-pipeline-rank",
                  "--recompute-granularity", "--context-parallel-size", "--use-distributed-optimizer"]
                 if kind == "megatron" else
                 ["--parallelism.tensor_parallel_degree", "--parallelism.pipeline_parallel_degree",
                  "--parallelism.data_parallel_shard_degree", "--training.seq_len", "--training.local_batch_size",
                  "--parallelism.expert_parallel_degree", "--activation_checkpoint.mode"])
        words = [flags[0], "2"]
        for _ in range(self.r.randint(1, 6)):
            words += [self.pick(flags), self.pick([self.edge(), "'x", '"y', "\\", "bogus", "full", "-4", "3"])]
        p = self.path("megatron_args.txt" if kind == "megatron" else "torchtitan_args.txt")
        p.write_text(" ".join(words) + "\n")
        return ["import", p, "--devices", self.pick(["8", "16", "64"]), "--json"]

    # numbers at the edge
    def numbers(self):
        what = self.pick(["capacity", "loads", "row", "cluster", "calibration", "moe-flags", "memory-flags"])
        if what == "capacity":
            return ["memory", self.pick(["mixtral-8x7b", "tiny-moe", "deepseek-v3"]), "-a", "h100", "-n", "8", "--ep",
                    "8", "--capacity-factor", self.edge(), "--json"]
        if what == "loads":
            p = self.path("loads.json")
            rows = [[self.edge_json() if self.r.random() < 0.3 else self.r.randint(0, 100) for _ in range(8)]
                    for _ in range(self.r.randint(1, 3))]
            p.write_text(json.dumps(rows, allow_nan=True))
            return ["moe", "place", "--loads", p, "--ep", self.pick(["2", "4", "8"]), "--json"]
        if what == "row":
            row = dict(self.pick(self.rows))
            for _ in range(self.r.randint(1, 3)):
                row[self.pick(["hidden_size", "layers", "tokens_per_sec_per_gpu", "num_accelerators", "gbs", "mbs",
                               "tp", "seq_len", "mfu_pct", "tflops_per_gpu", "interconnect", "model"])] = (
                    self.edge() if self.r.random() < 0.8 else "1" * self.r.randint(100, 20_000))
            p = self.path("runs.csv")
            with open(p, "w", newline="") as f:
                w = csv.DictWriter(f, list(row))
                w.writeheader()
                w.writerow(row)
            return ["backtest", p, "--json"]
        if what == "cluster":
            field = self.pick(["inter_node_gbytes_per_s", "intra_node_gbytes_per_s", "hbm_gb", "peak_tflops",
                               "intra_latency_us", "nodes"])
            v = self.edge()
            text = "accelerator: h100\nnodes: 2\n" + (f"{field}: {v if v else '0'}\n" if field != "nodes" else "")
            if field == "peak_tflops":
                text = f"accelerator: h100\nnodes: 2\npeak_tflops: {{bf16: {v or 0}}}\n"
            p = self.path("cluster.yaml")
            p.write_text(text.replace("nodes: 2\nnodes:", "nodes:"))
            return ["predict", self.pick(MODELS), "--cluster", p, "--json"]
        if what == "calibration":
            p = self.path("cal.json")
            p.write_text(json.dumps({self.pick(["gemm_scale_bf16", "attention_eff", "inter_eff", "memory_scale",
                                                "layer_overhead_s", "step_jitter"]): self.edge_json()},
                                    allow_nan=True))
            return ["predict", self.pick(MODELS), "-a", "h100", "-n", "16", "--calibration", p, "--json"]
        if what == "moe-flags":
            p = self.path("loads.json")
            p.write_text(json.dumps([[self.r.randint(0, 1000) for _ in range(8)] for _ in range(2)]))
            return ["moe", "place", "--loads", p, "--ep", self.edge(), "--nodes", self.pick(["1", self.edge()]),
                    "--redundant", self.pick(["0", self.edge()]), "--json"]
        return ["memory", self.pick(MODELS), "-a", "h100", "-n", self.pick(["8", self.edge()]),
                self.pick(["--tp", "--pp", "--mbs", "--seq", "--gbs", "--zero", "--ep", "--fragmentation"]),
                self.edge(), "--json"]

    # odd model configs (parsed families; the derived path is the slow lane of tests/cli/test_fuzz.py)
    def config(self):
        base = {"model_type": self.pick(["llama", "mixtral", "qwen2", "deepseek_v3", "qwen3_moe"]), "hidden_size": 64,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
                "vocab_size": 512, "max_position_embeddings": 256, "num_local_experts": 4, "num_experts": 4,
                "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "head_dim": 16,
                "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8,
                "n_group": 1, "topk_group": 1}
        for _ in range(self.r.randint(1, 3)):
            base[self.pick(sorted(base))] = self.edge_json()
        p = self.path("config.json")
        p.write_text(json.dumps(base, allow_nan=True))
        return self.pick([["inspect", p, "--json"], ["memory", p, "-a", "h100", "-n", "8", "--json"]])


WEIGHTS = {"special": 0.2, "bomb": 0.15, "plan": 0.2, "launch": 0.2, "numbers": 0.15, "config": 0.1}


def main_(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--timeout", type=int, default=45)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    rng = random.Random(a.seed)
    from dayzero.planner.backtest.published import read_rows

    with tempfile.TemporaryDirectory(prefix="dayzero-hostile-") as tmp:
        root = Path(tmp)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main(["plan", "llama-3.1-8b", "-a", "h100", "-n", "16", "--json", "--top", "1"]) == 0
        g = Gen(rng, root, json.loads(buf.getvalue()), [dict(r) for r in read_rows()])
        cats, weights = zip(*WEIGHTS.items())
        results = []
        t0 = time.perf_counter()
        for i in range(a.n):
            cat = rng.choices(cats, weights)[0]
            res = run(getattr(g, cat)(), a.timeout)
            res["category"] = cat
            results.append(res)
            if res["problem"]:
                print(f"FAIL {cat}: {res['problem']}: {' '.join(res['argv'])[:200]} | {res['error']}", flush=True)
            if (i + 1) % 500 == 0:
                print(f"{i + 1}/{a.n} inputs, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        wall = time.perf_counter() - t0
    summary = {}
    for cat in cats:
        rs = [r for r in results if r["category"] == cat]
        summary[cat] = {"inputs": len(rs), "exit0": sum(r["code"] == 0 for r in rs),
                        "exit2": sum(r["code"] == 2 for r in rs), "failures": sum(bool(r["problem"]) for r in rs),
                        "slowest_s": max((r["seconds"] for r in rs), default=0.0)}
    total = {"inputs": len(results), "failures": sum(bool(r["problem"]) for r in results),
             "hangs": sum(r["code"] == "hang" for r in results),
             "tracebacks": sum(r["problem"] in ("traceback",) or str(r["problem"]).startswith("exit") for r in results),
             "nonfinite_or_impossible": sum(str(r["problem"]).startswith(("non-finite", "impossible"))
                                            for r in results),
             "wall_s": round(wall, 1), "seed": a.seed, "timeout_s": a.timeout}
    for cat, s in summary.items():
        print(f"{cat:8s} {s['inputs']:5d} inputs: {s['exit0']} answered, {s['exit2']} refused, "
              f"{s['failures']} failures (slowest {s['slowest_s']:.1f} s)")
    print(json.dumps(total))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"total": total, "by_category": summary,
                                     "failures": [r for r in results if r["problem"]]}, indent=1))
    return 1 if total["failures"] else 0


if __name__ == "__main__":
    sys.exit(main_())
