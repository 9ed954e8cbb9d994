"""Bad input gets one clear line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dayzero.cli.app import main
from dayzero.errors import ConfigError
from dayzero.specs.hf_config import spec_from_hf_config
from dayzero.specs.model import ModelSpec
from dayzero.specs.registry import model_presets


def run_cli(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *needles):
    assert code == 2
    lines = [ln for ln in err.strip().splitlines() if ln]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], (n, lines[0])


def write(tmp_path, text, name="config.json"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100}


@pytest.mark.parametrize("text,needles", [
    ("{not json", ["malformed JSON", "line 1"]),
    ("[1, 2]", ["expected a JSON object"]),
    # a model_type without a parser is derived from transformers' code; one transformers lacks is refused
    (json.dumps({**LLAMA, "model_type": "quantum_llm"}),
     ["model_type", "'quantum_llm' is not implemented by transformers", "--trust-remote-code"]),
    (json.dumps({**LLAMA, "model_type": "olmo2", "num_hidden_layers": 10**9}), ["num_hidden_layers", "exceeds"]),
    (json.dumps({k: v for k, v in LLAMA.items() if k != "hidden_size"}), ["hidden_size", "missing"]),
    (json.dumps({**LLAMA, "hidden_size": "big"}), ["hidden_size", "expected an integer"]),
    (json.dumps({**LLAMA, "num_key_value_heads": 3}), ["num_key_value_heads", "divisible"]),
    (json.dumps({**LLAMA, "vocab_size": -5}), ["vocab_size", ">= 1"]),
    (json.dumps({**LLAMA, "tie_word_embeddings": "yes"}), ["tie_word_embeddings", "true or false"]),
])
def test_malformed_configs(tmp_path, capsys, text, needles):
    path = write(tmp_path, text)
    code, _, err = run_cli(["inspect", path], capsys)
    assert_one_line_error(code, err, path, *needles)


def test_missing_file_and_unknown_preset(tmp_path, capsys):
    code, _, err = run_cli(["inspect", str(tmp_path / "nope.json")], capsys)
    assert_one_line_error(code, err, "no such preset or file")
    code, _, err = run_cli(["inspect", "llama-3.1"], capsys)
    assert_one_line_error(code, err, "did you mean")


def test_unknown_accelerator(capsys):
    code, _, err = run_cli(["hardware", "tpu-v9"], capsys)
    assert_one_line_error(code, err, "tpu-v9: no such accelerator or cluster preset", "did you mean tpu-v4")
    code, _, err = run_cli(["plan", "-a", "tpu-v9", "-n", "8"], capsys)
    assert_one_line_error(code, err, "unknown accelerator 'tpu-v9'", "did you mean tpu-v4")


@pytest.mark.parametrize("yaml_text,needles", [
    ("accelerator: h100\nnodes: 2\ncolour: blue\n", ["colour", "Extra inputs"]),
    ("accelerator: h100\nnodes: -1\n", ["nodes", "greater than or equal to 1"]),
    ("accelerator: h100\nnodes: [1\n", ["malformed YAML"]),
    ("accelerator: nosuchcard\nnodes: 1\n", ["unknown accelerator"]),
    ("- 1\n- 2\n", ["expected a mapping"]),
])
def test_bad_cluster_yaml(tmp_path, yaml_text, needles):
    from dayzero.specs.cluster import get_cluster

    path = write(tmp_path, yaml_text, "c.yaml")
    with pytest.raises(ConfigError) as e:
        get_cluster(path)
    msg = str(e.value)
    assert "\n" not in msg
    for n in needles:
        assert n in msg


# -- property-based: any JSON object either parses or raises ConfigError ------------------------

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**12),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8))
json_values = st.recursive(json_scalars, lambda c: st.one_of(st.lists(c, max_size=4),
                                                             st.dictionaries(st.text(max_size=6), c, max_size=4)),
                           max_leaves=10)


def _parse_or_config_error(cfg):
    try:
        spec = spec_from_hf_config(cfg, "fuzz")
    except ConfigError as e:
        assert "\n" not in str(e)
        return None
    assert isinstance(spec, ModelSpec)
    return spec


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.text(max_size=12), json_values, max_size=8))
def test_arbitrary_json_objects(cfg):
    _parse_or_config_error(cfg)


REAL = [{k: v for k, v in cfg.items() if k != "_dayzero"} for cfg in model_presets().values()]
FIELDS = sorted({k for cfg in REAL for k in cfg})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(REAL), st.lists(st.tuples(st.sampled_from(FIELDS), st.one_of(st.just("<delete>"), json_values)),
                                       min_size=1, max_size=3))
def test_mutated_real_configs(cfg, mutations):
    cfg = dict(cfg)
    for key, value in mutations:
        if value == "<delete>":
            cfg.pop(key, None)
        else:
            cfg[key] = value
    spec = _parse_or_config_error(cfg)
    if spec is not None:  # whatever parses must also count without errors
        from dayzero.specs import counting

        assert counting.params_total(spec) > 0


def test_every_catalog_source_is_one_a_person_can_open():
    """issue 34: ``hardware 910b`` cited an internal index id. Every source of the accelerator
    catalog and the host systems names a document (its title, URL or repository), never a search
    index's internal id."""
    import json
    import re

    from dayzero.specs.presets import reference_data

    for name in ("hardware_catalog.json", "host_systems.json"):
        for entry in json.loads(reference_data(name).read_text()):
            for s in entry.get("sources", ()):
                names_a_document = len(s.split()) >= 3 or s.startswith("http")
                assert names_a_document and not re.search(r"index id|code[- ]index", s, re.IGNORECASE), (name, s)
