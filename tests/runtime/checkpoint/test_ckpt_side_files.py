"""Crafted side files: a version whose checksums match but whose train_state.json,
optimizer_groups.json or rng-*.json hold values this run cannot use is refused with one
CheckpointError naming the file and the field, never a TypeError from inside PyTorch and never a
resume from a wrong step (issue #22, finding 8)."""

from __future__ import annotations

import math

import pytest

from dayzero.errors import DayzeroError
from dayzero.runtime.checkpoint.json_state import from_json
from dayzero.runtime.checkpoint.manifest import CheckpointError
from dayzero.runtime.data import DataError, DataPosition
from dayzero.runtime.resilience.guards import GuardConfig, LossGuard, LossGuardStateError
from helpers import ckpt_craft
from helpers.ckpt_craft import save_version

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A version at step 2 with model, optimizer, scheduler and data."""
    return save_version(tmp_path_factory.mktemp("ck"), 2)


def craft(src, tmp_path, rel, edit):
    return ckpt_craft.craft(src, tmp_path / "ck", 2, rel, edit)


def resume(root):
    return ckpt_craft.resume(root, 2)


def test_the_untouched_version_resumes(saved, tmp_path):
    r = resume(craft(saved, tmp_path, "train_state.json", lambda d: d))
    assert r.step == 2 and r.data["stream"]["samples"] == 2


def _set(key, value):
    def edit(d):
        d[key] = value
        return d
    return edit


def _sched(key, value):
    def edit(d):
        d["scheduler"][key] = value
        return d
    return edit


TRAIN_STATE = {
    "a list": lambda d: [],
    "a string": lambda d: "x",
    "no step": lambda d: {k: v for k, v in d.items() if k != "step"},
    "step a string": _set("step", "two"),
    "step a bool": _set("step", True),
    "negative step": _set("step", -3),
    "step past the manifest's": _set("step", 10**30),
    "no scheduler although listed": _set("scheduler", None),
    "extra a number": _set("extra", 5),
    "scheduler lr a string": _sched("base_lrs", "x"),
    "scheduler lr infinite": _sched("base_lrs", [math.inf]),
    "scheduler lr negative": _sched("_last_lr", [-1.0]),
    "scheduler epoch a string": _sched("last_epoch", "x"),
}


@pytest.mark.parametrize("case", sorted(TRAIN_STATE))
def test_crafted_train_state_is_one_clear_error(saved, tmp_path, case):
    root = craft(saved, tmp_path, "train_state.json", TRAIN_STATE[case])
    with pytest.raises(CheckpointError, match="train_state.json") as e:
        resume(root)
    assert "\n" not in str(e.value) and "--resume" in str(e.value)


def _opt(pick, value):
    def edit(d):
        d[next(k for k in d if k.endswith(pick))] = value
        return d
    return edit


OPTIMIZER = {
    "amsgrad a string": _opt(".amsgrad", "bogus"),
    "lr a string": _opt(".lr", "x"),
    "lr infinite": _opt(".lr", math.inf),
    "betas a number": _opt(".betas", 5),
    "betas of three": _opt(".betas", {"__tuple__": [0.9, 0.9, 0.9]}),
    "tuple tag not a list": _opt(".betas", {"__tuple__": 5}),
    "tensor bad shape field": _opt(".step", {"__tensor__": {"dtype": "float32", "shape": "x", "data": ""}}),
    "tensor not base64": _opt(".step", {"__tensor__": {"dtype": "float32", "shape": [], "data": "!!"}}),
    "tensor wrong shape": _opt(".step", {"__tensor__": {"dtype": "float32", "shape": [1], "data": "AAAAAA=="}}),
    "not an object": lambda d: [1, 2],
}


@pytest.mark.parametrize("case", sorted(OPTIMIZER))
def test_crafted_optimizer_groups_is_one_clear_error(saved, tmp_path, case):
    root = craft(saved, tmp_path, "optimizer_groups.json", OPTIMIZER[case])
    with pytest.raises(CheckpointError) as e:
        resume(root)
    assert "\n" not in str(e.value)


RNG = {
    "not an object": lambda d: [],
    "no rng": lambda d: {"rank": 0},
    "states null": lambda d: {**d, "rng": {k: None for k in d["rng"]}},
    "python state short": lambda d: {**d, "rng": {**d["rng"], "python": [1, 2]}},
    "numpy state an object": lambda d: {**d, "rng": {**d["rng"], "numpy": {"a": 1}}},
}


@pytest.mark.parametrize("case", sorted(RNG))
def test_crafted_rng_is_one_clear_error(saved, tmp_path, case):
    root = craft(saved, tmp_path, "rng-00000.json", RNG[case])
    with pytest.raises(CheckpointError, match="rng-00000.json") as e:
        resume(root)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("bad", [5, None, {}, {"samples": -1, "seed": 0, "seq": 8, "fingerprint": "f"},
                                 {"samples": 1, "seed": 0, "seq": 0, "fingerprint": "f"},
                                 {"samples": "1", "seed": 0, "seq": 8, "fingerprint": "f"},
                                 {"samples": 1, "seed": 0, "seq": 8, "fingerprint": "f", "more": 1}])
def test_a_saved_data_position_is_checked(bad):
    with pytest.raises(DataError, match="data position"):
        DataPosition.from_dict(bad)
    assert DataPosition.from_dict({"samples": 1, "seed": 0, "seq": 8, "fingerprint": "f"}).samples == 1


@pytest.mark.parametrize("bad", [5, {"history": "x"}, {"history": [math.nan]}, {"consecutive": -1},
                                 {"history": [1.0], "consecutive": "2"}])
def test_a_saved_loss_guard_state_is_checked(bad):
    guard = LossGuard(GuardConfig(spike_factor=3.0))
    with pytest.raises(LossGuardStateError):
        guard.load_state_dict(bad)
    assert issubclass(LossGuardStateError, DayzeroError)
    guard.load_state_dict({"history": [1.0, 2.0], "consecutive": 1})


def test_a_step_count_saved_as_a_number_still_loads(saved, tmp_path):
    """Older writers stored AdamW's step as a plain number: still accepted (it is one)."""
    def edit(d):
        for k in [k for k in d if k.endswith(".step")]:
            d[k] = float(from_json(d[k]))
        return d
    assert resume(craft(saved, tmp_path, "optimizer_groups.json", edit)).step == 2
