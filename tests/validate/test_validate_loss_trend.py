"""The loss-trend test: Mann-Kendall + Theil-Sen, robust to noise and outliers."""

import math

import numpy as np
import pytest

from dayzero.validate.loss_trend import loss_trend, theil_sen


def test_strictly_decreasing_matches_hand_computation():
    # n = 10 strictly decreasing: S = -45, Var(S) = 10*9*25/18 = 125, Z = (S + 1)/sqrt(125)
    t = loss_trend(np.arange(10, 0, -1.0))
    assert t.s == -45
    assert t.z == pytest.approx(-44 / math.sqrt(125))
    assert t.p_value == pytest.approx(0.5 * math.erfc(44 / math.sqrt(125) / math.sqrt(2)))
    assert t.slope == pytest.approx(-1.0) and t.decreasing


def test_noisy_training_curve_passes_and_noise_fails():
    rng = np.random.default_rng(0)
    x = np.arange(40)
    curve = 6 * np.exp(-x / 12) + 2 + 0.15 * rng.standard_normal(40)
    assert loss_trend(curve).decreasing
    flat = 3 + 0.3 * rng.standard_normal(40)
    t = loss_trend(flat)
    assert not t.decreasing and "no significant decrease" in t.reason() or "not decreasing" in t.reason()


def test_diverging_and_nan_losses_fail():
    x = np.arange(20)
    assert not loss_trend(3 + 0.05 * x ** 2).decreasing
    t = loss_trend([5.0, 4.0, 3.5, float("inf"), 3.0])
    assert not t.finite and not t.decreasing and "NaN or infinite" in t.reason()


def test_last_below_first_is_not_enough():
    # first point high, last point low, but the series in between rises: not a decrease
    y = [5.0] + list(np.linspace(2.0, 4.5, 18)) + [1.0]
    assert y[-1] < y[0]
    assert not loss_trend(y).decreasing


def test_too_few_points_fail_with_a_reason():
    t = loss_trend([3.0, 2.0, 1.0])
    assert not t.decreasing and "too few" in t.reason()


def test_theil_sen_ignores_outliers():
    x = np.arange(20.0)
    y = 10 - 0.5 * x
    y[[3, 11]] += 40  # two wild outliers
    slope, intercept, lo, hi = theil_sen(x, y)
    assert slope == pytest.approx(-0.5, abs=1e-9)
    assert lo <= slope <= hi


def test_autocorrelation_inflates_variance():
    rng = np.random.default_rng(1)
    walk = np.cumsum(rng.standard_normal(60)) * 0.05 + np.linspace(3, 2.9, 60)
    t = loss_trend(walk)
    assert t.variance_factor >= 1.0
    d = t.to_dict()
    assert set(d) >= {"slope", "p_value", "decreasing", "reason", "relative_change"}
