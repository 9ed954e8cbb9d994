"""``memory --exact`` against the analytic model on the best plan of five presets (dense with
ZeRO-3, GQA, MLA, MoE with EP, and the help example), with the wall time of each layout.

    PYTHONPATH=src python benchmarks/exact_memory.py [--only NAME] [--out benchmarks/RESULTS_exact_memory.md]

Each preset's layout is ``dayzero plan``'s best (run here, ``--top 1 --json``) on the cluster
given below; so that one layout traces in under a minute on a 2-core CPU, some are measured
with fewer decoder layers at full width (``layers``; with ``plan`` the reduced model is also
what is planned, through the same search). Every row says which. Writes a Markdown table to --out and prints it (the
table in benchmarks/RESULTS.md is its output).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from dayzero.runtime.planner_view import runtime_spec
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model
from dayzero.validate.exact_memory import CATEGORIES, compare, exact_memory

# family, preset, plan arguments, reduction (layers: decoder layers kept; stages: pipeline stages measured)
PRESETS = [
    ("GQA dense, ZeRO-2", "llama-3.1-8b", "-a h100 -n 8 --gbs 8 --seq 4096 --engine dayzero", {}),
    # gpt3-175b (MHA) ties embedding and head, which the runtime trains only at tp 1 and pp 1
    ("dense, ZeRO-3", "llama-3.1-70b", "-a h100 -n 64 --gbs 64 --seq 4096 --zero 3 --vpp 1 --engine dayzero",
     {"layers": 4}),
    ("MoE with EP", "mixtral-8x7b", "-a h100 -n 16 --gbs 64 --seq 4096 --vpp 1 --engine dayzero", {"layers": 4}),
    # the full model's plan (pp 32, 128 micro-batches) traces for minutes per stage: planned and
    # measured with 4 of its 61 layers (3 dense MLA, 1 MoE), full width, 256 experts
    ("MLA + MoE with EP", "deepseek-v3", "-a h100 -n 16 --gbs 64 --seq 4096 --vpp 1 --cp 1",
     {"layers": 4, "plan": True}),
    ("GQA dense, ZeRO-1 + TP (help example)", "llama-3.1-8b", None, {}),
]
HELP_EXAMPLE = ParallelConfig(tp=2, dp=4, seq=4096, gbs=8)  # dayzero memory --help's --exact example
MIB = 2**20


def best_plan(model: str, args: str, spec=None) -> tuple[ParallelConfig, float]:
    """``dayzero plan``'s best layout; for a reduced ``spec``, the same search in-process."""
    t = time.perf_counter()
    if spec is not None:  # what ``dayzero plan`` runs, for a model that is not a preset
        from dayzero.cli.common import cluster_from_options
        from dayzero.planner.perf.calibration import constants_for
        from dayzero.planner.perf.perf import PerfOptions
        from dayzero.planner.search.search import SearchSpace, plan

        a = dict(zip(args.split()[::2], args.split()[1::2]))
        cl = cluster_from_options(None, a["-a"], int(a["-n"]))
        space = SearchSpace(vpp=(int(a["--vpp"]),), cp=(int(a["--cp"]),))
        obj = plan(spec, cl, int(a["--gbs"]), int(a["--seq"]), "bf16", PerfOptions(constants=constants_for(cl)),
                   1, space=space)
        return _layout(obj["plans"][0]["parallel"]), time.perf_counter() - t
    out = subprocess.run([sys.executable, "-m", "dayzero", "plan", model, *args.split(), "--top", "1", "--json"],
                         check=True, capture_output=True, text=True).stdout
    return _layout(json.loads(out)["plans"][0]["parallel"]), time.perf_counter() - t


def _layout(par: dict) -> ParallelConfig:
    fields = {k: v for k, v in par.items() if k in ParallelConfig.__dataclass_fields__}
    if fields.get("layer_split") is not None:
        fields["layer_split"] = tuple(fields["layer_split"])
    return ParallelConfig(**fields)


def run_one(family: str, model: str, args: str | None, reduce: dict) -> dict:
    spec, note, stages = load_model(model), "full size", None
    if "layers" in reduce and spec.layers > reduce["layers"]:
        spec = spec.shrink(layers=reduce["layers"])
        note = f"{reduce['layers']} of {load_model(model).layers} layers, full width"
    # a reduced model is planned as the runtime trains it (runtime.planner_view.runtime_spec: no MTP)
    par, plan_s = (HELP_EXAMPLE, 0.0) if args is None else best_plan(model, args, runtime_spec(spec)
                                                                     if reduce.get("plan") else None)
    print(f"{family}: {model} {par.describe()} ({note})", file=sys.stderr, flush=True)
    exact = exact_memory(spec, par, "bf16", stages,
                         lambda done, total, s, last: last and print(f"  stage {s}: {last.seconds:.1f} s",
                                                                     file=sys.stderr, flush=True))
    r = compare(spec, par, "bf16", exact=exact)
    return {"family": family, "model": model, "layout": par.describe(), "note": note, "plan_s": plan_s,
            "seconds": [round(e.seconds, 1) for e in exact], "result": r}


def markdown(runs: list[dict], command: str) -> str:
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"### memory --exact vs the analytic model ({date}, 2-core CPU container, bf16, torch "
             f"{__import__('torch').__version__})", "", f"Command: `{command}`", "",
             "| preset | layout | measured | stage | category | analytic MiB | exact MiB | error | verdict |",
             "|---|---|---|---:|---|---:|---:|---:|---|"]
    notes = []
    for run in runs:
        for row in run["result"]["rows"]:
            if row["category"] not in CATEGORIES and row["category"] != "peak":
                continue
            err = "—" if row["rel_error"] is None else f"{row['rel_error']:+.1%}"
            verdict = ("" if not row["compared"] else "ok" if row["within"] else
                       f"explained ({row['residual']:+.1%} left) [{len(notes) + 1}]" if row["explained"] else
                       f"off [{len(notes) + 1}]" if row["explanation"] else "off")
            if row["explanation"] and row["compared"] and not row["within"]:
                notes.append(f"{run['model']} {row['category']}: {row['explanation']}")
            lines.append(f"| {run['model']} ({run['family']}) | {run['layout']} | {run['note']} | {row['stage']} | "
                         f"{row['category']} | {row['analytic'] / MIB:,.0f} | {row['exact'] / MIB:,.0f} | {err} | "
                         f"{verdict} |")
    lines += ["", "| preset | layout | plan s | exact s per stage |", "|---|---|---:|---|"]
    lines += [f"| {r['model']} | {r['layout']} | {r['plan_s']:.1f} | {', '.join(map(str, r['seconds']))} |"
              for r in runs]
    lines += ["", *[f"{i}. {n}" for i, n in enumerate(notes, 1)], ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run only this preset")
    ap.add_argument("--out", default="benchmarks/RESULTS_exact_memory.md")
    a = ap.parse_args()
    runs = [run_one(*p) for p in PRESETS if a.only in (None, p[1])]
    text = markdown(runs, "PYTHONPATH=src python benchmarks/exact_memory.py" + (f" --only {a.only}" if a.only else ""))
    Path(a.out).write_text(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], Path(a.out).name).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
