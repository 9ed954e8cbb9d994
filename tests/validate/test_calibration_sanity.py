"""Calibration fits are checked against physical bounds before a profile is written."""

import pytest

from dayzero.cli.app import main
from dayzero.specs.hardware import get_accelerator
from dayzero.validate import calibrate as cal
from dayzero.validate.profile import build_profile, gemm_rate
from dayzero.validate.sanity import EXTRAPOLATION, CalibrationRejected, check_fits, fit_problems, fit_warnings
from helpers.measurements import gemm_rows, measurements


def unsaturated(m: dict) -> dict:
    """bf16 GEMMs whose rate still grows linearly at the largest size measured (an oversubscribed
    host): the fitted asymptote runs off far beyond anything measured."""
    m = dict(m)
    m["gemm"] = [r for r in m["gemm"] if r["dtype"] != "bf16"] + gemm_rows("bf16", 1.5e14, 6e8)
    return m


def beyond_the_cores(m: dict) -> dict:
    """bf16 GEMMs of 10 TFLOP/s per rank: 8 ranks on the fixture's 2 cores exceed 2 cores x 6 GHz x
    1,024 FLOP/cycle = 12.3 TFLOP/s."""
    m = dict(m)
    m["gemm"] = [r for r in m["gemm"] if r["dtype"] != "bf16"] + gemm_rows("bf16", 1e13, 40)
    return m


def test_a_sound_fit_passes():
    assert fit_problems(build_profile(measurements())) == []
    assert check_fits(build_profile(measurements())) == []


def test_an_unsaturated_gemm_fit_is_capped_and_written_with_a_warning():
    """Rates still rising linearly at the largest size fix only peak / half-dim: the free fit ran
    off to 1.5e14 FLOP/s with half-dim 6e17 on a 2-core CPU (issue #13). The fit is capped at
    EXTRAPOLATION x the fastest GEMM measured, reproduces the measurements, and says so."""
    m = unsaturated(measurements())
    prof = build_profile(m)
    f = prof["measurements"]["fits"]["bf16"]
    fastest = max(gemm_rate(r) for r in m["gemm"] if r["dtype"] == "bf16")
    assert f["bounded"] and f["peak_tflops"] * 1e12 == pytest.approx(EXTRAPOLATION * fastest)
    assert f["half_dim"] < 1e5 and f["gemm_fit_mape"] < 0.25  # within the measured range, not 6e8
    assert not prof["measurements"]["fits"]["fp32"]["bounded"]
    assert fit_problems(prof) == []
    (w,) = [w for w in fit_warnings(prof) if "still rising" in w]
    assert w.startswith("bf16 GEMM rate still rising") and "capped at 2x" in w


def test_an_extrapolated_gemm_asymptote_is_refused():
    """A profile whose asymptote lies beyond EXTRAPOLATION x the fastest GEMM (built other than by
    fit_gemm) breaks the bound."""
    prof = build_profile(measurements())
    f = prof["measurements"]["fits"]["bf16"]
    f["peak_tflops"] *= 50
    problems = fit_problems(prof)
    assert any("bf16 GEMM peak" in p and "extrapolated" in p for p in problems)


def test_gemm_rates_beyond_the_cores_are_refused():
    problems = fit_problems(build_profile(beyond_the_cores(measurements())))
    assert any("exceeds what 2 CPU core(s) can compute" in p for p in problems)


def test_a_gpu_fit_above_the_datasheet_is_refused():
    m = measurements(device="cuda", ranks=1)
    m["gemm"] = gemm_rows("bf16", 2.0e15, 90) + gemm_rows("fp32", 20e12, 40)
    h100 = get_accelerator("h100")
    problems = fit_problems(build_profile(m, None, h100), h100)
    assert any("exceeds" in p and "datasheet" in p for p in problems)


def test_link_faster_than_host_memory_is_refused():
    m = measurements()
    m["memory_bandwidth"] = [{"op": "triad", "bytes": 3e6, "seconds": 0.1, "gbytes_per_s": 0.03}]
    problems = fit_problems(build_profile(m))
    assert any("exceeds the host's memory bandwidth" in p for p in problems)


def test_a_poor_fit_is_written_with_a_warning():
    prof = build_profile(measurements())
    prof["measurements"]["link_fit"]["mape"]["send_recv"] = 1.41
    (w,) = fit_warnings(prof)
    assert "send_recv fit error 141%" in w


def test_calibrate_writes_nothing_for_an_absurd_fit(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cal, "measure", lambda nproc, quick=False, skip=(): beyond_the_cores(measurements()))
    out = tmp_path / "host.yaml"
    with pytest.raises(CalibrationRejected, match="calibration not written"):
        cal.calibrate(8, out)
    assert not out.exists()
    assert main(["calibrate", "--nproc", "8", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dayzero: error: calibration not written") and "Traceback" not in err
    assert not out.exists()
