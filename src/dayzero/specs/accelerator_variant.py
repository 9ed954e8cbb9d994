"""An accelerator as it was run, not as the catalog lists it: a power cap, another memory size,
or one die of a multi-die package exposed as its own device.

Read from free text ("H100 SXM5 500W", "H100 96GB", "Ascend 910C per die") or given as options
(``--power-limit W``). Each change returns a sentence saying what was assumed.

* **Power cap.** Dynamic power is C V^2 f and, across the DVFS range, the supply voltage scales
  roughly with the clock, so power goes as f^3 (Hennessy & Patterson, *Computer Architecture: A
  Quantitative Approach*, 6th ed., section 1.5, "Power and energy"; the cube law behind DVFS). A
  card capped at W below its TDP therefore sustains a clock of (W / TDP)^(1/3) of its rated one
  under a load that reaches TDP (dense GEMMs do), and its peak FLOP/s scale with the clock.
  HBM runs on its own clock and keeps its bandwidth. The model leaves static power in the cap's
  budget (which would deepen the loss) and assumes the load reaches TDP (which overstates it).
* **Memory size.** A size in GB stated in the text that differs from the catalog's (H100 96 GB
  HBM2e, H100 NVL 94 GB) replaces the device memory; the bandwidth is the catalog's unless the text
  states TB/s.
* **Per die.** A package of N dies (the catalog's ``dies_per_package``, or "(N dies)"/"dual-die" in
  its name or form factor) run as one device per die ("per die", "die" in the text; MindSpeed runs
  an Atlas 800T A3 as 16 devices, one per 910C die): each device has 1/N of the package's compute,
  memory, memory bandwidth and links, and a node holds N times as many devices.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from dayzero.errors import ConfigError
from dayzero.specs.hardware import HBM_GB, Accelerator

_WATTS = re.compile(r"(?<![\d.])(\d{2,4})\s{0,2}w\b", re.I)
_GB = re.compile(r"(?<![\d.])(\d{2,3})\s{0,2}gb\b", re.I)
_TBPS = re.compile(r"(?<![\d.])(\d{1,2}(?:\.\d{1,3})?)\s{0,2}tb/s", re.I)
_PER_DIE = re.compile(r"\bper[- ]die\b|(?<![-\w])die\b(?!-)", re.I)  # "dual-die" and "(2 dies)" name the package
_ALREADY_PER_DIE = re.compile(r"per[-_ ]die|one die", re.I)
_DIES = re.compile(r"\((\d)\s{0,2}dies\)|\b(dual|two|quad)[- ]die\b", re.I)
_DIE_WORDS = {"dual": 2, "two": 2, "quad": 4}
POWER_EXPONENT = 1 / 3  # clock ~ power^(1/3) under DVFS (module docstring)


@dataclass(frozen=True)
class Variant:
    """What differs from the catalog entry (None / False: as listed)."""

    power_limit_w: float | None = None
    hbm_gib: float | None = None
    hbm_tbytes_per_s: float | None = None
    per_die: bool = False


def read_variant(text: str) -> Variant:
    """The variant an accelerator's free text names (module docstring)."""
    w = _WATTS.search(text or "")
    gb = _GB.search(text or "")
    tb = _TBPS.search(text or "")
    return Variant(power_limit_w=float(w.group(1)) if w else None, hbm_gib=float(gb.group(1)) if gb else None,
                   hbm_tbytes_per_s=float(tb.group(1)) if tb else None, per_die=bool(_PER_DIE.search(text or "")))


def dies_of(acc: Accelerator) -> int:
    """Dies per package: the catalog's count, or what its name says ("(2 dies)", "dual-die")."""
    if _ALREADY_PER_DIE.search(f"{acc.id} {acc.name}"):
        return 1  # a catalog entry for one die already
    if acc.dies_per_package > 1:
        return acc.dies_per_package
    m = _DIES.search(acc.name)
    if not m:
        return 1
    return int(m.group(1)) if m.group(1) else _DIE_WORDS[m.group(2).lower()]


def power_factor(acc: Accelerator, watts: float) -> float:
    """Peak FLOP/s at a ``watts`` cap over the rated peak (1 at or above TDP)."""
    if watts <= 0:
        raise ConfigError("--power-limit", None, f"{watts:g} W: a power limit must be positive")
    if acc.tdp_w is None:
        raise ConfigError("--power-limit", None, f"{acc.name} has no TDP in the catalog, so a power cap cannot be "
                                                 "priced; drop --power-limit or use a calibrated profile")
    return min(1.0, watts / acc.tdp_w) ** POWER_EXPONENT


def apply_variant(acc: Accelerator, v: Variant) -> tuple[Accelerator, tuple[str, ...]]:
    """``acc`` as run under ``v``, and what was assumed."""
    notes = []
    if v.per_die:
        n = dies_of(acc)
        if n > 1:
            acc = per_die(acc, n)
            notes.append(f"one device per die: {acc.name} ({1 / n:.3g} of the package's compute, memory and links)")
    if v.hbm_gib is not None and abs(v.hbm_gib * HBM_GB - acc.hbm_bytes) > 0.5 * HBM_GB:
        acc = replace(acc, id=f"{acc.id}_{v.hbm_gib:g}gb", hbm_bytes=int(v.hbm_gib * HBM_GB),
                      name=f"{acc.name} ({v.hbm_gib:g} GB variant)")
        notes.append(f"{v.hbm_gib:g} GB device memory as stated (catalog {acc.name.split(' (')[0]}); "
                     + ("bandwidth as stated" if v.hbm_tbytes_per_s else "the catalog's memory bandwidth kept"))
    if v.hbm_tbytes_per_s is not None:
        acc = replace(acc, hbm_bw=v.hbm_tbytes_per_s * 1e12)
    if v.power_limit_w is not None:
        acc, note = power_capped(acc, v.power_limit_w)
        notes.append(note)
    return acc, tuple(notes)


def power_capped(acc: Accelerator, watts: float) -> tuple[Accelerator, str]:
    """``acc`` at a ``watts`` power cap (module docstring) and the sentence saying so."""
    f = power_factor(acc, watts)
    if f >= 1.0:
        return acc, f"power limit {watts:g} W at or above the {acc.tdp_w:g} W TDP: rated clocks"
    capped = replace(acc, id=f"{acc.id}_{watts:g}w", name=f"{acc.name} at {watts:g} W",
                     peak_flops={k: p * f for k, p in acc.peak_flops.items()},
                     gemm_flops_measured={k: p * f for k, p in acc.gemm_flops_measured.items()},
                     tdp_w=watts)
    return capped, (f"power limit {watts:g} W of {acc.tdp_w:g} W TDP: peak FLOP/s x {f:.3f} ((W/TDP)^(1/3), "
                    "clock ~ power^(1/3) under DVFS); memory bandwidth unchanged")


def per_die(acc: Accelerator, n: int) -> Accelerator:
    """One die of an ``n``-die package as its own device."""
    def part(x):
        return None if x is None else x / n
    return replace(acc, id=f"{acc.id}_per_die", name=f"{acc.name} (one die of {n})",
                   peak_flops={k: p / n for k, p in acc.peak_flops.items()},
                   gemm_flops_measured={k: p / n for k, p in acc.gemm_flops_measured.items()},
                   hbm_bytes=acc.hbm_bytes // n, hbm_bw=part(acc.hbm_bw), devices_per_node=acc.devices_per_node * n,
                   scaleup_domain=acc.scaleup_domain * n, intra_node_bw=part(acc.intra_node_bw),
                   intra_node_p2p_bw=part(acc.intra_node_p2p_bw), inter_node_bw=part(acc.inter_node_bw),
                   tdp_w=part(acc.tdp_w), dies_per_package=1)
