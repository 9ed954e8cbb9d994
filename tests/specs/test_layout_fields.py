"""The layout vocabulary declared once (specs.layout_fields): every field walks through each reader
of the declaration, so a new field is covered by adding its row and an example here."""

import dataclasses
import json

import pytest
import typer

from dayzero.errors import ConfigError, LayoutError
from dayzero.specs.layout_fields import (
    BOOL,
    BY_NAME,
    FIELDS,
    INT,
    INT_OR_NULL,
    INTS,
    NEVER,
    STR,
    STRS,
    layout_fields,
    parse_pin,
    runtime_refused,
    searched,
)
from dayzero.specs.layout_flags import layout_flags, train_layout
from dayzero.specs.layout_options import LayoutOptions
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.plan_layout import REFIT, checked_fields, layout_of, runnable

WORLD, SEQ, GBS = 8, 256, 32
# one valid plan-file value away from the default per field (with the fields it needs), and the
# value the fitted layout holds; dp, gbs and seq are refitted to the run (plan_layout.REFIT)
EXAMPLES = {
    "tp": ({"tp": 2}, 2), "pp": ({"pp": 2}, 2), "dp": ({"dp": 3}, WORLD), "cp": ({"cp": 2}, 2),
    "cp_comm": ({"cp": 2, "cp_comm": "a2a"}, "a2a"), "ep": ({"ep": 2}, 2), "etp": ({"tp": 2, "etp": 2}, 2),
    "vpp": ({"pp": 2, "vpp": 2}, 2), "mbs": ({"mbs": 2}, 2), "gbs": ({"gbs": 999}, GBS), "seq": ({"seq": 99}, SEQ),
    "zero": ({"zero": 3}, 3), "recompute": ({"recompute": "full"}, "full"),
    "recompute_modules": ({"recompute": "selective", "recompute_modules": ["mlp", "core_attn"]}, ("core_attn", "mlp")),
    "recompute_layers": ({"recompute": "full", "recompute_layers": 1}, 1),
    "sequence_parallel": ({"tp": 2, "sequence_parallel": True}, True),
    "fp8_param_gather": ({"precision": "fp8", "fp8_param_gather": True}, True),
    "optimizer_offload": ({"optimizer_offload": True}, True),
    "activation_offload_layers": ({"activation_offload_layers": 1}, 1),
    "precision": ({"precision": "fp8"}, "fp8"), "schedule": ({"pp": 2, "schedule": "gpipe"}, "gpipe"),
    "layer_split": ({"pp": 2, "layer_split": [1, 3]}, (1, 3)), "rank_order": ({"rank_order": "tp-dp-cp-pp"},
                                                                             "tp-dp-cp-pp"),
}
WRONG_TYPE = {INT: "2", INT_OR_NULL: "one", STR: 1, BOOL: "yes", INTS: "8,8", STRS: 3}
by_name = pytest.mark.parametrize("field", FIELDS, ids=lambda f: f.name)


def test_every_parallel_config_field_is_declared_once_with_an_example():
    assert [f.name for f in FIELDS] == list(dict.fromkeys(f.name for f in FIELDS))
    assert {f.name for f in FIELDS} == {f.name for f in dataclasses.fields(ParallelConfig)}
    assert set(EXAMPLES) == set(BY_NAME), "a new field needs an example plan value here"


@by_name
def test_a_plan_field_reaches_train_and_validate_or_is_refused_with_the_reason(field):
    given, expect = EXAMPLES[field.name]
    par = layout_of({"microbatches": 2, **given}, WORLD, SEQ, GBS, "plan.json")
    assert getattr(par, field.name) == expect
    if field.name not in REFIT:
        assert expect != field.default
    if field.runtime:
        with pytest.raises(LayoutError, match=f"plan.json: {field.name} .*re-plan with {field.keep_off}"):
            runnable(par, "plan.json")
    else:
        assert runnable(par, "plan.json") is par


@by_name
def test_a_plan_field_of_the_wrong_json_type_is_refused_naming_it(field):
    with pytest.raises(ConfigError, match=f"field '{field.name}'"):
        checked_fields({field.name: WRONG_TYPE[field.json]}, "plan.json")


@by_name
def test_the_next_step_flags_give_the_field_back(field):
    """layout_flags writes the field as flags that `dayzero memory` parses back to the same value."""
    if field.writes == NEVER:
        pytest.skip("no verb the next steps write for takes the flag")
    from dayzero.cli.app import app

    given, _ = EXAMPLES[field.name]
    par = layout_of({"microbatches": 2, **given}, WORLD, SEQ, GBS)
    argv = layout_flags(par.to_dict())
    command = typer.main.get_command(app).commands["memory"]
    params = command.make_context("memory", ["tiny-llama", *argv]).params
    lay = LayoutOptions(**{f.name: params[f.name] for f in layout_fields()})
    back = lay.parallel(par.world, params["precision"]).to_dict()
    if not field.flag.layout:  # a flag of the verb's own, under its parameter name
        option = next(p for p in command.params if field.flag.long in p.opts)
        back[field.name] = params[option.name]
    assert back[field.name] == par.to_dict()[field.name]


def test_train_is_written_only_the_flags_it_takes():
    par = ParallelConfig(precision="fp8", fp8_param_gather=True, optimizer_offload=True, activation_offload_layers=1,
                         rank_order="tp-dp-cp-pp")
    argv = layout_flags(train_layout(par.to_dict()))
    assert "--precision" in argv
    for f in FIELDS:
        assert (f.flag.long in argv) <= f.flag.train, f.name


def test_layout_options_and_the_layout_verbs_take_the_declared_flags():
    import inspect

    from dayzero.cli import memory, train, validate

    names = [f.name for f in layout_fields()]
    assert [f.name for f in dataclasses.fields(LayoutOptions)] == names
    assert {f.name: f.default for f in dataclasses.fields(LayoutOptions)} == {f.name: f.flag.default
                                                                            for f in layout_fields()}
    for verb in (memory.memory_cmd, train.train_cmd, validate.validate_cmd):
        params = inspect.signature(verb).parameters
        assert [n for n in params if n in names] == names, verb.__name__


def test_the_search_space_and_plans_pins_are_the_declared_ones():
    from dayzero.cli.app import app
    from dayzero.planner.search.search_space import SearchSpace

    space = {f.name: f.default for f in dataclasses.fields(SearchSpace)}
    assert {n: d for n, d in space.items() if n in BY_NAME} == {f.name: f.search.default for f in searched()}
    assert set(space) - set(BY_NAME) == {"engine", "no_switches"}
    opts = {p.name: p.opts for p in typer.main.get_command(app).commands["plan"].params}
    for f in searched():
        if f.search.what or f.search.help:
            assert tuple(opts[f.name]) == tuple(n.split("/")[0] for n in f.flag.names), f.name


@pytest.mark.parametrize("name, text, value", [
    ("tp", "2,4", (2, 4)), ("sequence_parallel", "on,off", (True, False)),
    ("schedule", "GPipe,1f1b", ("gpipe", "1f1b")),
    ("recompute_modules", "core_attn,core_attn+mlp", (("core_attn",), ("core_attn", "mlp"))),
    ("cp_comm", "a2a", ("a2a",)), ("zero", None, None)])
def test_a_pin_is_parsed_as_its_field_declares(name, text, value):
    assert parse_pin(BY_NAME[name], text) == value


@pytest.mark.parametrize("name, text, needle", [("tp", "2;4", "comma-separated integers"), ("mbs", "-1", ">= 0"),
                                                ("sequence_parallel", "maybe", "on, off"),
                                                ("recompute_modules", "attn", "not among")])
def test_a_bad_pin_is_one_line_naming_the_flag(name, text, needle):
    with pytest.raises(ConfigError, match=needle) as e:
        parse_pin(BY_NAME[name], text)
    assert BY_NAME[name].flag.long in str(e.value)


def test_a_proxy_leaves_what_the_runtime_does_not_run_at_the_defaults():
    from dayzero.validate.proxy_plan import RESET, proxy_parallel

    assert {f.name for f in runtime_refused()} <= set(RESET)
    plan = {**EXAMPLES["layer_split"][0], "optimizer_offload": True, "precision": "fp8", "recompute_layers": 1}
    cut = proxy_parallel(plan, 2)
    assert not set(RESET) & set(cut)


def test_train_and_validate_plan_run_the_printed_plan_or_refuse_it(tmp_path, capsys):
    from dayzero.cli.app import main

    f = tmp_path / "plan.json"
    layout = {"tp": 1, "pp": 2, "mbs": 1, "microbatches": 2, "recompute": "full", "recompute_layers": 1,
              "layer_split": [1, 3]}
    f.write_text(json.dumps({"plans": [{"parallel": layout}]}))
    for verb in ("train", "validate"):
        assert main([verb, "tiny-llama", "--plan", str(f), "--nproc", "2", "--dry-run", "--json"]) == 0
        ran = json.loads(capsys.readouterr().out)["parallel"]
        assert (ran["recompute_layers"], ran["layer_split"]) == (1, [1, 3]), verb
        f.write_text(json.dumps({"plans": [{"parallel": {**layout, "optimizer_offload": True}}]}))
        assert main([verb, "tiny-llama", "--plan", str(f), "--nproc", "2", "--dry-run"]) == 2
        # the refusal is one line (validate may first say which cached host profile it reads)
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert last.startswith("dayzero: error:") and "optimizer_offload true" in last
        assert "--no-optimizer-offload" in last
        f.write_text(json.dumps({"plans": [{"parallel": layout}]}))
