"""How long a never-seen model takes through ``dayzero inspect`` and ``dayzero plan``.

Each model is the default config of a transformers config class dayzero has no parser for (the
class's defaults describe the full-size published model, e.g. Qwen3-Next-80B-A3B), written to a
fresh directory as config.json; each verb runs in a fresh process (imports included), so the time
is what a user waits. Targets: inspect < 10 s, plan < 15 s.

    PYTHONPATH=src python benchmarks/derive_speed.py [--runs 2] [--types qwen3_next,llama4_text]
    PYTHONPATH=src python benchmarks/derive_speed.py --flops --seq 4096 --types qwen3_next,olmo2

``--flops`` instead compares the training FLOPs per token ``inspect`` reports for the derived spec
with a trace of transformers' own code (``dayzero ops``'s tracer, eager attention, one layer per
kind scaled to the full depth).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TYPES = ("qwen3_next", "llama4_text", "deepseek_v32", "minimax", "olmo2", "phi3")


def write_default_config(model_type: str, root: Path) -> Path:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cfg = CONFIG_MAPPING[model_type]().to_dict()
    d = root / model_type
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def timed(argv: list[str]) -> tuple[float, dict]:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"))
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "dayzero", *argv, "--json"], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    if out.returncode:
        raise SystemExit(f"{' '.join(argv)} failed: {out.stderr.strip()[-400:]}")
    return wall, json.loads(out.stdout)


def in_process(types: list[str]) -> None:
    """Where a fresh process's time goes: importing torch + transformers' modeling code, versus
    building on the meta device and describing (second call: imports warm)."""
    t = time.perf_counter()
    import torch  # noqa: F401
    import transformers  # noqa: F401
    t_import = time.perf_counter() - t
    from dayzero.specs.registry import load_model

    print(f"in process: import torch + transformers {t_import:.2f} s")
    with tempfile.TemporaryDirectory() as tmp:
        for mt in types:
            d = write_default_config(mt, Path(tmp))
            t = time.perf_counter()
            load_model(str(d))  # first: imports this model's modeling module
            first = time.perf_counter() - t
            t = time.perf_counter()
            load_model(str(d))
            print(f"  {mt}: load_model first {first:.2f} s (modeling module import included), "
                  f"again {time.perf_counter() - t:.2f} s (build + describe + config-key check)")


def flops(types: list[str], seq: int) -> None:
    from dayzero.ops.trace import trace_model
    from dayzero.specs.counting import flops_per_token
    from dayzero.specs.registry import load_model

    print(f"| model_type | traced FLOPs/token (train, seq {seq}) | inspect | inspect vs trace |")
    print("| --- | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for mt in types:
            d = write_default_config(mt, Path(tmp))
            tr = trace_model(str(d), seq=seq)
            got = tr.total_flops() / tr.tokens
            ref = flops_per_token(load_model(str(d)), seq, causal=False).train
            print(f"| {mt} | {got:.4g} | {ref:.4g} | {(ref - got) / got:+.2%} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--flops", action="store_true")
    ap.add_argument("--seq", type=int, default=4096)
    args = ap.parse_args()
    if args.flops:
        flops(args.types.split(","), args.seq)
        return
    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores")
    print("| model_type | params (module tree) | inspect s (best) | plan s (best) | layouts | unused keys |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    worst = {"inspect": 0.0, "plan": 0.0}
    with tempfile.TemporaryDirectory() as tmp:
        for mt in args.types.split(","):
            d = write_default_config(mt, Path(tmp))
            ins = [timed(["inspect", str(d)]) for _ in range(args.runs)]
            pl = [timed(["plan", str(d), "-a", "h100", "-n", "1024", "--gbs", "1024", "--seq", "4096", "--top", "1"])
                  for _ in range(args.runs)]
            ti, tp = min(w for w, _ in ins), min(w for w, _ in pl)
            worst = {"inspect": max(worst["inspect"], ti), "plan": max(worst["plan"], tp)}
            obj, plan = ins[0][1], pl[0][1]
            print(f"| {mt} | {obj['params_total']:,} | {ti:.2f} | {tp:.2f} | {plan['considered']:,} | "
                  f"{', '.join(obj['unused_config_keys']) or '-'} |")
    in_process(args.types.split(","))
    ok = worst["inspect"] < 10 and worst["plan"] < 15
    print(f"worst inspect {worst['inspect']:.2f} s (target < 10), worst plan {worst['plan']:.2f} s (target < 15): "
          f"{'PASS' if ok else 'FAIL'}")


if __name__ == "__main__":
    main()
