"""Packed documents with per-document attention (--reset-attention-mask): a document in a packed
window computes what it computes alone. RoPE scores depend on relative positions only, so with
per-document masks each document's outputs equal the model run on that document by itself."""

from __future__ import annotations

import pytest
import torch

from dayzero.errors import ConfigError
from dayzero.runtime.models.attention import document_ids, document_spans
from dayzero.runtime.models.model import Transformer
from dayzero.specs.registry import load_model

SEP = 256


def _model(name: str, separator: int | None) -> Transformer:
    spec = load_model(name).shrink(layers=2, hidden=64, vocab=300)
    torch.manual_seed(0)
    m = Transformer(spec, max_seq=64, document_separator=separator)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.2)
    m.init_buffers()
    return m


def test_document_ids_end_each_document_at_its_separator():
    ids = torch.tensor([[5, 6, SEP, 7, 8, 9, SEP, 1], [1, 2, 3, 4, 5, 6, 7, 8]])
    assert document_ids(ids, SEP).tolist() == [[0, 0, 0, 1, 1, 1, 1, 2], [0] * 8]
    assert document_spans(document_ids(ids, SEP)) == [[(0, 3), (3, 7), (7, 8)], [(0, 8)]]


@pytest.mark.parametrize("name", ["llama-3.1-8b", "deepseek-v3", "gpt-oss-120b"])  # GQA, MLA, sinks + windows
def test_each_packed_document_computes_what_it_computes_alone(name):
    packed, alone = _model(name, SEP), _model(name, None)
    alone.load_state_dict(packed.state_dict())
    g = torch.Generator().manual_seed(1)
    a, b = torch.randint(0, 200, (1, 11), generator=g), torch.randint(0, 200, (1, 20), generator=g)
    a[0, -1] = SEP  # the separator ends (and belongs to) the first document
    with torch.no_grad():
        out = packed(torch.cat([a, b], dim=1))
        first, second = alone(a), alone(b)
        whole = alone(torch.cat([a, b], dim=1))
    torch.testing.assert_close(out[:, :11], first, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out[:, 11:], second, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(whole[:, 11:], second, atol=1e-3)  # without the masks the second document sees the first


def test_a_later_pipeline_stage_cannot_read_the_documents():
    m = _model("llama-3.1-8b", SEP)
    m.tok_embeddings = None
    with pytest.raises(ConfigError, match="pp 1"):
        m(torch.zeros(1, 8, 64))


def test_the_document_length_the_planner_prices_equals_the_windows_attention():
    """Documents of 3, 4 and 1 tokens in a window of 8: 3*4/2 + 4*5/2 + 1*2/2 = 17 keys, so
    (d + 1) / 2 = 17 / 8 and d = 3.25; one document fills the window: d = 8."""
    import numpy as np

    from dayzero.runtime.data import document_context
    from dayzero.specs.counting import attention_context

    w = np.array([5, 6, SEP, 7, 8, 9, SEP, 1])
    d = document_context(w, SEP)
    assert d == 3.25
    spec = load_model("llama-3.1-8b")
    import dataclasses

    packed = dataclasses.replace(spec, document_length=d)
    assert attention_context(packed, 8, 0, causal=True) * 8 == 17  # the planner's keys equal the window's
    assert document_context(np.arange(8), SEP) == 8
