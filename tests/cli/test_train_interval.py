"""`dayzero train --plan` checkpoints at the interval the plan derived (planner/training_cost.py)."""

import json

from dayzero.cli.app import main


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_train_takes_the_plans_interval(tmp_path, capsys):
    pred = _json(capsys, ["predict", "tiny-llama", "-a", "h100", "-n", "2", "--dp", "2", "--gbs", "8", "--seq", "256",
                          "--json"])
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(pred))
    steps = pred["training"]["failures"]["optimal_checkpoint_interval_steps"]
    argv = ["train", "tiny-llama", "--plan", str(plan), "--nproc", "2", "--dry-run", "--json"]
    cfg = _json(capsys, [*argv, "--ckpt-dir", str(tmp_path / "ck")])
    assert cfg["checkpoint"]["every"] == steps > 1
    # an explicit --ckpt-every wins
    assert _json(capsys, [*argv, "--ckpt-dir", str(tmp_path / "ck"), "--ckpt-every", "7"])["checkpoint"]["every"] == 7
