"""The exclusion list and the reshape rule a restart without failing ranks follows."""

from __future__ import annotations

import json

import pytest

from dayzero.runtime.resilience.exclusion import (
    Exclusion,
    ExclusionError,
    add_exclusions,
    excluded_slots,
    parse_slots,
    read_exclusions,
    reshape,
    restart_plan,
)
from dayzero.specs.parallel import ParallelConfig


def entry(slot: int, host: str = "n1", rank: int | None = None, step: int = 5) -> Exclusion:
    return Exclusion(rank=slot if rank is None else rank, slot=slot, host=host, reason="straggler", step=step,
                     time="2026-12-01T17:00:00Z")


def test_the_file_merges_across_restarts(tmp_path):
    p = tmp_path / "exclusions.json"
    assert read_exclusions(p) == ()
    add_exclusions(p, [entry(2)])
    got = add_exclusions(p, [entry(2, step=9), entry(1, host="n2")])  # slot 2 of n1 is already out
    assert [(e.host, e.slot, e.step) for e in got] == [("n1", 2, 5), ("n2", 1, 5)]
    assert read_exclusions(p) == got
    assert excluded_slots(got, "n1") == {2} and excluded_slots(got, "n3") == frozenset()
    p.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ExclusionError, match="not a dayzero exclusion list"):
        read_exclusions(p)


def test_dp_drops_to_the_largest_degree_that_keeps_the_global_batch():
    p = ParallelConfig(dp=4, gbs=8, seq=32)
    r = reshape(p, (0, 1, 2, 3), (), frozenset({2}))
    # 3 healthy ranks: dp3 would split 8 sequences unevenly, so dp2 with twice the micro-batches
    assert (r.parallel.dp, r.parallel.gbs, r.parallel.microbatches, r.slots) == (2, 8, 4, (0, 1))
    assert p.microbatches == 2 and r.spares_used == ()
    assert "data parallelism 4 -> 2" in r.describe(p) and "2 -> 4 micro-batches" in r.describe(p)


def test_model_parallel_degrees_are_kept():
    p = ParallelConfig(tp=2, pp=2, dp=2, gbs=8, mbs=2, seq=32)
    r = reshape(p, tuple(range(8)), (), frozenset({5}))
    assert (r.parallel.tp, r.parallel.pp, r.parallel.dp, r.parallel.gbs, r.parallel.microbatches) == (2, 2, 1, 8, 4)
    assert r.slots == (0, 1, 2, 3)


def test_spares_replace_excluded_slots_in_place():
    p = ParallelConfig(dp=4, gbs=8, seq=32)
    r = reshape(p, (0, 1, 2, 3), (4, 5), frozenset({1}))
    assert r.parallel == p and r.slots == (0, 4, 2, 3) and r.spares_used == (4,)
    # an excluded spare is not used; the healthy spare still fills in
    r = reshape(p, (0, 1, 2, 3), (4, 5), frozenset({1, 4}))
    assert r.slots == (0, 5, 2, 3)
    # too few healthy spares: dp is reduced over the active and spare slots together
    r = reshape(p, (0, 1, 2, 3), (4,), frozenset({1, 2}))
    assert r.parallel.dp == 2 and r.slots == (0, 3) and r.spares_used == ()
    assert reshape(p, (0, 1, 2, 3), (4,), frozenset({4})).slots == (0, 1, 2, 3)  # nothing active excluded


def test_expert_parallelism_must_still_divide():
    p = ParallelConfig(dp=4, ep=4, gbs=8, seq=32)
    with pytest.raises(ExclusionError, match="cannot restart without slot"):
        reshape(p, (0, 1, 2, 3), (), frozenset({0}))
    ok = reshape(ParallelConfig(dp=4, ep=2, gbs=8, seq=32), (0, 1, 2, 3), (), frozenset({0}))
    assert ok.parallel.dp == 2 and ok.slots == (1, 2)


def test_impossible_restart_is_one_clear_line():
    p = ParallelConfig(tp=2, dp=1, gbs=4, seq=32)
    with pytest.raises(ExclusionError) as e:
        reshape(p, (0, 1), (), frozenset({1}))
    msg = str(e.value)
    assert "\n" not in msg and "tp x cp x pp = 2" in msg and "--spares" in msg
    # every smaller degree is named with the reason it does not fit
    with pytest.raises(ExclusionError, match=r"dp3: gbs 8 is not a multiple of mbs 1 x dp 3; dp2: .*ep"):
        reshape(ParallelConfig(dp=4, ep=4, gbs=8, seq=32), (0, 1, 2, 3), (), frozenset({0}))


def test_restart_plan_names_hosts_for_slurm_and_kubernetes():
    plan = restart_plan([entry(2, host="gpu07"), entry(0, host="gpu03")], None)
    assert plan["slurm"] == {"exclude": "gpu03,gpu07"}
    term = plan["kubernetes"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchExpressions"][0] == {
        "key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu03", "gpu07"]}
    assert restart_plan([], None)["slurm"] == {}


def test_slots():
    assert parse_slots(None, 3) == (0, 1, 2) and parse_slots("0,4,2", 3) == (0, 4, 2)
