"""`dayzero ops` on the command line: JSON contract, manifest emission, one-line errors."""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from dayzero.cli.app import main  # noqa: E402
from helpers.paths import DATA

REMOTE = DATA / "remote_tinyx"


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_contract(capsys):
    code, out, err = run(capsys, "ops", "tiny-llama", "--seq", "64", "--manifest", "example-npu", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert isinstance(r["coverage"], float) and 0 < r["coverage"] < 1
    for o in r["ops"]:
        assert {"op", "count", "flops", "bytes", "supported", "decomposition"} <= set(o)
        assert (o["decomposition"] is None) == o["supported"]
    assert {u["op"] for u in r["unsupported"]} >= {"aten.silu.default", "aten.silu_backward.default"}
    assert all(u["decomposition"]["verified"] for u in r["unsupported"] if u["op"].startswith("aten.silu"))
    assert {f["pattern"] for f in r["fusions"]} >= {"attention", "rms_norm", "swiglu"}
    assert abs(r["flops_check"]["rel_diff"]) < 0.02
    assert sum(o["flops"] for o in r["ops"]) == r["flops"]


def test_tables(capsys):
    code, out, err = run(capsys, "ops", "tiny-llama", "--seq", "32", "--manifest", "example-npu", "--top", "5")
    assert code == 0, err
    for title in ("Operators", "Unsupported on example-npu", "Fusion opportunities", "coverage by FLOPs"):
        assert title in out


def test_emit_manifest_to_file(capsys, tmp_path):
    target = tmp_path / "cpu.yaml"
    code, out, err = run(capsys, "ops", "--emit-manifest", "CPU", "-o", str(target))
    assert code == 0, err
    code, out, err = run(capsys, "ops", "tiny-llama", "--seq", "32", "--manifest", str(target), "--json")
    assert code == 0, err
    assert json.loads(out)["coverage"] == 1.0


def _one_line_error(code, out, err):
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dayzero: error: "), err
    return lines[0]


def test_unknown_model_type(capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "quantum_llm", "hidden_size": 8}))
    line = _one_line_error(*run(capsys, "ops", str(tmp_path)))
    assert "quantum_llm" in line and "not implemented by transformers" in line


def test_unknown_preset(capsys):
    line = _one_line_error(*run(capsys, "ops", "llama-9000"))
    assert "llama-9000" in line


def test_remote_code_not_trusted(capsys, tmp_path):
    model = tmp_path / "tinyx"
    shutil.copytree(REMOTE, model)
    line = _one_line_error(*run(capsys, "ops", str(model)))
    assert "--trust-remote-code" in line and "modeling_tinyx.py" in line


@pytest.mark.parametrize("text", ["name: broken\nops: [aten.mm.default\n", "name: x\nops: [not-an-op]\n",
                                  "ops: [aten.mm.default]\n"])
def test_malformed_manifest(capsys, tmp_path, text):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    line = _one_line_error(*run(capsys, "ops", "tiny-llama", "--manifest", str(bad)))
    assert "bad.yaml" in line


def test_missing_manifest_and_bad_options(capsys):
    assert "no such manifest" in _one_line_error(*run(capsys, "ops", "tiny-llama", "--manifest", "tpu9"))
    assert "--experts-impl" in _one_line_error(*run(capsys, "ops", "tiny-llama", "--experts-impl", "magic"))
    assert "MODEL" in _one_line_error(*run(capsys, "ops"))


def test_code_that_needs_weight_values_fails_in_one_line(capsys, tmp_path):
    """A meta trace has no weight values: code branching on them must fail cleanly, naming where."""
    model = tmp_path / "tinyx_branching"  # its own name: transformers caches remote modules by directory name
    shutil.copytree(REMOTE, model)
    src = (model / "modeling_tinyx.py").read_text()
    src = src.replace("        for layer in self.layers:\n",
                      "        if self.lm_head.weight.sum() > 0:  # data-dependent branch on a weight\n"
                      "            x = x * 2\n        for layer in self.layers:\n")
    (model / "modeling_tinyx.py").write_text(src)
    line = _one_line_error(*run(capsys, "ops", str(model), "--trust-remote-code"))
    assert "tinyx_branching" in line and "weight" in line


def test_json_module_paths_name_layer_kinds(capsys):
    code, out, err = run(capsys, "ops", "tiny-moe", "--seq", "32", "--json", "--no-check")
    assert code == 0, err
    r = json.loads(out)
    gmm = next(o for o in r["ops"] if o["op"] == "aten._grouped_mm.default")
    assert set(gmm["modules"]) == {"model.layers[moe].mlp.experts"}
    assert gmm["layer_kinds"] == {"moe": gmm["count"]} and gmm["categories"] == {"mlp": gmm["count"]}
    assert gmm["phases"]["backward"] == 2 * gmm["phases"]["forward"]
