"""The torchtitan export names torchtitan's own registered config whose model equals the planned one,
proven by torchtitan building it on the meta device with `dayzero inspect`'s parameter count; a model
no registered config equals is refused with what differs (issue #34)."""

from __future__ import annotations

import pytest

from dayzero.errors import ConfigError
from dayzero.export import torchtitan
from dayzero.specs.counting import params_total
from dayzero.specs.parallel import ParallelConfig as P
from dayzero.specs.registry import load_model, model_presets

pytest.importorskip("torch")
pytest.importorskip("triton", reason="torchtitan 0.3's model modules import triton (pip install triton)")
models = pytest.importorskip("dayzero.export.torchtitan_models")

FAST = {"llama-3.1-8b", "tiny-llama"}
PRESETS = [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in sorted(model_presets())]


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_is_torchtitans_own_model_or_refused_with_what_differs(name):
    spec = load_model(name)
    try:
        exp = torchtitan.export(spec, P(dp=8, gbs=8, zero=3))
    except ConfigError as e:
        assert "torchtitan" in str(e) and spec.name in str(e)
        return
    cmd = exp.command
    module, config = cmd[cmd.index("--module") + 1], cmd[cmd.index("--config") + 1]
    assert config != torchtitan.CONFIG_VAR
    assert models.parameters(module, config) == params_total(spec, with_mtp=True)


def test_the_llama_8b_export_is_llama3_8b():
    exp = torchtitan.export(load_model("llama-3.1-8b"), P(dp=8, gbs=8, zero=3))
    assert exp.command[exp.command.index("--config") + 1] == "llama3_8b" and exp.unexpressed == []


def test_a_model_of_other_dimensions_is_refused():
    from dataclasses import replace

    spec = load_model("llama-3.1-8b")
    with pytest.raises(ConfigError, match="registers no llama3 config"):
        torchtitan.export(replace(spec, hidden=spec.hidden + 128), P(dp=8, gbs=8, zero=3))
    with pytest.raises(ConfigError, match="no model module"):
        torchtitan.export(replace(spec, model_type="mamba2"), P(dp=8, gbs=8, zero=3))
