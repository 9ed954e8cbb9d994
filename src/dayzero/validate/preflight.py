"""Pre-flight of a validation run: the checks ``dayzero validate`` makes before it starts ranks,
in one function (:func:`preflight_validate`) that the run (:func:`dayzero.validate.run.validate`)
and ``dayzero validate --dry-run`` both call; the check stops there and prints what would run.

Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dayzero.errors import LayoutError
from dayzero.runtime.memory_check import HEADROOM, MemoryNeed
from dayzero.specs.model import ModelSpec

if TYPE_CHECKING:
    from dayzero.validate.run import ValidationRequest

MIN_STEPS = 4  # the Mann-Kendall loss-trend test needs at least 4 points (validate.loss_trend)


@dataclass(frozen=True)
class ValidatePreflight:
    """What a validation run would do: the proxy model, its layout on ``nproc`` ranks, memory."""

    spec: ModelSpec
    request: "ValidationRequest"
    nproc: int
    memory: MemoryNeed

    def to_dict(self, profile: dict | None = None, notes: list[str] | tuple[str, ...] = ()) -> dict:
        from dayzero.specs.counting import params_total

        s, p, m, r = self.spec, self.request.parallel, self.memory, self.request
        return {"ok": True,
                "model": {"name": s.name, "source": r.model.name, "proxy": dict(r.shrink), "params": params_total(s),
                          "layers": s.layers, "hidden": s.hidden, "vocab": s.vocab,
                          "experts": s.moe.experts if s.moe else None},
                "ranks": self.nproc, "layout": p.describe(), "parallel": p.to_dict(), "steps": r.steps,
                "tokens_per_step": p.gbs * p.seq, "compute_dtype": r.compute_dtype, "lr": r.optimizer.lr,
                "memory": {"per_rank_bytes": m.per_rank_bytes, "ranks_sharing": m.ranks_sharing,
                           "need_bytes": m.need_bytes, "available_bytes": m.available_bytes,
                           "usable_bytes": int(HEADROOM * m.available_bytes), "where": m.where, "fits": m.fits},
                "profile": profile, "notes": list(notes)}

    def lines(self, profile_text: str, notes: list[str] | tuple[str, ...] = ()) -> list[str]:
        from dayzero.specs.counting import params_total

        s, p, m, r, GiB = self.spec, self.request.parallel, self.memory, self.request, 2**30
        proxy = ", ".join(f"{k} {v}" for k, v in r.shrink.items()) or "full size"
        return [f"{s.name} ({proxy}; {params_total(s) / 1e6:,.1f} M parameters): {p.describe()} on {self.nproc} "
                f"rank(s), {r.steps} steps in {r.compute_dtype}; {p.gbs * p.seq:,} tokens per step",
                f"memory: {m.per_rank_bytes / GiB:,.2f} GiB per rank x {m.ranks_sharing} = {m.need_bytes / GiB:,.2f} "
                f"GiB of {m.available_bytes / GiB:,.2f} GiB available on the {m.where} ({HEADROOM:.0%} usable)",
                f"profile: {profile_text}", *[f"note: {n}" for n in notes],
                "dry run passed: nothing was started or written (drop --dry-run to run)"]


def preflight_validate(request: "ValidationRequest", nproc: int) -> ValidatePreflight:
    """Every check of a validation run before its ranks start (raises DayzeroError: one line)."""
    from dayzero.runtime.checks import check_runtime
    from dayzero.runtime.memory_check import check_memory

    spec = request.spec()
    check_runtime(spec, request.parallel, nproc)
    need = check_memory(spec, request.parallel, nproc, request.compute_dtype, override=None)
    if request.steps < MIN_STEPS:
        raise LayoutError(f"--steps {request.steps}: the loss-trend test needs at least {MIN_STEPS} steps (12 or more "
                          "is better)")
    return ValidatePreflight(spec, request, nproc, need)
