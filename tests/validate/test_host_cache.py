"""validate without --cluster: the host is measured once, the profile cached by host and torch
version, and reused."""

import json

import pytest

pytest.importorskip("torch")

from dayzero.validate import host_cache  # noqa: E402
from dayzero.validate.profile import build_profile, write_profile  # noqa: E402
from helpers.measurements import measurements  # noqa: E402


def _fake_measure(calls):
    def measure(nproc, out, quick, name):
        calls.append((nproc, quick))
        write_profile(build_profile(measurements(ranks=nproc)), out)
        return {}
    return measure


def test_measured_once_then_reused(tmp_path, monkeypatch):
    monkeypatch.setenv(host_cache.CACHE_ENV, str(tmp_path))
    calls, said = [], []
    first = host_cache.cached_profile(2, said.append, _fake_measure(calls))
    again = host_cache.cached_profile(2, said.append, _fake_measure(calls))
    assert first == again and first.exists() and first.parent == tmp_path / "profiles"
    assert calls == [(2, True)], "the quick calibration runs once"
    assert "measuring one" in said[0] and "cached" in said[1]
    assert not [p for p in first.parent.iterdir() if ".tmp" in p.name], "no half-written profile is left"
    host_cache.cached_profile(4, said.append, _fake_measure(calls))
    assert calls[-1] == (4, True), "another rank count is another measurement"


def test_the_key_changes_with_torch_and_host(monkeypatch):
    import torch

    k = host_cache.HostKey.here(2)
    monkeypatch.setattr(torch, "__version__", k.torch + ".post1")
    assert host_cache.HostKey.here(2).digest() != k.digest()
    assert json.loads(json.dumps(k.__dict__))["nproc"] == 2


def test_an_unwritable_cache_is_one_clear_error(tmp_path, monkeypatch):
    from dayzero.errors import ConfigError

    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(host_cache.CACHE_ENV, str(blocker / "sub"))
    with pytest.raises(ConfigError, match="DAYZERO_CACHE_DIR"):
        host_cache.cached_profile(2, measure=_fake_measure([]))


@pytest.mark.slow
def test_validate_runs_on_a_fresh_machine_with_no_profile(tmp_path, monkeypatch, capsys):
    from dayzero.cli.app import main

    monkeypatch.setenv(host_cache.CACHE_ENV, str(tmp_path))
    args = ["validate", "tiny-llama", "--nproc", "2", "--dp", "2", "--seq", "64", "--mbs", "2", "--steps", "4",
            "--layers", "2", "--hidden", "64", "--json"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["run"]["ranks"] == 2
    assert len(list((tmp_path / "profiles").glob("host-2r-*.yaml"))) == 1
