"""Malformed safetensors for ``--hf-weights`` and ``ckpt import``: every way a file can fail to
be safetensors is one ConfigError naming the file (issue #22, finding 8), never the library's
SafetensorError traceback."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from dayzero.errors import DayzeroError
from dayzero.runtime.checkpoint.hf_weights import HFCheckpoint, checkpoint_config
from dayzero.runtime.checkpoint.interchange import import_hf
from dayzero.specs.registry import load_model

pytest.importorskip("safetensors")


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    from safetensors.torch import save_file

    d = tmp_path_factory.mktemp("hf")
    save_file({"a": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.ones(5)}, str(d / "m.safetensors"))
    return (d / "m.safetensors").read_bytes()


def _parts(raw):
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _pack(header, body):
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + body


def _edit(raw, f):
    header, body = _parts(raw)
    f(header)
    return _pack(header, body)


BAD = {
    "not safetensors": lambda raw: b"this is not a safetensors file",
    "empty": lambda raw: b"",
    "truncated": lambda raw: raw[: len(raw) // 2],
    "header length past the file": lambda raw: struct.pack("<Q", 2**60) + raw[8:],
    "header not JSON": lambda raw: struct.pack("<Q", 5) + b"{{{{{" + _parts(raw)[1],
    "unknown dtype": lambda raw: _edit(raw, lambda h: h["a"].update(dtype="Q9")),
    "offsets outside the file": lambda raw: _edit(raw, lambda h: h["a"].update(data_offsets=[0, 10**12])),
    "shape disagrees with the bytes": lambda raw: _edit(raw, lambda h: h["a"].update(shape=[7, 7])),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_ckpt_import_of_a_malformed_file_is_one_clear_error(good, tmp_path, case):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "model.safetensors").write_bytes(BAD[case](good))
    with pytest.raises(DayzeroError, match="model.safetensors") as e:
        import_hf(hf, tmp_path / "root")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "root").exists() or not any((tmp_path / "root").glob("step-*"))  # nothing written


@pytest.mark.parametrize("case", sorted(BAD))
def test_hf_weights_of_a_malformed_file_is_one_clear_error(good, tmp_path, case):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "model.safetensors").write_bytes(BAD[case](good))
    with pytest.raises(DayzeroError, match="model.safetensors") as e:
        ck = HFCheckpoint(hf, load_model("tiny-llama"))
        ck.tensor("tok_embeddings.weight", (1, 1))
    assert "\n" not in str(e.value)


def test_the_good_file_imports(good, tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "model.safetensors").write_bytes(good)
    assert import_hf(hf, tmp_path / "root").name.startswith("step-")


@pytest.mark.parametrize("raw", [b"\xff\xfe garbage", b"{", b"[" * 100000])
def test_a_checkpoints_config_json_that_is_not_json_text_is_one_clear_error(tmp_path, raw):
    (tmp_path / "config.json").write_bytes(raw)
    with pytest.raises(DayzeroError, match="config.json") as e:
        checkpoint_config(tmp_path)
    assert "\n" not in str(e.value)
