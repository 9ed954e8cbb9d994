"""The exclusion list and the reshape rule a restart without failing ranks follows."""

from __future__ import annotations

import json

import pytest

from dayzero.runtime.resilience.exclusion import parse_slots, reshape, restart_plan
from dayzero.specs.exclusions import Exclusion, ExclusionError, add_exclusions, excluded_slots, read_exclusions
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


def relaunch_config(tmp_path, **faults):
    from dayzero.runtime.config import CheckpointSection, FaultSection, ModelSection, TrainConfig

    return TrainConfig(model=ModelSection("tiny-llama", layers=2, hidden=64),
                       parallel=ParallelConfig(dp=4, gbs=8, seq=32), metrics=str(tmp_path / "m.jsonl"),
                       checkpoint=CheckpointSection(dir=str(tmp_path / "ck")), faults=FaultSection(**faults))


def test_the_launcher_relaunches_on_spares_then_on_fewer_ranks(tmp_path, capsys):
    import socket

    from dayzero.runtime.config import TrainConfig
    from dayzero.runtime.resilience.relaunch import Relauncher

    (tmp_path / "ck").mkdir()
    (tmp_path / "m.jsonl").write_text('{"step": 1, "loss": 5.0, "attempt": 1}\n')
    cfg = relaunch_config(tmp_path, spares=1, max_restarts=2,
                          inject_faults=("step=1,rank=3,kind=straggler,sleep=1", "step=2,rank=0,kind=kill,attempt=2"))
    path = tmp_path / "config0.json"
    r = Relauncher([cfg], [path], 4)
    assert r.start() == (4, (0, 1, 2, 3)) and TrainConfig.load(path) == cfg
    host = socket.gethostname()
    add_exclusions(tmp_path / "ck" / "exclusions.json", [entry(3, host=host)])
    assert r.replan({"action": "exclude", "step": 5}) == (4, (0, 1, 2, 4))  # the spare takes slot 3's place
    after = TrainConfig.load(path)
    assert after.parallel.dp == 4 and after.faults.inject_faults == ("step=2,rank=0,kind=kill,attempt=2",)
    add_exclusions(tmp_path / "ck" / "exclusions.json", [entry(1, host=host, rank=1)])
    assert r.replan({"action": "exclude", "step": 7}) == (2, (0, 2))  # no spare left: dp 4 -> 2
    assert TrainConfig.load(path).parallel.dp == 2 and TrainConfig.load(path).parallel.gbs == 8
    events = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()[1:]]
    assert [(e["event"], e["world"], e["dp"], e["attempt"]) for e in events] == [("relaunch", 4, 4, 1),
                                                                                 ("relaunch", 2, 2, 1)]
    assert "excluding device slot(s) 1" in capsys.readouterr().err
    assert r.replan({"action": "restart", "step": 8}) == (2, (0, 2))  # a plain restart: same ranks
    assert json.loads((tmp_path / "m.jsonl").read_text().splitlines()[-1])["action"] == "restart"
    # a new launch on the same checkpoint directory leaves the excluded slots out from the start
    again = Relauncher([cfg], [path], 4)
    assert again.start() == (2, (0, 2)) and TrainConfig.load(path).parallel.dp == 2


def test_a_failed_rank_is_excluded_by_the_launcher(tmp_path):
    import socket

    from dayzero.runtime.config import TrainConfig
    from dayzero.runtime.resilience.relaunch import Relauncher

    (tmp_path / "ck").mkdir()
    path = tmp_path / "config0.json"
    r = Relauncher([relaunch_config(tmp_path, max_restarts=1, on_rank_failure="exclude")], [path], 4)
    r.start()
    assert r.failed([1], "rank 1: killed by SIGKILL") == (2, (0, 2))
    ex = read_exclusions(tmp_path / "ck" / "exclusions.json")
    assert [(e.rank, e.slot, e.host, e.reason, e.step) for e in ex] == [(1, 1, socket.gethostname(), "rank_failed",
                                                                         None)]
    assert TrainConfig.load(path).parallel.dp == 2
