"""One LayoutOptions for every verb that takes a layout: flags -> ParallelConfig in one place."""

import inspect
import json

import pytest

from dayzero.errors import LayoutError
from dayzero.specs.layout_options import LayoutOptions

LAYOUT_FLAGS = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs", "gbs", "seq", "zero", "recompute",
                "sequence_parallel", "schedule", "layer_split")


def test_dp_fills_the_devices_and_a_remainder_is_refused():
    assert LayoutOptions(tp=2, pp=2).parallel(16).dp == 4
    assert LayoutOptions(tp=2, dp=3).parallel(16).dp == 3  # given dp wins; validate() judges the product
    with pytest.raises(LayoutError, match="not divisible"):
        LayoutOptions(tp=3).parallel(16)


def test_layer_split_text_is_parsed_or_refused():
    assert LayoutOptions(pp=2, layer_split="5,7").parallel(2).layer_split == (5, 7)
    with pytest.raises(LayoutError, match="comma-separated"):
        LayoutOptions(layer_split="5;7").parallel(2)


def test_a_plan_refuses_layout_flags_but_takes_seq_and_gbs(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"plans": [{"parallel": {"tp": 2, "pp": 1, "mbs": 2, "microbatches": 4,
                                                        "recompute": "full"}}]}))
    par = LayoutOptions(seq=128, gbs=16).resolve(4, plan=str(plan))
    assert (par.tp, par.dp, par.mbs, par.gbs, par.seq, par.recompute) == (2, 2, 2, 16, 128, "full")
    with pytest.raises(LayoutError, match="drop --tp, --sequence-parallel"):
        LayoutOptions(tp=4, sequence_parallel=True).resolve(4, plan=str(plan))


def test_every_layout_verb_exposes_the_same_flags():
    from dayzero.cli import memory, predict, train, validate

    for verb in (memory.memory_cmd, predict.predict_cmd, train.train_cmd, validate.validate_cmd):
        names = list(inspect.signature(verb).parameters)
        assert "layout" not in names
        assert [n for n in names if n in LAYOUT_FLAGS] == list(LAYOUT_FLAGS), verb.__name__


def test_a_runtime_default_batch_fills_the_pipeline_and_says_so():
    lay = LayoutOptions(tp=2, pp=2, mbs=2)
    planner = lay.parallel(8)
    assert (planner.gbs, planner.microbatches) == (4, 1)  # the planner's default: mbs x dp
    runtime = lay.parallel(8, fill_pipeline=True)
    assert (runtime.gbs, runtime.microbatches) == (8, 2)
    assert "--gbs not given: 8" in lay.gbs_note(runtime) and "pp 2" in lay.gbs_note(runtime)
    given = LayoutOptions(tp=2, pp=2, gbs=16)
    assert given.parallel(8, fill_pipeline=True).gbs == 16 and given.gbs_note(given.parallel(8)) is None
    assert LayoutOptions(dp=4).gbs_note(LayoutOptions(dp=4).parallel(4, fill_pipeline=True)) is None
