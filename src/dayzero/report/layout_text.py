"""A layout in one short line, as every table of plans writes it."""

from __future__ import annotations


def describe(p: dict) -> str:
    """Compact layout string: tp8 pp2 dp512 v32 z3 mb2 rc-full sp."""
    s = f"tp{p['tp']} pp{p['pp']} dp{p['dp']}"
    for k, short in (("cp", "cp"), ("ep", "ep"), ("etp", "etp"), ("vpp", "v")):
        if p.get(k, 1) > 1:
            s += f" {short}{p[k]}"
    s += f" z{p['zero']} mb{p['mbs']}"
    if p["recompute"] != "none":
        s += " rc-" + ("full" if p["recompute"] == "full" else "sel")
    return s + (" sp" if p.get("sequence_parallel") else "")
