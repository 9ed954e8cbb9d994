"""Derivative-free minimisation for the planner's fits (efficiency constants, microbenchmark curves)."""

from __future__ import annotations

import numpy as np


def first_simplex(x0: np.ndarray, step: float) -> list[np.ndarray]:
    """The n + 1 points Nelder-Mead starts from: ``x0`` and ``x0`` moved ``step`` along each axis."""
    n = len(x0)
    return [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]


def nelder_mead(f, x0: np.ndarray, iterations: int, step: float = 0.15,
                first_values: list[float] | None = None) -> tuple[np.ndarray, float]:
    """Minimise ``f`` from ``x0`` with plain Nelder-Mead (reflection 1, expansion 2, contraction 0.5,
    shrink 0.5; the first simplex steps ``step`` along each axis). ``first_values``: ``f`` at the
    points of :func:`first_simplex`, when the caller has them (several fits sharing one start).
    Returns (best point, its value)."""
    pts = first_simplex(x0, step)
    vals = list(first_values) if first_values is not None else [f(p) for p in pts]
    if len(vals) != len(pts):
        raise ValueError(f"first_values has {len(vals)} values for a simplex of {len(pts)} points")
    for _ in range(iterations):
        order = np.argsort(vals)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        centroid = np.mean(pts[:-1], axis=0)
        xr = centroid + (centroid - pts[-1])
        fr = f(xr)
        if fr < vals[0]:
            xe = centroid + 2 * (centroid - pts[-1])
            fe = f(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = centroid + 0.5 * (pts[-1] - centroid)
            fc = f(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                pts = [pts[0]] + [pts[0] + 0.5 * (p - pts[0]) for p in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
    i = int(np.argmin(vals))
    return pts[i], vals[i]
