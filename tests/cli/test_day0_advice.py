"""Advice that holds (issue 34): every ``next:`` line day0, plan and predict print is a command
that parses for that model (``--dry-run`` where the verb has one and runs here), a model derived
from its own code is not told to validate, a cluster too small says the smallest device count
that fits and names no flag the verb lacks, and findings print as written (rich markup never
swallows ``[ops]``)."""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil

import pytest

from dayzero.cli.app import main
from helpers.paths import DATA

TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))


def run(capsys, argv, code=0):
    got = main(argv)
    out = capsys.readouterr()
    assert got == code, out.err
    return out.out, out.err


def printed_commands(out: str) -> list[list[str]]:
    """The commands of the ``next:`` block, as argv: continuation lines joined, comments dropped."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("next: "))
    cmds, cur = [], ""
    for line in lines[start:]:
        if not (line.startswith("next: ") or line.startswith("      ")):
            break
        text = line[6:].strip()
        if text.startswith("#"):
            continue
        text = re.sub(r"\s+#[^'\"]*$", "", text)
        cur += " " + text
        if cur.endswith("\\"):
            cur = cur[:-1]
            continue
        cmds.append(shlex.split(cur))
        cur = ""
    return cmds


def parses(argv: list[str]) -> None:
    """``argv`` (``dayzero VERB ...`` or ``torchrun ... -m dayzero VERB ...``) parses with the CLI
    app's own command: every flag exists and every value converts."""
    import typer

    from dayzero.cli.app import app

    at = next(i for i, w in enumerate(argv) if w == "dayzero") + 1
    group = typer.main.get_command(app)
    cmd = group.commands[argv[at]]
    cmd.make_context(argv[at], list(argv[at + 1:]))


def test_every_next_line_of_day0_plan_and_predict_parses(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    outs = [run(capsys, ["day0", "tiny-moe", "-a", "910b", "-n", "16", "--gbs", "64", "--no-ops", "--out", "r"])[0],
            run(capsys, ["plan", "tiny-llama", "-a", "h100", "-n", "16", "--gbs", "64"])[0],
            run(capsys, ["predict", "tiny-llama", "-a", "h100", "-n", "8", "--dp", "8", "--gbs", "64"])[0]]
    cmds = [c for out in outs for c in printed_commands(out)]
    assert len(cmds) >= 5
    for c in cmds:
        parses(c)
    validate = [c for c in cmds if c[:2] == ["dayzero", "validate"]]
    assert validate
    for c in validate:  # the proxy layout passes every check the run makes, here
        run(capsys, [*c[1:], "--dry-run"])


@pytest.mark.skipif(not TORCH, reason="a derived model is built from its code by torch and transformers")
def test_a_remote_code_model_is_told_only_what_runs_its_code(tmp_path, capsys, monkeypatch):
    """A model directory with its own modeling code runs only with --trust-remote-code: day0 adds it
    where the verb has it and leaves out (saying why) the verbs without it, such as validate."""
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "tinyx"
    shutil.copytree(DATA / "remote_tinyx", model)
    out, _ = run(capsys, ["day0", "tinyx", "-a", "h100", "-n", "8", "--gbs", "64", "--trust-remote-code", "--out", "r"])
    cmds = printed_commands(out)
    assert cmds and not any("validate" in c for c in cmds)
    assert "not suggested: dayzero validate" in out
    for c in cmds:
        parses(c)
        assert "--trust-remote-code" in c
    # the verb the advice left out does refuse it: the reason given is true
    assert main(["validate", "tinyx"]) == 2
    capsys.readouterr()


def test_for_model_keeps_what_runs():
    from dayzero.cli.next_steps import Step, for_model

    steps = [Step.of("dayzero", "validate", "m", "--nproc", 2), Step.of("dayzero", "plan", "m"),
             Step.of("torchrun", "--nnodes", 2, "-m", "dayzero", "train", "m"), Step.of("echo", "hi")]
    assert for_model(steps, {"derived_from_modeling_code": False}) == (steps, [])
    keep, why = for_model(steps, {"derived_from_modeling_code": True, "remote_code": True})
    assert [s.argv for s in keep] == [("dayzero", "plan", "m", "--trust-remote-code"), ("echo", "hi")]
    assert len(why) == 2 and "validate" in why[0] and "train" in why[1] and "--trust-remote-code" in why[1]
    # a type transformers ships, derived from its code: every verb runs it (validate states the approximations)
    assert for_model(steps, {"derived_from_modeling_code": True, "remote_code": False}) == (steps, [])


def test_a_cluster_too_small_says_the_smallest_count_and_no_flag_day0_lacks(tmp_path, capsys):
    # a model that needs several cards: deepseek-v3 (671B) on one H100 node is far too small
    code = main(["day0", "deepseek-v3", "-a", "h100", "-n", "8", "--no-ops",
                 "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "--max-memory" not in err  # day0 has no such flag
    m = re.search(r"the smallest device count that fits is ([\d,]+) \(searched ([\d, ]+) devices", err)
    assert m, err
    n = int(m.group(1).replace(",", ""))
    searched = [int(x) for x in m.group(2).replace(" ", "").split(",")]
    assert searched[-1] == n and searched[0] == 16 and all(b == 2 * a for a, b in zip(searched, searched[1:]))
    # and it does fit there (the same search), and not at the count before
    run(capsys, ["day0", "deepseek-v3", "-a", "h100", "-n", str(n), "--no-ops", "--json",
                 "--out", str(tmp_path / "fits")])
    # plan has the flag, and says so
    assert main(["plan", "deepseek-v3", "-a", "h100", "-n", "8"]) == 2
    assert "raise --max-memory" in capsys.readouterr().err


def test_a_finding_in_brackets_prints_as_written(tmp_path, capsys, monkeypatch):
    """``pip install 'dayzero[ops]'`` reached the terminal as ``'dayzero'``: rich took [ops] as markup."""
    import dayzero.report.day0 as day0

    monkeypatch.setattr(day0, "missing", lambda *modules: list(modules))
    monkeypatch.chdir(tmp_path)
    out, _ = run(capsys, ["day0", "tiny-llama", "-a", "h100", "-n", "8", "--gbs", "64", "--out", "r"])
    assert "pip install 'dayzero[ops]'" in " ".join(out.split())
