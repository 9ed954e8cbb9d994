"""Time, energy and cost to train, against values worked by hand from the module's published
constants (Llama 3: 419 interruptions in 54 days on 16,384 H100, a 2 TB/s storage fabric;
Llama 2: energy at TDP x PUE; Young/Daly checkpoint interval)."""

import math

import pytest

from dayzero.errors import ConfigError
from dayzero.planner.training_cost import CostOptions, goodput, optimal_interval, training_cost


def test_dense_plan_by_hand():
    """1,024 devices, 10 s steps of 4 Mi tokens, 16 GB of model states per device, 700 W TDP.
    Steps: ceil(1e12 / 4,194,304) = 238,419 -> 27.5948 days of steps. Interruptions:
    419 / (54 x 16384) x 1024 = 0.48495 a day -> MTBF 49.489 h. Checkpoint 16e9 B /
    (2e12 / 16384 B/s) = 131.072 s; Young's interval sqrt(2 x 131.072 x 178,161 s) = 6,834.0 s;
    lost = 131.072 / 6834 + (3417 + 600) / 178,161 -> goodput 0.95827; wall 28.7964 days;
    707,699 device-hours; 700 W x 1024 x 691.1 h = 495.39 MWh."""
    c = training_cost(step_s=10.0, tokens_per_step=4_194_304, devices=1024, model_tflops_per_device=400.0,
                      state_bytes_per_device=16e9, tdp_w=700, options=CostOptions(tokens=1e12))
    assert c["steps"] == 238_419
    assert c["ideal_days"] == pytest.approx(27.594792, rel=1e-6)
    assert c["failures"]["mtbf_hours"] == pytest.approx(49.489260, rel=1e-6)
    assert c["failures"]["checkpoint_s"] == pytest.approx(131.072, rel=1e-9)
    assert c["failures"]["optimal_checkpoint_interval_s"] == pytest.approx(6834.027, rel=1e-6)
    assert c["goodput"] == pytest.approx(0.9582736, rel=1e-6)
    assert c["wall_days"] == pytest.approx(28.796359, rel=1e-6)
    assert c["device_hours"] == pytest.approx(707_699.33, rel=1e-6)
    assert c["energy"]["mwh"] == pytest.approx(495.38953, rel=1e-6)
    assert c["energy"]["model_tflops_per_w"] == pytest.approx(400 / 700)
    assert c["energy"]["cluster_mw"] == pytest.approx(0.7168)
    assert c["cost"] is None


def test_moe_plan_by_hand():
    """DeepSeek-V3-like: 2,048 devices, 20 s steps of 3,840 x 4,096 tokens, 40 GB states, 14.8T
    tokens, PUE 1.2, host overhead 10 %, $2 per device-hour. Steps 940,959 (217.8146 days); MTBF
    24.7446 h; checkpoint 327.68 s; interval 7,640.67 s; goodput 0.907492; wall 240.0182 days;
    11,797,374 device-hours; 700 x 1.1 x 1.2 W x 2048 x 5760.4 h = 10,900.77 MWh; $23,594,748."""
    c = training_cost(step_s=20.0, tokens_per_step=3840 * 4096, devices=2048, model_tflops_per_device=200.0,
                      state_bytes_per_device=40e9, tdp_w=700,
                      options=CostOptions(tokens=14.8e12, pue=1.2, host_overhead=0.1, price_per_device_hour=2.0))
    assert c["steps"] == 940_959
    assert c["failures"]["mtbf_hours"] == pytest.approx(24.744630, rel=1e-6)
    assert c["goodput"] == pytest.approx(0.90749200, rel=1e-6)
    assert c["wall_days"] == pytest.approx(240.018186, rel=1e-6)
    assert c["energy"]["mwh"] == pytest.approx(10_900.7735, rel=1e-6)
    assert c["cost"]["total"] == pytest.approx(23_594_747.7, rel=1e-6)


def test_young_interval_minimises_the_loss():
    d, m, r = 60.0, 86_400.0, 600.0
    t = optimal_interval(d, m)
    assert t == pytest.approx(math.sqrt(2 * 60 * 86_400))
    for other in (t / 2, t * 2):
        assert goodput(d, t, r, m) > goodput(d, other, r, m)


def test_no_failures_no_loss_but_the_checkpoints():
    c = training_cost(step_s=1.0, tokens_per_step=1e6, devices=8, model_tflops_per_device=1.0,
                      state_bytes_per_device=0.0, tdp_w=None,
                      options=CostOptions(tokens=1e9, interruptions_per_device_day=0.0))
    assert c["goodput"] == 1.0 and c["wall_days"] == c["ideal_days"]
    assert c["energy"] is None and any("no TDP" in a for a in c["assumptions"])


@pytest.mark.parametrize("kw", [dict(tokens=0), dict(pue=0.9), dict(power_fraction=float("nan")),
                                dict(price_per_device_hour=-1), dict(restart_s=float("inf")), dict(async_blocking=2)])
def test_bad_options(kw):
    with pytest.raises(ConfigError):
        CostOptions(**kw)
