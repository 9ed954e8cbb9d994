"""A layout as the command-line flags that reproduce it (``--tp 8 --pp 2 ...``): the inverse of
:mod:`dayzero.specs.layout_options`, for the next-step commands the verbs print and for the
launches ``dayzero export`` writes."""

from __future__ import annotations

from typing import Any, Mapping

# The memory switches (ParallelConfig fields the search sets, planner.search.switches) as the flags of
# memory, predict and plan; dayzero train has none (its runtime keeps the optimizer on the device
# and trains bf16), so :func:`train_layout` leaves them out
SWITCH_FLAGS = (("fp8_param_gather", "--fp8-param-gather"), ("optimizer_offload", "--optimizer-offload"))
# Layout flags every verb that takes a layout understands; the value is the flag's default,
# None for the degrees always written out (their defaults differ between verbs).
_ALWAYS = ("tp", "pp", "dp", "mbs", "gbs", "seq", "zero")
_WHEN_SET = (("cp", 1), ("ep", 1), ("etp", 1), ("vpp", 1), ("recompute", "none"))


def layout_flags(p: Mapping[str, Any], precision: bool = True) -> list[str]:
    """The ``--tp .. --pp ..`` flags that reproduce a layout (a ``ParallelConfig.to_dict()`` or the
    ``parallel`` of plan/predict JSON). The degrees are always written out; the rest when they
    differ from the default. ``--precision`` is the memory and runtime precision (fp8 for an fp4
    GEMM plan); ``precision=False`` for verbs without the flag (``dayzero validate``)."""
    out: list[str] = []
    for k in _ALWAYS:
        out += [f"--{k}", str(p[k])]
    for k, default in _WHEN_SET:
        if p.get(k, default) != default:
            out += [f"--{k}", str(p[k])]
    if p.get("cp", 1) > 1 and p.get("cp_comm", "p2p") != "p2p":  # Ulysses all-to-all (ParallelConfig.cp_comm)
        out += ["--cp-comm", str(p["cp_comm"])]
    modules = tuple(p.get("recompute_modules") or ())
    if p.get("recompute") == "selective" and modules not in ((), ("core_attn",)):
        out += ["--recompute-modules", ",".join(modules)]
    if p.get("recompute_layers") is not None:
        out += ["--recompute-layers", str(p["recompute_layers"])]
    if p.get("sequence_parallel"):
        out.append("--sequence-parallel")
    for switch, flag in SWITCH_FLAGS:  # the memory switches a plan chose (planner.search.switches)
        if p.get(switch):
            out.append(flag)
    if p.get("activation_offload_layers"):  # the plan's offloaded layers per chunk (planner.memory.activation_offload)
        out += ["--activation-offload", str(p["activation_offload_layers"])]
    if precision and p.get("precision", "bf16") != "bf16":
        out += ["--precision", p["precision"]]
    derived = "interleaved" if p.get("vpp", 1) > 1 else "1f1b"
    if p.get("schedule", derived) != derived:
        out += ["--schedule", p["schedule"]]
    if p.get("layer_split"):
        out += ["--layer-split", ",".join(str(x) for x in p["layer_split"])]
    return out


def train_layout(p: Mapping[str, Any]) -> dict:
    """A plan's layout as ``dayzero train`` takes it: without the memory switches
    (:data:`SWITCH_FLAGS`) and activation offload, which its flags do not carry (export.job.unexpressed names them)."""
    return {**p, **{s: False for s, _ in SWITCH_FLAGS}, "activation_offload_layers": 0}
