"""Accelerators as they were run: a power cap, a memory variant and one device per die, read from
a row's accelerator text and given as options."""

from __future__ import annotations

import pytest

from dayzero.errors import ConfigError
from dayzero.planner.backtest.backtest import predict_cases
from dayzero.planner.backtest.published import case_of, read_rows
from dayzero.specs.accelerator_variant import apply_variant, dies_of, power_factor, read_variant
from dayzero.specs.hardware import HBM_GB, get_accelerator
from helpers.paths import data_file


@pytest.fixture(scope="module")
def rows():
    return {r["id"]: r for r in read_rows(data_file("published_runs_dev.csv"))}


def test_a_power_capped_h100_runs_at_the_cube_root_of_its_power_share():
    h100 = get_accelerator("h100")
    capped, notes = apply_variant(h100, read_variant("H100 SXM5 500W"))
    f = (500 / 700) ** (1 / 3)
    assert capped.peak("bf16") == pytest.approx(h100.peak("bf16") * f)
    assert capped.peak("fp8") == pytest.approx(h100.peak("fp8") * f)
    assert capped.hbm_bw == h100.hbm_bw and capped.hbm_bytes == h100.hbm_bytes
    assert any("500 W of 700 W" in n for n in notes)
    assert power_factor(h100, 800) == 1.0
    with pytest.raises(ConfigError):
        power_factor(h100, 0)


def test_a_memory_variant_from_the_text():
    h100 = get_accelerator("h100")
    v, notes = apply_variant(h100, read_variant("H100 SXM5 96GB HBM2e 500W"))
    assert v.hbm_bytes == 96 * HBM_GB and v.peak("bf16") < h100.peak("bf16")
    same, none = apply_variant(h100, read_variant("H100 80GB"))
    assert same == h100 and none == ()


def test_a_per_die_device_is_half_a_dual_die_package():
    c = get_accelerator("910c")
    assert dies_of(c) == 2
    die, notes = apply_variant(c, read_variant("Ascend 910C (per die)"))
    assert die.peak("bf16") == pytest.approx(c.peak("bf16") / 2) and die.hbm_bytes == c.hbm_bytes // 2
    assert die.devices_per_node == 2 * c.devices_per_node and die.intra_node_bw == pytest.approx(c.intra_node_bw / 2)
    assert dies_of(die) == 1  # never halved twice
    package, none = apply_variant(c, read_variant("Ascend 910C (dual-die package)"))
    assert package == c and none == ()
    single, none = apply_variant(get_accelerator("h100"), read_variant("H100 per die"))
    assert single == get_accelerator("h100")  # one die: nothing to split


def test_a_power_capped_row_is_priced_slower_and_says_why(rows):
    base = case_of(rows["R0383"])
    row = {**rows["R0383"], "accelerator": "GB300 (DGX-GB300) capped at 1000W"}
    capped = case_of(row)
    assert capped.cluster.accelerator.peak("bf16") < base.cluster.accelerator.peak("bf16")
    assert any("power limit 1000 W" in a.text for a in capped.assumed if a.kind == "accelerator")
    assert predict_cases([capped])[0] < predict_cases([base])[0]


def test_power_limit_option_slows_predict():
    from typer.testing import CliRunner

    from dayzero.cli.app import app

    def tokens(*extra):
        import json
        r = CliRunner().invoke(app, ["predict", "llama-3.1-8b", "--accelerator", "h100", "--devices", "8", "--json",
                                     *extra])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout[r.stdout.index("{"):])["throughput"]["tokens_per_s_per_device"]

    assert tokens("--power-limit", "500") < tokens()
