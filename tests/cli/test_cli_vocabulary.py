"""One vocabulary across verbs: a flag name means one thing everywhere (same type, same default),
and no concept is spelled two ways."""

from __future__ import annotations

import typer.main

from dayzero.cli.app import app

# spellings replaced by one name for the concept (the name to use instead)
RETIRED = {"--output": "--out", "--attention": "--attention-kernel", "--dtype": "--compute-dtype or --weights-dtype",
           "--calibrate-file": "--calibration"}
# a flag whose default differs by verb on purpose, with the reason
DEFAULTS_DIFFER = {
    "--steps": "train runs 100 steps; validate 30 (a loss-trend test needs fewer); export's jobs 100",
    "--ckpt-every": "train saves only at the end; an exported scheduler job every 50 steps (a requeue resumes there)",
    "--seq": "planner verbs default to 4096; the runtime's proxies to short sequences",
    "--seq-length": "the Megatron spelling of --seq, same defaults",
    "--top": "how many rows each verb lists",
    "--fp8-param-gather": "plan searches it when unset (None; --no- keeps it off); other verbs: off unless given",
    "--optimizer-offload": "plan searches it when unset (None; --no- keeps it off); other verbs: off unless given",
    "--cluster": "plan and day0 default to the seed scenario; other verbs require one",
    "--compute-dtype": "train/validate resolve 'auto' to the device; memory --exact and ops take an explicit dtype",
    "--out": "each verb writes its own kind of output",
    "--model": "the checkpoint verbs' model is optional",
    "--nproc": "calibrate measures 1 rank by default; validate/train their layout's world",
    "--manifest": "ops reads a backend manifest; other verbs none",
    "--gbs": "sizes are resolved per verb from the layout",
    "--global-batch-size": "the Megatron spelling of --gbs, same defaults",
    "--zero": "planner verbs default to ZeRO-1 (Megatron's distributed optimizer); the runtime alike",
}


def _commands():
    root = typer.main.get_command(app)
    stack = [("", root)]
    while stack:
        path, cmd = stack.pop()
        sub = getattr(cmd, "commands", None)
        if sub:
            stack.extend((f"{path} {name}".strip(), c) for name, c in sub.items())
        else:
            yield path, cmd


def _options():
    for path, cmd in _commands():
        for p in cmd.params:
            for opt in getattr(p, "opts", []):
                if opt.startswith("--"):
                    yield path, opt, p


def _kind(p) -> str:
    """The option's Python type (Optional unwrapped; a flag is 'flag')."""
    import typing

    if getattr(p, "is_flag", False):
        return "flag"
    ann = p.type_descriptor.annotation
    args = [a for a in typing.get_args(ann) if a is not type(None)]
    ann = args[0] if typing.get_origin(ann) in (typing.Union, getattr(__import__("types"), "UnionType",
                                                                      None)) and args else ann
    return getattr(ann, "__name__", str(ann))


# plan pins each layout dimension to a candidate list ("--tp 4,8"; absent: search all), so its layout
# flags (and their Megatron-style aliases) are comma-separated text with no default, where the other
# verbs take one value
CANDIDATE_LISTS = {("plan", f) for f in ("--tp", "--pp", "--dp", "--cp", "--ep", "--etp", "--vpp", "--mbs", "--zero",
                                         "--recompute", "--schedule", "--cp-comm",
                                         "--sequence-parallel")}


def _candidate_list(path, p) -> bool:
    return any((path, o) in CANDIDATE_LISTS for o in p.opts)


def test_no_retired_spelling_is_used():
    used = [(path, opt) for path, opt, _ in _options() if opt in RETIRED]
    assert not used, [f"{path}: {opt} (use {RETIRED[opt]})" for path, opt in used]


def test_a_flag_has_one_type_and_one_default_everywhere():
    seen: dict[str, dict] = {}
    for path, opt, p in _options():
        if not _candidate_list(path, p):
            seen.setdefault(opt, {})[path] = (_kind(p), p.default)
    conflicts = []
    for opt, by_verb in seen.items():
        kinds = {k for k, _ in by_verb.values()}
        if len(kinds) > 1:
            conflicts.append(f"{opt}: types {sorted(kinds)} in {sorted(by_verb)}")
        defaults = {repr(d) for _, d in by_verb.values()}
        if len(defaults) > 1 and opt not in DEFAULTS_DIFFER:
            conflicts.append(f"{opt}: defaults {sorted(defaults)} in {sorted(by_verb)}")
    assert not conflicts, conflicts


def test_a_flag_has_the_same_aliases_everywhere():
    """--tp is --tensor-model-parallel-size on every verb that takes it (plan's pins included)."""
    spellings: dict[str, dict] = {}
    for path, opt, p in _options():
        longs = tuple(sorted(o for o in p.opts if o.startswith("--")))
        spellings.setdefault(opt, {}).setdefault(longs, []).append(path)
    conflicts = [f"{opt}: {' | '.join(f'{list(k)} in {sorted(v)}' for k, v in by.items())}"
                 for opt, by in spellings.items() if len(by) > 1]
    assert not conflicts, conflicts


def test_megatron_names_reach_the_same_layout():
    import contextlib
    import io
    import json

    from dayzero.cli.app import main

    def parallel(argv):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(argv + ["--json"]) == 0
        return json.loads(out.getvalue())["parallel"]

    base = ["predict", "llama-3.1-8b", "-a", "h100", "-n", "16"]
    ours = parallel(base + ["--tp", "2", "--pp", "2", "--mbs", "2", "--gbs", "64", "--seq", "2048"])
    megatron = parallel(base + ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                                "--micro-batch-size", "2", "--global-batch-size", "64", "--seq-length", "2048"])
    assert ours == megatron


def test_plan_pins_every_searched_dimension():
    import contextlib
    import io
    import json

    from dayzero.cli.app import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", "mixtral-8x7b", "-a", "h100", "-n", "64", "--gbs", "128", "--seq", "4096", "--top", "3",
                     "--tp", "4", "--pp", "4", "--dp", "4", "--cp", "1", "--ep", "4", "--etp", "1", "--vpp", "2",
                     "--schedule", "interleaved", "--mbs", "1", "--zero", "1", "--recompute", "selective",
                     "--sequence-parallel", "on", "--json"]) == 0
    plans = json.loads(out.getvalue())["plans"]
    assert plans
    for p in plans:
        q = p["parallel"]
        assert (q["tp"], q["pp"], q["dp"], q["cp"], q["ep"], q["etp"], q["vpp"], q["schedule"], q["mbs"], q["zero"],
                q["recompute"], q["sequence_parallel"]) == (4, 4, 4, 1, 4, 1, 2, "interleaved", 1, 1, "selective",
                                                            True)


def test_plan_pins_dp_and_schedule_in_every_plan():
    """A dp or schedule pin holds in every plan shown, the Megatron spellings included."""
    import contextlib
    import io
    import json

    from dayzero.cli.app import main

    for dp, schedule in (("8", "gpipe"), ("4,16", "1f1b")):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["plan", "llama-3.1-8b", "-a", "h100", "-n", "64", "--gbs", "128", "--top", "4",
                         "--dp", dp, "--schedule", schedule, "--pipeline-model-parallel-size", "1,2,4",
                         "--json"]) == 0
        plans = json.loads(out.getvalue())["plans"]
        assert len(plans) == 4
        for p in plans:
            q = p["parallel"]
            assert str(q["dp"]) in dp.split(",") and q["schedule"] == schedule and q["pp"] in (1, 2, 4)
            if schedule == "1f1b":
                assert q["vpp"] == 1


def test_a_pin_no_layout_satisfies_is_one_line_naming_why(capsys):
    from dayzero.cli.app import main

    base = ["plan", "llama-3.1-8b", "-a", "h100", "-n", "64", "--gbs", "128"]
    # 9 recompute levels on a dense GQA model: none, full and the 7 distinct module sets of core_attn,
    # layernorm and mlp (search.SearchSpace.levels): 1,152 layouts x 9
    for extra, needle in ((["--schedule", "interleaved", "--vpp", "1"], "10,368 rejected: the interleaved schedule "
                                                                         "needs vpp > 1, got vpp 1"),
                          (["--dp", "7"], "--dp 7: dp must divide the 64 devices"),
                          (["--tp", "3"], "attention heads (32) must be divisible by tp (3)"),
                          (["--dp", "64", "--tp", "2"], "dp 32 = 64 devices / (tp*pp*cp = 2*1*1) is not among "
                                                        "--dp 64"),
                          (["--schedule", "zb"],
                           "schedule must be 1f1b|interleaved|gpipe|dualpipe|dualpipev, got 'zb'")):
        assert main(base + extra) == 2
        err = capsys.readouterr().err.strip().splitlines()
        err = [line for line in err if not line.startswith("config keys not used")]
        assert len(err) == 1 and needle in err[0], (extra, err)
        assert "Traceback" not in err[0]


def test_train_and_validate_take_a_plan_file(tmp_path):
    """`plan/predict --json` output feeds train --plan and validate --plan through one function."""
    import contextlib
    import io
    import json

    import pytest

    from dayzero.cli.app import main
    from dayzero.errors import DayzeroError
    from dayzero.specs.plan_layout import plan_layout

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", "tiny-moe", "-a", "h100", "-n", "16", "--gbs", "64", "--seq", "512", "--tp", "2",
                     "--pp", "2", "--top", "1", "--json"]) == 0
    f = tmp_path / "plan.json"
    f.write_text(out.getvalue())
    best = json.loads(out.getvalue())["plans"][0]["parallel"]
    p = plan_layout(f, world=8, seq=128)
    assert (p.tp, p.pp, p.ep, p.zero, p.recompute, p.dp) == (best["tp"], best["pp"], best["ep"], best["zero"],
                                                             best["recompute"], 8 // (best["tp"] * best["pp"]))
    assert p.microbatches >= p.pp
    with pytest.raises(DayzeroError, match="multiple of 4"):
        plan_layout(f, world=6, seq=128)
    assert main(["train", "tiny-moe", "--plan", str(f), "--nproc", "8", "--tp", "4", "--steps", "1"]) == 2
    bad = tmp_path / "bad.json"
    bad.write_text('{"plans": []}')
    with pytest.raises(DayzeroError, match="expected `dayzero plan --json`"):
        plan_layout(bad, world=8, seq=128)
