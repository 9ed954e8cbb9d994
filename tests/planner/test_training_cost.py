"""Time, energy and cost to train, against values worked by hand from the module's published
constants (Llama 3: 419 interruptions in 54 days on 16,384 H100, a 2 TB/s storage fabric;
Llama 2: energy at TDP x PUE; Young/Daly checkpoint interval)."""

import math

import pytest

from dayzero.errors import ConfigError
from dayzero.planner.facility import FacilityPower
from dayzero.planner.training_cost import (
    INTERRUPTIONS_PER_DEVICE_DAY,
    BatchPhase,
    CostOptions,
    Price,
    batch_ramp,
    goodput,
    optimal_interval,
    schedule_wall_clock,
    training_cost,
)


def test_dense_plan_by_hand():
    """1,024 devices, 10 s steps of 4 Mi tokens, 16 GB of model states per device, 700 W TDP.
    Steps: ceil(1e12 / 4,194,304) = 238,419 -> 27.5948 days of steps. Interruptions:
    419 / (54 x 16384) x 1024 = 0.48495 a day -> MTBF 49.489 h. Checkpoint 16e9 B /
    (2e12 / 16384 B/s) = 131.072 s; Young's interval sqrt(2 x 131.072 x 178,161 s) = 6,834.0 s;
    lost = 131.072 / 6834 + (3417 + 600) / 178,161 -> goodput 0.95827; wall 28.7964 days;
    707,699 device-hours; 700 W x 1024 x 691.1 h = 495.39 MWh."""
    c = training_cost(step_s=10.0, tokens_per_step=4_194_304, devices=1024, model_tflops_per_device=400.0,
                      state_bytes_per_device=16e9, power=DEVICE_ONLY(700),
                      options=CostOptions(tokens=1e12, **LLAMA3_FLAT))
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


DEVICE_ONLY = lambda w: FacilityPower(device_w=w, host_w=0.0, network_w=0.0, pue=1.0, basis=())  # noqa: E731
LLAMA3_FLAT = dict(interruptions_per_device_day=INTERRUPTIONS_PER_DEVICE_DAY, restart_s=600.0)


def test_moe_plan_by_hand():
    """DeepSeek-V3-like: 2,048 devices, 20 s steps of 3,840 x 4,096 tokens, 40 GB states, 14.8T
    tokens, PUE 1.2, host overhead 10 %, $2 per device-hour. Steps 940,959 (217.8146 days); MTBF
    24.7446 h; checkpoint 327.68 s; interval 7,640.67 s; goodput 0.907492; wall 240.0182 days;
    11,797,374 device-hours; 700 x 1.1 x 1.2 W x 2048 x 5760.4 h = 10,900.77 MWh; $23,594,748."""
    c = training_cost(step_s=20.0, tokens_per_step=3840 * 4096, devices=2048, model_tflops_per_device=200.0,
                      state_bytes_per_device=40e9,
                      power=FacilityPower(device_w=700, host_w=70, network_w=0.0, pue=1.2, basis=()),
                      price=Price(2.0, "given"), options=CostOptions(tokens=14.8e12, **LLAMA3_FLAT))
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
                      state_bytes_per_device=0.0, power=None,
                      options=CostOptions(tokens=1e9, interruptions_per_device_day=0.0))
    assert c["goodput"] == 1.0 and c["wall_days"] == c["ideal_days"]
    assert c["energy"] is None and any("no TDP" in a for a in c["assumptions"])


@pytest.mark.parametrize("kw", [dict(tokens=0), dict(pue=0.9), dict(power_fraction=float("nan")),
                                dict(price_per_device_hour=-1), dict(restart_s=float("inf")), dict(async_blocking=2),
                                dict(pue=True), dict(electricity_per_kwh=-0.1), dict(relaunch_s=float("nan"))])
def test_bad_options(kw):
    with pytest.raises(ConfigError):
        CostOptions(**kw)


def test_batch_ramp_by_hand():
    """DeepSeek-V3's schedule (arXiv 2412.19437 sec. 4.2: 3,072 -> 15,360 sequences over the first
    469B of 14.8T tokens), linear, 4 phases in units of dp 128: mid-points at 1/8, 3/8, 5/8, 7/8 of
    the ramp, 3072 + 12288 x f = 4608, 7680, 10752, 13824 sequences (all multiples of 128), 117.25B
    tokens each, then 14.331T tokens at 15,360."""
    phases = batch_ramp(3072, 15360, 469e9, 14.8e12, multiple=128, phases=4)
    assert [p.gbs for p in phases] == [4608, 7680, 10752, 13824, 15360]
    assert [p.tokens for p in phases[:4]] == [pytest.approx(117.25e9)] * 4
    assert phases[4].tokens == pytest.approx(14.331e12)
    # rounding to the layout's unit: 3,000 -> 4,000 in 1 phase: mid 3,500 -> 3,456 (27.34 x 128 rounds to 27)
    assert batch_ramp(3000, 4000, 1e9, 1e9, multiple=128, phases=1) == (BatchPhase(1e9, 3456),)
    with pytest.raises(ConfigError):
        batch_ramp(3072, 15360, 2e12, 1e12)


def test_schedule_wall_clock_by_hand():
    """Two phases, seq 1,000, 8 devices, step_time(gbs) = 1 + gbs / 100 s: 1e6 tokens at 100
    sequences (10 steps of 2 s = 20 s) and 3e6 tokens at 300 (10 steps of 4 s = 40 s): 60 s ideal,
    mean step 3 s. No interruptions and no checkpoint cost: goodput 1, 4e6 / 60 / 8 = 8,333.3
    tokens/s per device. With 1 interruption per device-day (8 a day: MTBF 10,800 s), a 30 s
    checkpoint and a 60 s restart: Young's interval sqrt(2 x 30 x 10800) = 804.98 s; lost
    30 / 804.98 + (402.49 + 60) / 10800 = 0.037268 + 0.042823 = 0.080091 -> goodput 0.919909,
    wall 65.2239 s, 7,665.9 tokens/s per device."""
    phases = (BatchPhase(1e6, 100), BatchPhase(3e6, 300))
    free = CostOptions(interruptions_per_device_day=0.0)
    w = schedule_wall_clock(phases, lambda gbs: 1 + gbs / 100, seq=1000, devices=8, state_bytes_per_device=0.0,
                            options=free)
    assert [r["seconds"] for r in w["phases"]] == [pytest.approx(20.0), pytest.approx(40.0)]
    assert w["goodput"] == 1.0 and w["ideal_s"] == pytest.approx(60.0)
    assert w["tokens_per_s_per_device"] == pytest.approx(4e6 / 60 / 8)
    lossy = CostOptions(interruptions_per_device_day=1.0, restart_s=60.0, storage_bytes_per_s_per_device=1e9)
    w = schedule_wall_clock(phases, lambda gbs: 1 + gbs / 100, seq=1000, devices=8, state_bytes_per_device=30e9,
                            options=lossy)
    assert w["failures"]["checkpoint_interval_s"] == pytest.approx(math.sqrt(2 * 30 * 10800))
    assert w["goodput"] == pytest.approx(0.919909, rel=1e-5)
    assert w["tokens_per_s_per_device"] == pytest.approx(4e6 / (60 / 0.919909) / 8, rel=1e-5)


def test_a_purchase_offer_is_amortized_straight_line():
    """A purchase of P over Y years costs P / (Y x 8,760) a device-hour: 43,800 over 5 years is 1.0."""
    from dayzero.planner.training_cost import offer_rate

    assert offer_rate({"purchase_usd_per_device": 43_800, "amortization_years": 5}) == pytest.approx(1.0)
    assert offer_rate({"usd_per_device_hour": 2.5, "purchase_usd_per_device": 1}) == 2.5  # a rate is taken as given


def test_every_catalog_price_names_its_offer_source_and_date_and_the_others_come_beside_it():
    import json

    from dayzero.planner.training_cost import device_price, offer_rate
    from dayzero.specs.presets import reference_data

    prices = json.loads(reference_data("device_prices.json").read_text())["prices"]
    for card, offers in prices.items():
        names = [o["offer"] for o in offers]
        assert len(set(names)) == len(names), card
        for o in offers:
            assert o["source"].startswith("https://") and o["date"] and o["basis"]
            p = device_price(card, None, o["offer"])
            assert p.per_device_hour == pytest.approx(offer_rate(o)) and p.per_device_hour > 0 and p.url == o["source"]
            assert sorted(n for n, _, _ in p.others) == sorted(n for n in names if n != o["offer"])
        assert device_price(card, None).offer == names[0]  # the first offer is the default
    assert device_price("nvidia_h100_sxm", 3.0).source.startswith("given")  # a given price beats the catalog's


def test_an_offer_the_card_lacks_is_refused_with_those_it_has():
    from dayzero.planner.training_cost import device_price

    with pytest.raises(ConfigError, match="reserved"):
        device_price("nvidia_h100_sxm", None, "spot")
    with pytest.raises(ConfigError, match="--price-per-device-hour"):
        device_price("no_such_card", None, "on-demand")
    assert device_price("no_such_card", None) is None


def test_the_cost_lists_the_other_offers_with_their_totals():
    p = Price(2.0, "given", offer="reserved", others=(("on-demand", 5.0, "src"),))
    out = training_cost(step_s=10.0, tokens_per_step=4 * 2**20, devices=1024, model_tflops_per_device=400,
                        state_bytes_per_device=16e9, power=None, price=p, options=CostOptions())
    c = out["cost"]
    assert c["price_offer"] == "reserved" and c["other_offers"][0]["offer"] == "on-demand"
    assert c["other_offers"][0]["devices_total"] == pytest.approx(c["devices_total"] * 2.5)
