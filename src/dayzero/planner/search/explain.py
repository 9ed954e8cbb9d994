"""What a plan is and why it won: its family (the choices that change how it runs, not its batch
shape) and the constraint that binds it."""

from __future__ import annotations

from dayzero.specs.parallel import ParallelConfig, recompute_words

# the layout choices that make two plans different plans; cp, mbs and the rank order trade within
# a family (the top of a search is otherwise one plan repeated with cp2 swapped for mbs 4)
FAMILY = ("tp", "pp", "ep", "zero", "recompute")
NEAR_LIMIT = 0.95  # a peak memory within 5 % of the limit is what stops a faster neighbour


def family(p: ParallelConfig) -> str:
    words = [recompute_words(p.recompute, p.recompute_modules) if k == "recompute" else f"{k}{getattr(p, k)}"
             for k in FAMILY if not (k == "ep" and p.ep == 1)]
    return " ".join(words)


def binding(prediction: dict, max_memory: float) -> dict:
    """The constraint that binds a predicted plan: memory when its peak is at the limit, else the
    largest loss of the step beyond compute (exposed communication, pipeline bubble, optimizer),
    with its share of the step."""
    t = prediction["time"]
    util = prediction["memory"]["utilization"]
    if util >= NEAR_LIMIT * max_memory:
        return {"constraint": "memory", "share": util,
                "detail": f"peak memory {util:.0%} of the device against a {max_memory:.0%} limit"}
    losses = {"exposed communication": t["comm_exposed_s"], "pipeline bubble": t["bubble_s"],
              "optimizer step": t["optimizer_s"], "wait for the slowest rank": t.get("straggler_s", 0.0)}
    name, seconds = max(losses.items(), key=lambda kv: kv[1])
    share = seconds / t["step_s"] if t["step_s"] > 0 else 0.0
    if share < 0.01:
        return {"constraint": "compute", "share": t["compute_s"] / t["step_s"] if t["step_s"] > 0 else 0.0,
                "detail": "compute: every other term is under 1 % of the step"}
    return {"constraint": name, "share": share, "detail": f"{name}: {share:.1%} of the step "
            f"(compute {t['compute_s'] / t['step_s']:.1%}; peak memory {util:.0%})"}
