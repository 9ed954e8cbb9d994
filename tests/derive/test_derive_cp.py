"""Context parallelism for a model derived from its own modeling code (runtime.parallel.hf_context): each
cp rank a slice of the sequence, the all-to-all of heads around transformers' attention core, the mask of
the whole sequence; what cannot be split that way refused naming the module. Tiny configs (NEW_TYPES of
test_derive, and a few built here), fp32 on CPU; the multi-rank gloo runs are marked slow."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_derive import NEW_TYPES, T, write_config  # noqa: E402

from dayzero.cli.app import main  # noqa: E402
from dayzero.errors import LayoutError  # noqa: E402
from dayzero.runtime.config import ModelSection  # noqa: E402
from dayzero.runtime.models.hf_model import build_proxy  # noqa: E402
from dayzero.runtime.parallel.hf_context import check_cp  # noqa: E402

RUN = ["--steps", "3", "--seq", "32", "--gbs", "4", "--compute-dtype", "fp32", "--quiet"]
SSM = dict(mamba_d_head=16, mamba_n_heads=8, mamba_d_state=16, mamba_n_groups=1, mamba_chunk_size=16)
BUILT = {  # types whose tiny configs are built here (beside NEW_TYPES)
    # sliding and full layers, per-head attention sinks (s_aux), eager core
    "gpt_oss": dict(T, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                    layer_types=["sliding_attention", "full_attention"] * 2),
    "bamba": dict(T, attn_layer_indices=[1], **SSM),  # Mamba-2 layers and attention layers
    "falcon_h1": dict(T, head_dim=16, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_d_state=16,
                      mamba_n_groups=1, mamba_chunk_size=16),  # a Mamba-2 mixer beside the attention in each layer
}


def config_dir(tmp_path, model_type: str) -> str:
    return write_config(tmp_path, model_type, dict(BUILT.get(model_type) or NEW_TYPES[model_type], vocab_size=512))


def proxy(tmp_path, model_type: str):
    return build_proxy(ModelSection(config_dir(tmp_path, model_type)), 0)


def test_a_model_whose_every_layer_calls_the_attention_interface_passes(tmp_path):
    assert check_cp(proxy(tmp_path, "olmo2"), 2) == 4  # one core per decoder layer


@pytest.mark.parametrize("model_type, cp, expect", [
    # Mamba-2 layers: their state runs along the sequence, no attention call
    ("bamba", 2, "model.layers.0.mamba (BambaMixer): its token mixer never calls transformers' attention interface"),
    # DeepSeek sparse attention: the indexer reads the mask with the slice's keys
    ("deepseek_v32", 2, "model.layers.0.self_attn.indexer (DeepseekV32Indexer): fails when its attention mask covers "
                        "the whole sequence of 16 tokens"),
    ("olmo2", 4, "model.layers.0 (Olmo2Attention): 4 query and 2 key/value heads per tp rank do not split over cp 4"),
])
def test_what_cp_cannot_split_is_refused_naming_the_module(model_type, cp, expect, tmp_path):
    with pytest.raises(LayoutError, match="^" + expect.replace("(", r"\(").replace(")", r"\)")) as e:
        check_cp(proxy(tmp_path, model_type), cp)
    assert "\n" not in str(e.value)


def test_a_hybrid_ssm_refuses_cp_in_one_line_before_any_rank_starts(tmp_path, capsys):
    """A parallel hybrid: the attention is called, but a Mamba-2 mixer runs beside it in each layer."""
    path = config_dir(tmp_path, "falcon_h1")
    assert main(["train", path, *RUN, "--nproc", "2", "--cp", "2", "--cp-comm", "a2a"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dayzero: error: model.layers.0.mamba (FalconH1Mixer): a recurrent or "
                                               "convolutional token mixer beside the attention"), err
    assert "use --dp/--tp" in err[0]


def losses(path: str, tmp_path, name: str, *extra: str) -> list[float]:
    metrics = tmp_path / f"{name}.jsonl"
    code = main(["train", path, *RUN, *extra, "--metrics", str(metrics)])
    assert code == 0
    return [json.loads(line)["loss"] for line in metrics.read_text().splitlines()
            if '"step"' in line and "event" not in line]


@pytest.mark.slow  # a single-process run and 2- and 4-rank gloo runs
@pytest.mark.parametrize("model_type, layouts", [
    ("olmo2", [("--cp", "2"), ("--dp", "2", "--cp", "2")]),  # GQA, a norm over all heads
    ("gpt_oss", [("--cp", "2")]),  # sliding windows and attention sinks
])
def test_cp_matches_single_process(model_type, layouts, tmp_path, capsys):
    """The sequence split over cp ranks, heads exchanged around transformers' core: one process's losses."""
    path = config_dir(tmp_path, model_type)
    single = losses(path, tmp_path, "single")
    assert len(single) == 3 and single[-1] < single[0], single
    for i, layout in enumerate(layouts):
        ranks = str(math.prod(int(v) for v in layout[1::2]))
        got = losses(path, tmp_path, f"layout{i}", "--nproc", ranks, "--cp-comm", "a2a", *layout)
        assert len(got) == 3 and max(abs(a - b) / b for a, b in zip(got, single)) < 1e-5, (layout, got, single)
