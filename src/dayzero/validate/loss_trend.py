"""Is the training loss going down? A robust test, not "last < first".

Two classic non-parametric tools, both insensitive to outliers and to the noise of small batches:

* **Mann-Kendall** trend test (Mann 1945, "Nonparametric tests against trend", Econometrica 13;
  Kendall 1975, "Rank Correlation Methods"): S = sum over pairs i < j of sign(x_j - x_i), its
  variance n(n-1)(2n+5)/18 minus the tie correction, and the one-sided p-value of a decrease
  from the continuity-corrected normal approximation Z = (S + 1) / sqrt(Var S) for S < 0.
* **Theil-Sen** slope (Theil 1950; Sen 1968, "Estimates of the regression coefficient based on
  Kendall's tau", JASA 63): the median of all pairwise slopes, with its distribution-free 95 %
  interval from the ranks of the ordered slopes (Sen 1968, eq. 2.6).

Training losses are autocorrelated (the same weights see consecutive batches), which makes
Mann-Kendall too eager. The variance is inflated by the effective-sample-size factor of Hamed &
Rao (1998, "A modified Mann-Kendall trend test for autocorrelated data", J. Hydrology 204),
using only the lags whose autocorrelation of the detrended ranks is significant at 5 %.

The loss passes when every value is finite, the slope is negative, and the decrease is
significant (p < ``alpha``, default 0.05).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

Z_95 = 1.959963984540054  # two-sided 95 % normal quantile


@dataclass(frozen=True)
class LossTrend:
    n: int  # points tested
    finite: bool  # no NaN or inf anywhere in the series
    slope: float  # Theil-Sen slope, loss per step
    slope_low: float  # 95 % interval of the slope
    slope_high: float
    s: int  # Mann-Kendall statistic (negative: mostly decreasing)
    z: float
    p_value: float  # one-sided p of a decrease
    variance_factor: float  # Hamed-Rao autocorrelation correction applied to Var(S)
    start: float  # Theil-Sen line at the first and last tested step
    end: float
    alpha: float

    @property
    def relative_change(self) -> float:
        """(end - start) / |start| along the fitted line: -0.3 is a 30 % decrease."""
        return (self.end - self.start) / abs(self.start) if self.start else float("nan")

    @property
    def decreasing(self) -> bool:
        return self.finite and self.n >= 4 and self.slope < 0 and self.p_value < self.alpha

    def reason(self) -> str:
        if not self.finite:
            return "the loss became NaN or infinite"
        if self.n < 4:
            return f"{self.n} points are too few for a trend test (need >= 4 steps)"
        if self.decreasing:
            return (f"decreasing: Theil-Sen slope {self.slope:.3g}/step (95 % CI {self.slope_low:.3g} to "
                    f"{self.slope_high:.3g}), Mann-Kendall p = {self.p_value:.2g}")
        if self.slope >= 0:
            return f"not decreasing: Theil-Sen slope {self.slope:.3g}/step is >= 0 (p = {self.p_value:.2g})"
        return f"no significant decrease: Mann-Kendall p = {self.p_value:.2g} >= {self.alpha}"

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(relative_change=self.relative_change, decreasing=self.decreasing, reason=self.reason())
        return d


def theil_sen(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float]:
    """(slope, intercept, slope_low, slope_high): median pairwise slope, median of y - slope x,
    and Sen's 95 % interval."""
    i, j = np.triu_indices(len(x), k=1)
    dx = x[j] - x[i]
    keep = dx != 0
    slopes = np.sort((y[j] - y[i])[keep] / dx[keep])
    slope = float(np.median(slopes))
    intercept = float(np.median(y - slope * x))
    n_s = len(slopes)
    c = Z_95 * math.sqrt(_mk_variance(y))
    lo_i, hi_i = int(math.floor((n_s - c) / 2)), int(math.ceil((n_s + c) / 2))
    lo = float(slopes[max(lo_i, 0)]) if n_s else float("nan")
    hi = float(slopes[min(hi_i, n_s - 1)]) if n_s else float("nan")
    return slope, intercept, lo, hi


def _mk_variance(y: np.ndarray) -> float:
    """Var(S) under no trend, with the tie correction (Kendall 1975)."""
    n = len(y)
    _, counts = np.unique(y, return_counts=True)
    ties = float(np.sum(counts * (counts - 1) * (2 * counts + 5)))
    return (n * (n - 1) * (2 * n + 5) - ties) / 18.0


def _hamed_rao_factor(x: np.ndarray, y: np.ndarray, slope: float) -> float:
    """n / n*: the variance inflation from the significant autocorrelations of the detrended
    series' ranks (Hamed & Rao 1998, eq. 16), lags up to n/3, never below 1."""
    n = len(y)
    resid = np.round(y - slope * x, 12)  # exact ties stay ties (a perfect line has no autocorrelation)
    _, inverse, counts = np.unique(resid, return_inverse=True, return_counts=True)
    r = (np.cumsum(counts) - (counts - 1) / 2.0)[inverse]  # average ranks
    r -= r.mean()
    denom = float(np.sum(r * r))
    if denom == 0 or n < 6:
        return 1.0
    bound = Z_95 / math.sqrt(n)
    total = 0.0
    for k in range(1, max(1, n // 3) + 1):
        rho = float(np.sum(r[:-k] * r[k:]) / denom)
        if abs(rho) > bound:
            total += (n - k) * (n - k - 1) * (n - k - 2) * rho
    return max(1.0, 1.0 + 2.0 / (n * (n - 1) * (n - 2)) * total)


def loss_trend(losses, steps=None, alpha: float = 0.05, skip: int = 0) -> LossTrend:
    """Test ``losses`` (one per step; ``steps`` default 1..n) for a decrease, ignoring the first
    ``skip`` points (e.g. the first step's one-time effects)."""
    y = np.asarray(losses, dtype=float)[skip:]
    x = (np.arange(1, len(y) + 1, dtype=float) if steps is None else np.asarray(steps, dtype=float)[skip:])
    finite = bool(np.all(np.isfinite(y))) and len(y) > 0
    n = len(y)
    if not finite or n < 2:
        nan = float("nan")
        return LossTrend(n=n, finite=finite, slope=nan, slope_low=nan, slope_high=nan, s=0, z=nan, p_value=1.0,
                         variance_factor=1.0, start=nan, end=nan, alpha=alpha)
    i, j = np.triu_indices(n, k=1)
    s = int(np.sum(np.sign(y[j] - y[i])))
    slope, intercept, lo, hi = theil_sen(x, y)
    factor = _hamed_rao_factor(x, y, slope)
    var = _mk_variance(y) * factor
    if var <= 0:
        z = 0.0
    elif s > 0:
        z = (s - 1) / math.sqrt(var)
    elif s < 0:
        z = (s + 1) / math.sqrt(var)
    else:
        z = 0.0
    p = 0.5 * math.erfc(-z / math.sqrt(2))  # P(Z <= z): small when strongly decreasing
    return LossTrend(n=n, finite=True, slope=slope, slope_low=lo, slope_high=hi, s=s, z=z, p_value=p,
                     variance_factor=factor, start=float(intercept + slope * x[0]),
                     end=float(intercept + slope * x[-1]),
                     alpha=alpha)
