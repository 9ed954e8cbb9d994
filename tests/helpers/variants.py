"""Brute-force grids for the search's tests: every base layout at every (ZeRO stage, recompute level)."""

from __future__ import annotations

import numpy as np


def at_every_level(bases: dict, zeros, levels) -> tuple[dict, np.ndarray]:
    """``bases`` (a grid) repeated at each ZeRO stage of ``zeros`` x each recompute level of ``levels``
    ((recompute code, module mask) pairs: SearchSpace.levels), base-major: row i * len(zeros) *
    len(levels) + z * len(levels) + j. Returns (the grid, each row's base index)."""
    n = len(bases["tp"])
    zr = [(z, r, m) for z in zeros for r, m in levels]
    grid = {k: np.repeat(np.asarray(v), len(zr)) for k, v in bases.items()}
    grid["zero"] = np.tile(np.array([z for z, _, _ in zr], dtype=np.int64), n)
    grid["recompute"] = np.tile(np.array([r for _, r, _ in zr], dtype=np.int64), n)
    grid["recompute_modules"] = np.tile(np.array([m for _, _, m in zr], dtype=np.int64), n)
    return grid, np.repeat(np.arange(n), len(zr))
