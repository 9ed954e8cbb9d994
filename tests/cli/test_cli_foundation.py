"""The foundation verbs: models, hardware, inspect (tables and --json)."""

from __future__ import annotations

import json
import shutil

import pytest

from dayzero.cli.app import main
from dayzero.specs.registry import model_presets


def run_json(argv, capsys):
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_inspect_json_contract(capsys):
    obj = run_json(["inspect", "deepseek-v3"], capsys)
    for key in ("params_total", "params_active", "params_embedding", "flops_per_token_train", "layers"):
        assert key in obj
    assert obj["params_total"] == 671026419200 and obj["layers"] == 61
    with_mtp = run_json(["inspect", "deepseek-v3", "--with-mtp"], capsys)
    assert with_mtp["params_total"] == 682636487424
    kinds = {row["kind"] for row in obj["per_layer"]}
    assert kinds == {"dense", "moe"}
    moe_row = obj["per_layer"][10]
    assert moe_row["routed_experts"] > 0 and moe_row["shared_experts"] > 0 and moe_row["router"] == 256 * 7168 + 256


def test_inspect_a_never_seen_config_directory(tmp_path, capsys):
    cfg = {"model_type": "qwen3", "hidden_size": 1024, "num_hidden_layers": 7, "num_attention_heads": 16,
           "num_key_value_heads": 4, "head_dim": 80, "intermediate_size": 3000, "vocab_size": 32001,
           "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    obj = run_json(["inspect", str(tmp_path)], capsys)
    h, n_layers, v = 1024, 7, 32001
    attn = h * 16 * 80 + 2 * h * 4 * 80 + 16 * 80 * h + 2 * 80
    want = v * h + n_layers * (attn + 3 * h * 3000 + 2 * h) + h
    assert obj["params_total"] == want and obj["params_head"] == 0


def test_inspect_table_runs_for_every_preset(capsys):
    for name in model_presets():
        assert main(["inspect", name]) == 0
    assert "Per layer" in capsys.readouterr().out


def test_models_and_hardware_json(capsys):
    models = run_json(["models"], capsys)["models"]
    names = {m["name"] for m in models}
    assert {"dense-3t", "moe-3t", "tiny-llama", "tiny-moe", "gpt3-175b", "deepseek-v3", "kimi-k2"} <= names
    hw = run_json(["hardware"], capsys)
    assert {c["name"] for c in hw["clusters"]} >= {"ascend910b-8192", "dgx-a100-3072", "dgx-h100-1024",
                                                   "dgx-h100-16384", "gb200-nvl72-1152"}
    one = run_json(["hardware", "910B"], capsys)
    assert one["topology"] == "mesh" and one["intra_node_p2p_gbytes_per_s"] == 56
    assert run_json(["hardware", "gb200-nvl72-1152"], capsys)["tiers"][0]["size"] == 72


def test_console_script_is_installed():
    assert shutil.which("dayzero"), "pip install -e . provides the dayzero command"


@pytest.mark.parametrize("verb", ["models", "hardware", "inspect"])
def test_help_has_an_example(verb, capsys):
    assert main([verb, "--help"]) == 0
    assert "Example" in capsys.readouterr().out
