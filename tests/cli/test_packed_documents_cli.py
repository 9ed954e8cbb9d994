"""``--reset-attention-mask`` on train and validate: packed documents attend within themselves; the
pre-flight refuses what cannot run it, and validate prices the trained windows' document length."""

from __future__ import annotations

import json

import pytest

from dayzero.cli.app import main


def _corpus(tmp_path, docs: int = 40, size: int = 30):
    d = tmp_path / "docs"
    d.mkdir()
    for i in range(docs):
        (d / f"{i:03d}.txt").write_text(("word%d " % i * 20)[:size])
    return d


def test_train_dry_run_carries_it_and_pp2_is_refused(tmp_path, capsys):
    argv = ["train", "tiny-llama", "--data", str(_corpus(tmp_path)), "--reset-attention-mask", "--dry-run", "--json"]
    assert main([*argv, "--nproc", "2", "--dp", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["reset_attention_mask"] is True
    assert main([*argv, "--nproc", "2", "--pp", "2", "--gbs", "4"]) == 2
    assert "only the first stage holds" in capsys.readouterr().err


@pytest.mark.slow
def test_validate_prices_the_windows_documents(tmp_path, capsys):
    """Documents of 31 tokens (30 bytes + EOS) in windows of 64: the planner's document length is the
    trained windows' (well under the window), and the loss still falls."""
    argv = ["validate", "tiny-llama", "--data", str(_corpus(tmp_path)), "--reset-attention-mask", "--seq", "64",
            "--steps", "6", "--nproc", "1", "--json"]
    assert main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    assert 10 < got["run"]["document_length"] < 40  # documents of 31 tokens cut by windows of 64
    assert {c["metric"]: c["pass"] for c in got["checks"]}["loss_trend"]
