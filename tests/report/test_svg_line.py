"""svg.line: the proxy run's loss curve, one dot per step, on an axis that spans the data."""

import re

from dayzero.report.svg import line


def test_one_dot_per_value_and_the_curve_falls_on_screen():
    out = line("loss", [6.0, 5.5, 5.0, 4.0], "step", "loss")
    assert out.startswith("<svg") and out.endswith("</svg>") and "<title>loss</title>" in out
    ys = [float(y) for y in re.findall(r'<circle cx="[\d.]+" cy="([\d.]+)"', out)]
    assert len(ys) == 4 and ys == sorted(ys)  # falling loss: screen y grows
    assert min(ys) >= 30 and max(ys) <= 330  # inside the plot area
    assert "<polyline" in out


def test_constant_and_single_values_draw():
    for ys in ([3.0, 3.0, 3.0], [2.5]):
        out = line("loss", ys, "step", "loss")
        assert out.count("<circle") == len(ys) and "nan" not in out


def test_step_ticks_are_evenly_spaced_integers():
    out = line("loss", [8.0 - i * 0.5 for i in range(8)], "step", "loss")
    ticks = [int(t) for t in re.findall(r'text-anchor="middle">(\d+)</text>', out)]
    assert ticks == [1, 3, 5, 7, 8]
