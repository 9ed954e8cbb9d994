"""The reference data ships inside the package: backtest, presets and tests need nothing beside the
checkout."""

from __future__ import annotations

import pytest

from dayzero.cli.app import main
from dayzero.errors import ConfigError
from dayzero.planner.backtest.published import default_runs, read_rows
from dayzero.specs.presets import REFERENCE_FILES, reference_data
from helpers.paths import REPO

SHARED = REPO.parent / "shared" / "data"


@pytest.mark.parametrize("name", REFERENCE_FILES)
def test_every_reference_file_is_shipped_with_its_source_notes(name):
    path = reference_data(name)
    assert path.is_file() and path.stat().st_size > 1000
    assert name in (path.parent / "README.md").read_text()


def test_an_unknown_reference_file_is_one_clear_error():
    with pytest.raises(ConfigError, match="not a shipped reference file"):
        reference_data("nope.csv")


def test_backtest_defaults_to_the_shipped_runs(capsys):
    assert read_rows() == read_rows(default_runs())
    assert len(read_rows()) == 448
    assert main(["backtest", "--worst", "0"]) == 0
    out = capsys.readouterr().out
    assert "rows predicted" in out and "MAPE" in out


def test_a_non_utf8_runs_file_is_one_clear_error(tmp_path):
    f = tmp_path / "runs.csv"
    f.write_bytes(b"id,model\n\xff\xfe,x\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        read_rows(f)
    with pytest.raises(ConfigError, match="is a directory"):
        read_rows(tmp_path)


@pytest.mark.skipif(not SHARED.is_dir(), reason="the workspace's shared/data is not beside this checkout")
@pytest.mark.parametrize("name", ["published_runs_dev.csv", "model_configs.json"])
def test_shipped_copies_match_the_workspace_reference(name):
    """Where the workspace's reference folder is beside the checkout, the shipped copy is the same
    file (the hardware catalog is extended by dayzero and so is not compared)."""
    assert reference_data(name).read_bytes() == (SHARED / name).read_bytes()
