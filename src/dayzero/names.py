"""Suggestions for a mistyped name, shared by every lookup by name (presets, accelerators,
clusters, manifests, engines, verbs): the known names nearest to it once case and separators are
ignored (``deepseekv3`` is ``deepseek-v3``, ``H100_SXM`` is ``h100-sxm``), by difflib's
similarity ratio (twice the matching characters over the total, a normalised edit distance),
with a name that contains or is contained in what was typed counted as close (``h1000`` ->
``h100``)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

CUTOFF = 0.6  # difflib.get_close_matches' default: below it two names share too little to suggest
CONTAINED = 0.8  # the score of a name that contains, or is contained in, what was typed


def key(name: str) -> str:
    """``name`` compared without case or separators."""
    return re.sub(r"[^a-z0-9]+", "", name.lower())


def nearest(name: str, known: Iterable[str], n: int = 3) -> list[str]:
    """Up to ``n`` of ``known`` nearest to ``name``, nearest first (ties by name); none when none
    is close (:data:`CUTOFF`)."""
    k = key(name)
    scored: dict[str, float] = {}
    for cand in known:
        c = key(cand)
        if not k or not c:
            continue
        score = difflib.SequenceMatcher(None, k, c).ratio()
        if min(len(k), len(c)) >= 3 and (k in c or c in k):
            score = max(score, CONTAINED)
        if score >= CUTOFF:
            scored[cand] = max(score, scored.get(cand, 0.0))
    return sorted(scored, key=lambda c: (-scored[c], len(c), c))[:n]


def did_you_mean(name: str, known: Iterable[str], n: int = 3) -> str:
    """`` (did you mean a, b?)`` for an error message, or ``""`` when nothing is close."""
    near = nearest(name, known, n)
    return f" (did you mean {', '.join(near)}?)" if near else ""
