"""ZeRO-3 under torch.distributed.pipelining: the runtime's memory (``memory --exact``'s harness,
validate.exact_memory: one rank per stage under fake tensors, the pipeline's
set_reshard_after_backward / set_requires_gradient_sync calls) against the planner priced as the
engine holds it (MemoryOptions.pipelined_fsdp, planner.schedule.held_zero) and as laid out.

    PYTHONPATH=src python benchmarks/pipelined_fsdp_memory.py [MODEL] [--layers N] [--seq S]

Prints a Markdown table per stage (MiB): the tracker's live bytes at the peak by FSDPMemTracker
category, and the planner's categories (overhead left out: the harness has no communicator or
CUDA context) under both pricings, with the error of their sum against the peak.
"""

from __future__ import annotations

import argparse

from dayzero.planner.memory.memory import estimate_memory
from dayzero.runtime.planner_view import memory_options, runtime_spec
from dayzero.specs import layout_rules
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model
from dayzero.validate.exact_memory import CATEGORIES, exact_memory

MIB = 2**20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="llama-3.1-8b")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    a = ap.parse_args()
    spec = runtime_spec(load_model(a.model))
    if a.layers and spec.layers > a.layers:
        spec = spec.shrink(layers=a.layers)
    p = ParallelConfig(pp=2, dp=2, zero=3, gbs=8, mbs=1, seq=a.seq)
    layout_rules.validate(p, spec)
    exact = exact_memory(spec, p, "bf16")
    opts = memory_options(None, "bf16", spec, p, "cpu")
    priced = {"pipelined": estimate_memory(spec, p, 10**15, opts),
              "as laid out": estimate_memory(spec, p, 10**15, opts.with_(pipelined_fsdp=()))}
    shown = [c for c in CATEGORIES if c != "overhead"]
    print(f"{spec.name} ({spec.layers} layers), {p.describe()}, bf16\n")
    print("| stage | what | " + " | ".join(shown) + " | sum | vs exact peak |")
    print("|---|---|" + "---:|" * (len(shown) + 2))
    for e in exact:
        live = {k: v / MIB for k, v in e.tracker_peak.items() if k != "Total" and v}
        print(f"| {e.stage} | exact at peak | " + ", ".join(f"{k} {v:,.0f}" for k, v in live.items())
              + " |" * (len(shown) - 1) + f" | {e.peak_bytes / MIB:,.0f} | |")
        for name, rep in priced.items():
            s = rep.stages[e.stage]
            total = sum(getattr(s, c) for c in shown)
            print(f"| {e.stage} | {name} | " + " | ".join(f"{getattr(s, c) / MIB:,.0f}" for c in shown)
                  + f" | {total / MIB:,.0f} | {total / e.peak_bytes - 1:+.1%} |")


if __name__ == "__main__":
    main()
