"""Alert actions: the --on-alert policy, rank 0 deciding for every rank, the exclusion it writes."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from dayzero.monitor.rules import rule_names
from dayzero.runtime.config import CheckpointSection, FaultSection, ModelSection, TrainConfig
from dayzero.runtime.resilience import rank_log
from dayzero.runtime.resilience.actions import (
    REQUEST_FILE,
    AlertActions,
    AlertPolicy,
    AlertPolicyError,
    RankPlace,
    check_alert_options,
    read_request,
    resolve_name,
)
from dayzero.runtime.resilience.faults import FaultInjector, FaultSpec, FaultSpecError
from dayzero.specs.exclusions import read_exclusions
from dayzero.specs.parallel import ParallelConfig


@dataclass(frozen=True)
class A:
    name: str
    ranks: tuple[int, ...]
    message: str = "m"
    severity: str = "warning"


def test_policy_parsing_and_names():
    known = rule_names()
    p = AlertPolicy.parse(["straggler=exclude", "loss_spike=checkpoint", "all=log"], known)
    assert dict(p.actions) == {"DayzeroStragglerRank": "exclude", "DayzeroLossSpike": "checkpoint"}
    assert p.action_for(A("DayzeroStragglerRank", (2,))) == "exclude"
    assert p.action_for(A("DayzeroStragglerRank", ())) == "restart"  # nobody to exclude
    assert p.action_for(A("DayzeroHang", ())) == "log"
    assert resolve_name("DayzeroHang", known) == "DayzeroHang" and resolve_name("device", known) is None
    for bad, why in [("straggler", "expected NAME=ACTION"), ("straggler=reboot", "expected NAME=ACTION"),
                     ("stragler=log", "no single alert"), ("device=log", "no single alert")]:
        with pytest.raises(AlertPolicyError, match=why):
            AlertPolicy.parse([bad], known)
    with pytest.raises(AlertPolicyError, match="given twice"):
        AlertPolicy.parse(["straggler=log", "DayzeroStragglerRank=exclude"], known)


def cfg(**faults) -> TrainConfig:
    ck = faults.pop("ckpt", "ck")
    return TrainConfig(model=ModelSection("tiny-llama"), parallel=ParallelConfig(dp=4, gbs=8, seq=32),
                       checkpoint=CheckpointSection(dir=ck), faults=FaultSection(**faults))


def test_options_this_run_cannot_carry_out_are_refused():
    check_alert_options(cfg(on_alert=("straggler=exclude",), max_restarts=1, spares=1), torchrun=False, world=4)
    check_alert_options(cfg(on_alert=("straggler=exclude",)), torchrun=True, world=4)  # the user's launcher
    for c, torchrun, world, why in [
            (cfg(on_alert=("straggler=checkpoint",), ckpt=None), False, 4, "needs --ckpt-dir"),
            (cfg(on_alert=("straggler=exclude",)), False, 4, "add --max-restarts"),
            (cfg(on_alert=("straggler=restart",), max_restarts=1), False, 1, "--nproc N"),
            (cfg(on_alert=("straggler=exclude",), max_restarts=1, spares=1), True, 4, "--spares 1 applies only"),
            (cfg(on_alert=("straggler=log",), spares=2), False, 4, "add --on-alert NAME=exclude")]:
        with pytest.raises(AlertPolicyError, match=why):
            check_alert_options(c, torchrun=torchrun, world=world)


def make(tmp_path, rank: int, policy: AlertPolicy, code: list[int], events: list) -> AlertActions:
    places = [RankPlace("nodeA", s) for s in (0, 1, 2, 5)]  # rank 3 runs on device slot 5

    def broadcast(c: int) -> int:  # rank 0 runs first in these tests
        if rank == 0:
            code[0] = c
        return code[0]

    return AlertActions(policy, rank=rank, places=places, broadcast=broadcast, emit=events.append,
                        ckpt_dir=str(tmp_path), parallel=ParallelConfig(dp=4, gbs=8, seq=32))


def test_rank0_decides_on_new_alerts_and_every_rank_acts_the_same(tmp_path, monkeypatch):
    monkeypatch.setenv(rank_log.DIR_ENV, str(tmp_path))
    policy = AlertPolicy.parse(["straggler=exclude", "loss_spike=checkpoint"], rule_names())
    spike, slow, hang = A("DayzeroLossSpike", ()), A("DayzeroStragglerRank", (3,), "slow"), A("DayzeroHang", ())
    firing = {1: [], 2: [spike], 3: [spike], 4: [spike, slow, hang]}  # the spike stays active from step 2 on
    code, events = [0], []
    ranks = [make(tmp_path, r, policy, code, events) for r in range(4)]
    decided = []
    for step in (1, 2, 3, 4):
        # only rank 0's alerts count: the others pass none
        decided.append([a.after_step(step, firing[step] if a.rank == 0 else []) for a in ranks])
    assert [[d.action for d in ds] for ds in decided] == [["log"] * 4, ["checkpoint"] * 4, ["log"] * 4,
                                                           ["exclude"] * 4]
    assert decided[3][1].stop and decided[1][0].checkpoint and not decided[1][0].stop
    assert [(e["event"], e["name"], e["action"]) for e in events if e["event"] == "alert_action"] == [
        ("alert_action", "DayzeroLossSpike", "checkpoint"), ("alert_action", "DayzeroStragglerRank", "exclude")]
    ex = read_exclusions(tmp_path / "exclusions.json")
    assert [(e.rank, e.slot, e.host, e.reason, e.step) for e in ex] == [(3, 5, "nodeA", "DayzeroStragglerRank", 4)]
    plan = json.loads((tmp_path / "restart_plan.json").read_text())
    assert plan["slurm"] == {"exclude": "nodeA"} and plan["parallel"]["dp"] == 2
    assert ranks[1].planned_restart(decided[3][1], 4).action == "exclude"
    assert read_request(tmp_path) is None  # only rank 0 asks the launcher
    stop = ranks[0].planned_restart(decided[3][0], 4)
    assert stop.action == "exclude" and stop.step == 4
    req = read_request(tmp_path)
    assert req["action"] == "exclude" and req["alerts"][0]["ranks"] == [3]
    assert (tmp_path / REQUEST_FILE).exists()


def test_straggler_drill(monkeypatch):
    assert FaultSpec.parse("step=2,rank=1,kind=straggler,sleep=0.25") == FaultSpec(2, 1, "straggler", sleep=0.25)
    for bad in ["step=2,rank=1,kind=straggler", "step=2,rank=1,kind=straggler,sleep=0",
                "step=2,rank=1,kind=straggler,sleep=x", "step=2,rank=1,kind=kill,sleep=1",
                "step=2,rank=1,kind=straggler,sleep=1,at=save"]:
        with pytest.raises(FaultSpecError):
            FaultSpec.parse(bad)
    slept, events = [], []
    monkeypatch.setattr("dayzero.runtime.resilience.faults.time.sleep", slept.append)
    inj = FaultInjector([FaultSpec.parse("step=2,rank=1,kind=straggler,sleep=0.25")], rank=1, attempt=0,
                        on_event=events.append)
    for step in range(1, 5):
        inj.at_step(step)
    assert slept == [0.25, 0.25, 0.25] and [e["step"] for e in events] == [2]  # announced once, sleeps every step
    FaultInjector([FaultSpec.parse("step=1,rank=1,kind=straggler,sleep=1")], rank=0, attempt=0).at_step(3)
    assert len(slept) == 3


@pytest.mark.parametrize("argv, needle", [
    (["--on-alert", "stragler=exclude"], "no single alert named 'stragler'"),
    (["--on-alert", "straggler=exclude", "--ckpt-dir", "CK"], "needs ranks to relaunch"),
    (["--on-alert", "straggler=exclude", "--ckpt-dir", "CK", "--nproc", "2"], "add --max-restarts"),
    (["--on-alert", "straggler=checkpoint"], "needs --ckpt-dir"),
    (["--spares", "1"], "--spares 1 applies only"),
    (["--inject-fault", "step=1,rank=0,kind=straggler"], "a straggler needs sleep=S"),
    (["--on-rank-failure", "exclude", "--nproc", "2", "--ckpt-dir", "CK"], "--on-rank-failure exclude needs"),
    (["--on-rank-failure", "reboot"], "expected restart or exclude"),
])
def test_train_refuses_bad_alert_options_with_one_line(argv, needle, capsys, tmp_path):
    from dayzero.cli.app import main

    argv = [str(tmp_path / "ck") if a == "CK" else a for a in argv]
    code = main(["train", "tiny-llama", "--layers", "2", "--hidden", "64", "--seq", "32", "--steps", "2",
                 "--skip-memory-check", *argv])
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if ln]
    assert code == 2 and len(lines) == 1 and needle in lines[0] and "Traceback" not in err, err
