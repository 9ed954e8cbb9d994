"""Output that keeps its promise (issue 34): no line over the console width (approximations and
unused config keys wrap at spaces under a hanging indent), scripts printed whole, class names
never broken mid-word, one unit vocabulary for device memory (GiB, labelled), and tables that
wrap rather than cut."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from dayzero.cli import common
from dayzero.cli.app import main

TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))


@pytest.fixture
def width80(monkeypatch):
    for c in (common.console, common.err_console):
        monkeypatch.setattr(c, "_width", 80)


def run(capsys, argv):
    code = main(argv)
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out, out.err


def test_hanging_wraps_at_spaces_and_keeps_words_whole():
    from dayzero.cli.render import hanging

    long_word = "modeling_" + "x" * 90 + ".py"
    t = hanging("approximation: ", "a " * 100 + long_word, 40).plain.splitlines()
    assert t[0].startswith("approximation: ") and all(line.startswith("  ") for line in t[1:])
    assert all(len(line) <= 40 for line in t if long_word not in line) and any(long_word in line for line in t)


@pytest.mark.skipif(not TORCH, reason="a derived model is built from its code by torch and transformers")
def test_model_notes_wrap_within_the_console(tmp_path, capsys, width80):
    """Qwen3-Next's approximations were ~300-character lines."""
    d = tmp_path / "q3n"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3_next", "unknown_key_for_the_test": 1}))
    out, err = run(capsys, ["inspect", str(d)])
    assert "approximation:" in err and "config keys not used: unknown_key_for_the_test" in err
    assert [line for line in (out + err).splitlines() if len(line) > 80] == []
    # class names whole: the layer-kind table goes vertical rather than folding Qwen3NextGatedDeltaNet
    assert "Qwen3NextGatedDeltaNet" in out and "Qwen3NextSparseMoeBlock" in out


def test_a_script_printed_to_the_terminal_is_the_file_verbatim(tmp_path, capsys, width80):
    out, _ = run(capsys, ["export", "llama-3.1-70b", "--to", "slurm", "--devices", "64", "--tp", "8", "--pp", "2",
                          "--gbs", "8", "-o", str(tmp_path)])  # a pipeline needs >= pp micro-batches
    script = (tmp_path / "dayzero.sbatch").read_text()
    assert script in out  # every line whole, however long: copy-paste runs it
    assert any(len(line) > 80 for line in script.splitlines())  # the check can fail: some line is long


def test_monitor_rules_cut_nothing(capsys, width80):
    from dayzero.monitor.rules import RULES

    out, _ = run(capsys, ["monitor", "--rules"])
    assert "…" not in out and all(r.name in out for r in RULES)
    assert [line for line in out.splitlines() if len(line) > 80] == []


def test_device_memory_is_gib_everywhere(capsys, width80):
    """A 64 GiB 910B printed as '68.7195 GB each' (memory), 'HBM GB 80' (compare) for an 80 GiB
    H100, and a day0 peak in GB against a capacity in GiB: one unit, labelled."""
    out, _ = run(capsys, ["memory", "llama-3.1-8b", "-a", "910b", "-n", "8", "--tp", "8", "--gbs", "8",
                          "--no-simulate"])
    assert "64 GiB each" in out and "68.7" not in out and not re.search(r"\bGB\b(?!/s)", out.replace("TB", ""))
    out, _ = run(capsys, ["compare", "llama-3.1-8b", "--accelerators", "h100,910b", "--devices", "8", "--gbs", "64"])
    row = next(line for line in out.splitlines() if line.startswith("HBM"))
    assert row.split()[:2] == ["HBM", "GiB"] and row.split()[2:] == ["80", "64"]
    out, _ = run(capsys, ["hardware", "910b"])
    assert re.search(r"HBM capacity\s+64 GiB", out)
    obj = json.loads(run(capsys, ["hardware", "h100", "--json"])[0])
    assert obj["hbm_gib"] == 80


def test_day0_summary_fits_and_says_gib(tmp_path, capsys, width80):
    out, _ = run(capsys, ["day0", "tiny-llama", "-a", "910b", "-n", "8", "--gbs", "64", "--no-ops",
                          "--out", str(tmp_path)])
    # device memory in GiB; decimal GB only for whole-model byte counts (the seed's "600 GB" claim)
    device_lines = [ln for ln in out.splitlines() if "claim" not in ln and "B = " not in ln and "parameters:" not in ln]
    assert re.search(r"peak [\d.]+ GiB", out) and not any("GB " in ln for ln in device_lines)
    md = (tmp_path / "report.md").read_text()
    assert "Memory per stage of the best plan (GiB)" in md
