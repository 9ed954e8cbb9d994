"""Suggestions by edit distance for every name a user types (dayzero.names): issue 34 found
``deepseekv3`` with no suggestion and ``h1000`` with a list of 30 names lacking ``h100``."""

from __future__ import annotations

import pytest

from dayzero.cli.app import main
from dayzero.names import did_you_mean, key, nearest


def test_key_ignores_case_and_separators():
    assert key("DeepSeek_V3") == key("deepseek-v3") == key("deepseekv3") == "deepseekv3"


def test_nearest_is_by_similarity_and_containment():
    known = ["deepseek-v3", "dense-3t", "llama-3.1-8b", "llama-3.1-70b"]
    assert nearest("deepseekv3", known)[0] == "deepseek-v3"
    assert nearest("llama3.1-8b", known)[0] == "llama-3.1-8b"
    assert nearest("h1000", ["h100", "h200", "a100", "910b"])[0] == "h100"
    assert nearest("zzzz", known) == [] and did_you_mean("zzzz", known) == ""
    assert did_you_mean("megatronn", ["megatron", "deepspeed"]) == " (did you mean megatron?)"


@pytest.mark.parametrize("argv,want", [
    (["inspect", "deepseekv3"], "did you mean deepseek-v3"),
    (["inspect", "Qwen3-235B"], "did you mean qwen3-235b-a22b"),
    (["hardware", "h1000"], "did you mean h100"),
    (["plan", "-a", "h1000", "-n", "8"], "did you mean h100"),
    (["plan", "--cluster", "dgx-h100"], "did you mean dgx-h100-1024"),
    (["plan", "--precision", "bf61"], "did you mean bf16"),
    (["plan", "--engine", "megatronn"], "did you mean megatron"),
    (["ops", "tiny-llama", "--manifest", "cudaa"], "did you mean cuda"),
    (["export", "tiny-llama", "--to", "slurmm"], "did you mean slurm"),
])
def test_every_lookup_suggests_the_nearest(argv, want, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and want in err, err
    assert len(err) < 300, err  # the nearest names, not the whole catalog
