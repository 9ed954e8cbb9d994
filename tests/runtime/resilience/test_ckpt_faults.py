"""Fault drills, the hang watchdog, loss guards and their wiring in a training loop."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import pytest

from dayzero.runtime.resilience.faults import FaultInjector, FaultSpec, FaultSpecError, InjectedFault
from dayzero.runtime.resilience.guards import GuardConfig, LossDivergedError, LossGuard
from dayzero.runtime.resilience.loop import ResilienceConfig
from dayzero.runtime.resilience.rank_log import WATCHDOG_EXIT
from helpers import ckpt_toy  # tests/helpers/ckpt_toy.py: the small tp/pp/dp harness, here in one plain process

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def test_fault_spec_parsing():
    assert FaultSpec.parse("step=7,rank=1,kind=kill") == FaultSpec(7, 1, "kill")
    assert FaultSpec.parse(" step=3 , rank=0, kind=hang, at=save, attempt=1") == FaultSpec(3, 0, "hang", "save", 1)
    for bad in ["", "step=7,rank=1", "step=x,rank=1,kind=kill", "step=7,rank=1,kind=melt", "step=0,rank=0,kind=kill",
                "step=7,rank=1,kind=kill,at=lunch", "step=7,rank=1,kind=kill,step=8", "step=7,rank=1,kind=kill,who=me"]:
        with pytest.raises(FaultSpecError, match="--inject-fault"):
            FaultSpec.parse(bad)


def test_injector_fires_only_for_its_rank_step_and_attempt():
    specs = [FaultSpec(3, 1, "exception"), FaultSpec(5, 1, "exception", attempt=1), FaultSpec(4, 1, "exception",
                                                                                              "save")]
    events = []
    inj = FaultInjector(specs, rank=1, attempt=0, on_event=events.append)
    inj.at_step(2)
    inj.at_step(5)  # attempt 1 only
    inj.at_save(3)  # at=step
    with pytest.raises(InjectedFault):
        inj.at_step(3)
    with pytest.raises(InjectedFault):
        inj.at_save(4)
    FaultInjector(specs, rank=0, attempt=0).at_step(3)  # another rank: nothing
    assert [e["step"] for e in events] == [3, 4]


def test_watchdog_aborts_a_hung_process():
    code = ("from dayzero.runtime.resilience.watchdog import Watchdog\n"
            "import time\n"
            "w = Watchdog(0.6).start()\n"
            "w.beat(1)\n"
            "time.sleep(30)\n")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == WATCHDOG_EXIT and time.monotonic() - t0 < 20
    assert "no progress" in p.stderr and "after step 1" in p.stderr


def test_watchdog_allows_a_declared_slow_operation():
    code = ("from dayzero.runtime.resilience.watchdog import Watchdog\n"
            "import time\n"
            "w = Watchdog(0.5).start()\n"
            "with w.allow(5):\n"
            "    time.sleep(1.5)\n"
            "w.beat(2); w.stop(); print('ok')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "ok"


def test_guard_nan_inf_spike_warmup_and_divergence():
    g = LossGuard(GuardConfig(spike_factor=3.0, window=4, warmup=2, max_consecutive=2))
    assert g.observe(1, 10.0).ok  # one loss is not enough to judge a spike
    assert g.observe(2, 100.0).ok  # warmup: 1 accepted < 2
    assert g.mean == 55.0
    v = g.observe(3, 150.0)
    assert v.ok is True  # 150 < 3 * 55
    v = g.observe(4, 10_000.0)
    assert (v.ok, v.reason, v.action) == (False, "spike", "skip")
    assert v.event(4)["event"] == "loss_guard"
    assert g.observe(5, math.nan).reason == "nan"
    with pytest.raises(LossDivergedError, match="3 steps in a row"):
        g.observe(6, math.inf)
    state = json.loads(json.dumps(g.state_dict()))
    h = LossGuard(g.config)
    h.load_state_dict(state)
    assert h.mean == g.mean and h.check(math.inf).reason == "inf"


def test_guard_config_validation():
    from dayzero.errors import DayzeroError

    for kw in ({"spike_factor": 0.5}, {"window": 0}, {"action": "panic"}, {"skip_batches": 0}):
        with pytest.raises(DayzeroError):
            GuardConfig(**kw)
    with pytest.raises(DayzeroError, match="needs --ckpt-dir"):
        ResilienceConfig(guard=GuardConfig(action="rollback"))
    with pytest.raises(DayzeroError, match="--ckpt-checksum md5: expected one of xxh3-128, sha256"):
        ResilienceConfig(checksum="md5")


def _toy(tmp_path, name, *extra):
    metrics = tmp_path / f"{name}.jsonl"
    ckpt_toy.main(["--metrics", str(metrics), "--steps", "10", *extra])
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def test_poisoned_batch_is_skipped(tmp_path):
    recs = _toy(tmp_path, "skip", "--poison", "6", "--spike-factor", "5", "--on-bad-loss", "skip")
    steps = [r for r in recs if "event" not in r]
    bad = [r for r in steps if not r["applied"]]
    assert [r["batch"] for r in bad] == [6]
    ev = [r for r in recs if r.get("event") == "loss_guard"]
    assert ev and ev[0]["reason"] == "spike" and ev[0]["action"] == "skip" and ev[0]["batches"] == [6]


def test_rollback_reloads_and_skips_the_offending_batch(tmp_path):
    ck = str(tmp_path / "ck")
    recs = _toy(tmp_path, "rb", "--poison", "6", "--spike-factor", "5", "--on-bad-loss", "rollback",
                "--ckpt-dir", ck, "--ckpt-every", "5")
    ev = [r for r in recs if r.get("event") == "rollback"]
    assert ev and ev[0]["from_step"] == 7 and ev[0]["to_step"] == 5 and ev[0]["skip_batches"] == [6]
    at = recs.index(ev[0])
    before = [r for r in recs[:at] if "event" not in r]
    after = [r for r in recs[at:] if "event" not in r]
    assert [r["step"] for r in before] == [1, 2, 3, 4, 5, 6]  # step 7 (batch 6) was judged, never applied
    assert [(r["step"], r["batch"]) for r in after] == [(6, 5), (7, 7), (8, 8), (9, 9), (10, 10)]
    assert after[0]["loss"] == before[5]["loss"]  # the replay of step 6 is exact
    # before the spike, the guarded run is the plain run
    clean = _toy(tmp_path, "ref", "--ckpt-dir", str(tmp_path / "ck2"), "--ckpt-every", "5", "--steps", "5")
    assert [r["loss"] for r in clean if "event" not in r] == [r["loss"] for r in before[:5]]


def _train_config(**kw):
    from dayzero.runtime.config import ModelSection, TrainConfig
    from dayzero.specs.parallel import ParallelConfig

    cfg = TrainConfig(model=ModelSection("tiny-llama"), parallel=ParallelConfig(dp=2, gbs=4, seq=32), steps=10)
    return cfg.with_(**kw)


@pytest.mark.parametrize("kw, needle", [
    ({"faults": {"inject_faults": ("step=11,rank=0,kind=kill",)}}, "step 11 is past the last step (10)"),
    ({"faults": {"inject_faults": ("step=3,rank=2,kind=kill",)}}, "rank 2 does not exist in a world of 2"),
    ({"faults": {"inject_faults": ("step=3,rank=0,kind=kill,at=save",)}},
     "no checkpoint is saved at step 3 (saves happen at no step"),
    ({"faults": {"inject_faults": ("step=3,rank=0,kind=kill,at=save",)}, "checkpoint": {"dir": "ck", "every": 4}},
     "saves happen at steps divisible by --ckpt-every 4 and the last step 10"),
    ({"faults": {"inject_faults": ("step=3,rank=0,kind=kill,at=save",)}, "checkpoint": {"dir": "ck"}},
     "saves happen at the last step 10"),
    ({"checkpoint": {"every": 2}}, "--ckpt-every applies only with --ckpt-dir"),
    ({"checkpoint": {"keep": 5}}, "--keep applies only with --ckpt-dir"),
    ({"checkpoint": {"async_save": True}}, "--async-save applies only with --ckpt-dir"),
    ({"checkpoint": {"prune_other_lineages": True}}, "--ckpt-prune-other-lineages applies only with --ckpt-dir"),
    ({"checkpoint": {"checksum": "sha256"}}, "--ckpt-checksum applies only with --ckpt-dir"),
    ({"faults": {"spike_factor": 3.0}}, "--spike-factor applies only with --on-bad-loss"),
])
def test_options_that_would_be_ignored_are_refused(kw, needle):
    from dayzero.errors import DayzeroError
    from dayzero.runtime.resilience.loop import resilience_config

    with pytest.raises(DayzeroError) as e:
        resilience_config(_train_config(**kw))
    assert needle in str(e.value)


def test_drills_that_can_fire_are_accepted():
    from dayzero.runtime.resilience.loop import resilience_config

    ok = ("step=10,rank=1,kind=kill", "step=4,rank=0,kind=hang,at=save", "step=10,rank=1,kind=exception,at=save")
    r = resilience_config(_train_config(faults={"inject_faults": ok}, checkpoint={"dir": "ck", "every": 4}))
    assert len(r.faults) == 3


def test_rank_failures_name_the_causes_not_the_consequences(tmp_path):
    import json as _json
    import signal

    from dayzero.runtime.resilience.rank_log import attempt_dir, causes, consequence_line, read_failure

    d = attempt_dir(tmp_path, 0)
    d.mkdir()
    (d / "rank0.crash").write_text(_json.dumps({"cause": "RuntimeError: Connection reset by peer", "lost_peer": True}))
    (d / "rank1.log").write_text("noise\ndayzero: injecting fault step=3\n[W gloo] more noise\n")
    killed = [read_failure(tmp_path, 0, 0, 1), read_failure(tmp_path, 0, 1, -signal.SIGKILL),
              read_failure(tmp_path, 0, 2, 128 + signal.SIGTERM)]
    assert [f.line() for f in causes(killed)] == ["rank 1: killed by SIGKILL; last message: injecting fault step=3"]
    assert consequence_line(killed) == "ranks 0, 2 stopped as a consequence"
    (tmp_path / "rank3.err").write_text("checkpoint save failed\n")
    user = read_failure(tmp_path, 0, 3, 2)
    assert causes([killed[1], user]) == [killed[1]]  # a fault explains the user error it caused
    assert causes([killed[0], user]) == [user] and user.line() == "rank 3: checkpoint save failed"
    assert [f.rank for f in causes([killed[0], killed[2]])] == [0, 2]  # nothing else: every failure as it is
