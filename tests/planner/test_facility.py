"""Facility power (planner/facility.py) against hand-computed cases from the shipped figures."""

import pytest

from dayzero.errors import ConfigError
from dayzero.planner.facility import FacilityPower, PowerOptions, clos_switches, facility_data, facility_power
from dayzero.planner.training_cost import CostOptions, training_cost
from dayzero.specs.cluster import build_cluster


def test_facility_energy_is_device_plus_host_plus_network_times_pue():
    """512 H100 in 64 DGX H100: device 700 W; host (10,200 W - 8 x 700 W) / 8 = 575 W; network: a
    2-level fat tree of 64-port switches over 512 NICs, 2 x 512 / 64 = 16 leaves + 512 / 64 = 8
    spines = 24 switches x 1,720 W / 512 = 80.625 W; PUE 1.56 ->
    (700 + 575 + 80.625) x 1.56 = 2,114.775 W per device."""
    p = facility_power(build_cluster("h100", 512))
    assert (p.device_w, p.host_w) == (700, 575)
    assert p.network_w == pytest.approx(24 * 1720 / 512)
    assert p.pue == facility_data()["pue"]["value"] == 1.56
    assert p.facility_w == pytest.approx((700 + 575 + 80.625) * 1.56)
    # the run's energy at each level: 10 days on 512 devices
    c = training_cost(step_s=1.0, tokens_per_step=1e6, devices=512, model_tflops_per_device=100.0,
                      state_bytes_per_device=0.0, power=p,
                      options=CostOptions(tokens=864_000e6, interruptions_per_device_day=0.0))
    hours = 864_000 / 3600
    e = c["energy"]
    assert e["device_mwh"] == pytest.approx(700 * 512 * hours / 1e6)
    assert e["node_mwh"] == pytest.approx(1275 * 512 * hours / 1e6)
    assert e["mwh"] == pytest.approx(p.facility_w * 512 * hours / 1e6)
    assert e["tokens_per_joule"]["device"] == pytest.approx(864_000e6 / (700 * 512 * 864_000))


def test_one_node_has_no_switches_and_an_unknown_system_says_so():
    assert facility_power(build_cluster("h100", 8)).network_w == 0
    p = facility_power(build_cluster("910b", 64))
    assert p.host_w == 575 and any("assumed" in b for b in p.basis)


def test_clos_levels():
    assert clos_switches(1, 64) == 0
    assert clos_switches(64, 64) == 1  # one switch holds them all
    assert clos_switches(2048, 64) == 64 + 32  # 2 levels: 2N/k leaves + N/k spines
    assert clos_switches(16384, 64) == 2 * 512 + 256  # 3 levels


def test_overrides_and_bad_values():
    cl = build_cluster("h100", 512)
    p = facility_power(cl, PowerOptions(pue=1.0, host_overhead=0.0, switch_w_per_device=0.0))
    assert p.facility_w == 700
    for bad in (dict(pue=0.9), dict(power_fraction=0), dict(host_w_per_device=float("inf")), dict(pue=True)):
        with pytest.raises(ConfigError):
            PowerOptions(**bad)
    assert isinstance(p, FacilityPower)
