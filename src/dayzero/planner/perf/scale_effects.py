"""Effects of scale: the wait for the slowest rank at a synchronising collective.

A synchronous training step ends at the data-parallel gradient reduction, a barrier over the
whole world: no rank leaves it before the last one arrives. If every rank's step time varies
independently around the mean with relative standard deviation ``sigma``, the step takes the
*maximum* of N such times. For N independent normals the expected maximum is, to leading order,

    E[max_N] ~ mu * (1 + sigma * sqrt(2 ln N))

(extreme-value / Gumbel asymptotics of the maximum of N Gaussians, e.g. Cramer, "Mathematical
Methods of Statistics" 1946, sec. 28.6; the tail-latency argument of Dean & Barroso, "The Tail at
Scale", CACM 56(2), 2013: a rare per-server slowdown becomes the common case when a request
waits for many servers). It is exact at N = 1 (no wait) and slightly above the true expectation
for small N (N = 2: sqrt(2 ln 2) = 1.18 against the exact 1/sqrt(pi) = 0.56).

Assumed: one barrier per step over all ranks (the DP / DP x CP gradient sync; tensor- and
pipeline-parallel exchanges inside the step synchronise smaller groups and are taken as part of
each rank's noise), noise independent across ranks and steps, normal. Common-mode variation
(Llama 3's diurnal 1-2 % throughput swing, arXiv 2407.21783 sec. 3.3.4, which all GPUs share)
slows every rank alike and is not a straggler effect.
"""

from __future__ import annotations

import numpy as np


def straggler_factor(n_sync_ranks, sigma: float):
    """Expected step time with the wait for the slowest of ``n_sync_ranks`` ranks over the
    step time of one rank: 1 + sigma * sqrt(2 ln N) (1 for N <= 1; array in, array out)."""
    n = np.maximum(np.asarray(n_sync_ranks, dtype=float), 1.0)
    return 1.0 + float(sigma) * np.sqrt(2.0 * np.log(n))
