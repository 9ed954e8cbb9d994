"""The seed's rules of thumb, each computed for the model and cluster at hand and marked holds or
does not hold, with the number and the formula behind it.

The claims (the Day-0 brief's own words): "3T parameters in BF16 need about 600 GB", "ZeRO cuts
memory about 8x", "mixed precision cuts memory about 50 %", "activation checkpointing costs about
30 % more compute", and its three targets (MFU > 50 %, peak memory < 85 %, exposed communication
< 15 %). A claim "holds" when the computed figure is within :data:`ABOUT` of the claimed one
("about": a quarter either way); each entry states both numbers, so a reader can judge otherwise.

Formulas: BF16 weights 2 B a parameter; ZeRO's model states per device (Rajbhandari et al. 2020,
"ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", sec. 5, Fig. 1: ``2 + 2 +
K`` B a parameter with Adam's ``K = 12``; stage 1 shards the ``K``, stage 2 also the gradients'
2, stage 3 everything, over the data-parallel degree ``Nd``); mixed precision against FP32
training on the plan's own busiest stage (FP32: 4 B weights + 4 B gradients + 8 B Adam moments =
16 B a parameter and activations at 4 B; BF16 with FP32 master weights and FP32 gradient
accumulation as Megatron-Core keeps them: 2 + 4 + 4 + 8 = 18 B, activations at 2 B); full
recompute replays the forward pass, 2 of the 6 FLOPs a parameter and token (Korthikanti et al.
2022, "Reducing Activation Recomputation in Large Transformer Models", sec. 5: 33 %), and the
plan's own recompute against the same layout without it from the planner's compute time.
"""

from __future__ import annotations

from dayzero.units import gib

ABOUT = 0.25  # "about": within a quarter of the claimed figure
BF16_BYTES = 2
ADAM_K = 12


def _claim(claim: str, computed: float, claimed: float, unit: str, formula: str, text: str | None = None) -> dict:
    holds = abs(computed - claimed) <= ABOUT * abs(claimed)
    return {"claim": claim, "computed": computed, "claimed": claimed, "unit": unit, "holds": holds,
            "formula": formula, "text": text or f"{computed:,.3g} {unit} (claimed about {claimed:,.3g})"}


def weights_claim(params_total: float) -> dict:
    """3T parameters in BF16: 3e12 x 2 B = 6 TB, not 600 GB; and this model's."""
    need = 3e12 * BF16_BYTES / 1e9
    return _claim("3T parameters in BF16 need about 600 GB", need, 600, "GB",
                  "parameters x 2 B (BF16)",
                  f"3T x 2 B = {need:,.0f} GB (claimed 600 GB: off by {need / 600:.0f}x); this model's "
                  f"{params_total / 1e9:,.4g}B parameters: {params_total * BF16_BYTES / 1e9:,.0f} GB")


def zero_factors(dp: int) -> dict[int, float]:
    """Model states without ZeRO over with stage 1, 2, 3 at data-parallel degree ``dp``."""
    whole = 2 + 2 + ADAM_K
    return {1: whole / (2 + 2 + ADAM_K / dp), 2: whole / (2 + (2 + ADAM_K) / dp), 3: whole / (whole / dp)}


def zero_claim(dp: int, stage: int) -> dict:
    f = zero_factors(dp)
    best = min(f, key=lambda s: abs(f[s] - 8))
    return _claim("ZeRO cuts memory about 8x", f[best], 8, "x",
                  "(2 + 2 + 12) / per-device states; stage 1 shards 12, stage 2 also 2, stage 3 all 16 B over dp",
                  f"at this plan's dp {dp}: stage 1 x{f[1]:.2f}, stage 2 x{f[2]:.2f}, stage 3 x{f[3]:.3g} of model "
                  f"states (activations unchanged); the plan runs stage {stage}")


def mixed_precision_claim(stage: dict) -> dict:
    """The busiest stage's memory in BF16 mixed precision against FP32 training."""
    states = stage["weights"] + stage["gradients"] + stage["optimizer"]
    acts = stage["activations"]
    other = stage["total"] - states - acts
    mixed = stage["total"]
    fp32 = states * 16 / 18 + 2 * acts + other
    cut = 1 - mixed / fp32 if fp32 > 0 else 0.0
    return _claim("mixed precision cuts memory about 50 %", 100 * cut, 50, "%",
                  "1 - (states + activations) / (states x 16/18 + 2 x activations): 18 B a parameter with FP32 "
                  "master weights and gradients vs 16 B in FP32; activations halve",
                  f"{cut:.0%} on the busiest stage ({gib(states)} model states, {gib(acts)} activations): model "
                  "states grow 16 -> 18 B a parameter, only activations halve")


def recompute_claim(recompute: str, compute_s: float | None, compute_without_s: float | None) -> dict:
    full = 100 * 2 / 6
    if compute_s is None or compute_without_s is None or recompute == "none":
        return _claim("activation checkpointing costs about 30 % more compute", full, 30, "%",
                      "full recompute replays the forward: 2 of 6 FLOPs a parameter and token",
                      f"full recompute: +{full:.0f} % FLOPs; the plan recomputes nothing")
    extra = 100 * (compute_s / compute_without_s - 1)
    return _claim("activation checkpointing costs about 30 % more compute", extra, 30, "%",
                  "the plan's compute time over the same layout's without recompute (full recompute: +33 % FLOPs)",
                  f"this plan's recompute ({recompute}): +{extra:.1f} % compute time; full recompute +{full:.0f} % "
                  "FLOPs")


def target_claims(checks: list[dict]) -> list[dict]:
    return [{"claim": f"{c['metric']} {c['target']}", "computed": c["value"], "claimed": c["target"],
             "unit": "fraction", "holds": bool(c["pass"]), "formula": "Day-0 target (planner/targets.py)",
             "text": f"{c['value']:.1%} (target {c['target']})"} for c in checks]


def claims(params_total: float, best: dict, compute_without_s: float | None) -> list[dict]:
    """Every claim for the best plan (a ``predict`` object) of a model of ``params_total``."""
    p = best["parallel"]
    busiest = max(best["memory"]["stages"], key=lambda s: s["total"])
    return [weights_claim(params_total), zero_claim(int(p["dp"]), int(p.get("zero", 0))),
            mixed_precision_claim(busiest),
            recompute_claim(str(p.get("recompute", "none")), best["time"]["compute_s"], compute_without_s),
            *target_claims(best["checks"])]
