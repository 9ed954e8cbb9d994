"""Train the proxy of every model type of issue 15's list (models dayzero has no parser for, built
from transformers' own code) single-process, under FSDP2 dp2 and under tp2 where the verb says TP
applies; print one markdown row per run.

Each config is the tiny one of ``tests/derive/test_derive.py::NEW_TYPES`` (vocabulary 512), trained
as the tests do: 8 steps, 4 sequences of 32 tokens, fp32 on CPU (gloo for two ranks). A run
"falls" when its last loss is 0.2 below the first and the second half sums below the first.
Multi-rank runs are compared with the single-process run on the first step (same seed, same data).

    PYTHONPATH=src python benchmarks/derived_train.py [--types olmo2,phi3] [--modes single,dp2,tp2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "derive")]

RUN = ["--steps", "8", "--seq", "32", "--gbs", "4", "--compute-dtype", "fp32", "--quiet"]
MODES = {"single": [], "dp2": ["--nproc", "2", "--dp", "2"], "tp2": ["--nproc", "2", "--tp", "2"]}


def falling(losses: list[float]) -> bool:
    return len(losses) == 8 and losses[-1] < losses[0] - 0.2 and sum(losses[4:]) < sum(losses[:4])


def train(path: Path, mode: str, work: Path) -> tuple[int, list[float], str, float]:
    """(exit code, per-step losses, the derived-dimensions line for tp / the error line, seconds)."""
    metrics = work / f"{path.name}-{mode}.jsonl"
    argv = [sys.executable, "-m", "dayzero", "train", str(path), *RUN, *MODES[mode], "--metrics", str(metrics)]
    if mode == "single":
        argv.append("--json")
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode:
        return proc.returncode, [], (proc.stderr.strip().splitlines() or [""])[-1], seconds
    lines = [json.loads(x) for x in metrics.read_text().splitlines() if '"step"' in x and "event" not in x]
    losses = [r["loss"] for r in lines if r.get("rank", 0) == 0] or [r["loss"] for r in lines]
    note = ""
    if mode == "single":
        dims = json.loads(proc.stdout).get("derived_dimensions", [])
        note = next((d for d in dims if d.startswith("tp")), "")
    return 0, losses, note, seconds


def main(argv: list[str] | None = None) -> int:
    from test_derive import NEW_TYPES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default=",".join(sorted(NEW_TYPES)))
    ap.add_argument("--modes", default="single,dp2,tp2")
    args = ap.parse_args(argv)
    failures = 0
    print("| model_type | mode | exit | first loss | last loss | falls | step-1 vs single | s | note |")
    print("| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for model_type in args.types.split(","):
            d = work / model_type
            d.mkdir()
            cfg = {"model_type": model_type, **NEW_TYPES[model_type], "vocab_size": 512}
            (d / "config.json").write_text(json.dumps(cfg))
            single: list[float] = []
            tp_applies = True
            for mode in args.modes.split(","):
                if mode == "tp2" and not tp_applies:
                    print(f"| {model_type} | tp2 | - | | | | | | the verb says TP does not apply (above) |")
                    continue
                code, losses, note, seconds = train(d, mode, work)
                if mode == "single":
                    single = losses
                    tp_applies = "not applicable" not in note
                ok = code == 0 and falling(losses)
                diff = f"{abs(losses[0] - single[0]):.1e}" if mode != "single" and losses and single else ""
                if not ok or (diff and float(diff) > 1e-5):
                    failures += 1
                first = f"{losses[0]:.3f}" if losses else ""
                last = f"{losses[-1]:.3f}" if losses else ""
                print(f"| {model_type} | {mode} | {code} | {first} | {last} | {'yes' if ok else 'NO'} | {diff} | "
                      f"{seconds:.0f} | {note.replace('|', '/')[:110]} |", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
