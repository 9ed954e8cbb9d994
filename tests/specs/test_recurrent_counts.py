"""Recurrent mixers (Mamba-2, Gated DeltaNet): dayzero's counts equal transformers' own modules.

Each mixer is built by transformers on the meta device from a small config; the shapes dayzero
reads (RecurrentSpec) must give its parameter count to the unit, and its input/output projection
widths. The scan FLOPs are pinned to the SSD and chunkwise delta-rule formulas by hand.
"""

from __future__ import annotations

import pytest

from dayzero.specs.counting import recurrent_matmul_params, recurrent_params, recurrent_scan_flops_per_token
from dayzero.specs.model import RecurrentSpec

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _meta(build):
    with torch.device("meta"):
        return build()


def _count(module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("use_bias,use_conv_bias,groups", [(False, True, 8), (True, False, 1), (False, True, 2)])
def test_nemotron_h_mamba2_mixer(use_bias, use_conv_bias, groups):
    from transformers.models.nemotron_h import modeling_nemotron_h as m

    cfg = transformers.NemotronHConfig(hidden_size=96, mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=24,
                                       n_groups=groups, conv_kernel=4, use_bias=use_bias,
                                       use_conv_bias=use_conv_bias, num_hidden_layers=1,
                                       layers_block_type=["mamba"])
    mixer = _meta(lambda: m.NemotronHMamba2Mixer(cfg, layer_idx=0))
    r = RecurrentSpec(kind="mamba2", heads=8, head_dim=16, d_state=24, n_groups=groups, conv_kernel=4,
                      conv_bias=use_conv_bias, proj_bias=use_bias)
    assert recurrent_params(r, 96) == _count(mixer)
    assert mixer.in_proj.out_features == r.in_features == 2 * 128 + 2 * groups * 24 + 8
    assert mixer.conv1d.in_channels == r.conv_channels
    assert recurrent_matmul_params(r, 96) == mixer.in_proj.weight.numel() + mixer.out_proj.weight.numel()


def test_mamba2_mixer():
    from transformers.models.mamba2 import modeling_mamba2 as m

    cfg = transformers.Mamba2Config(hidden_size=64, num_heads=4, head_dim=32, expand=2, state_size=16, n_groups=2,
                                    conv_kernel=4, use_bias=False, use_conv_bias=True, num_hidden_layers=1)
    mixer = _meta(lambda: m.Mamba2Mixer(cfg, layer_idx=0))
    r = RecurrentSpec(kind="mamba2", heads=4, head_dim=32, d_state=16, n_groups=2, conv_kernel=4)
    assert recurrent_params(r, 64) == _count(mixer)


def test_qwen3_next_gated_deltanet():
    from transformers.models.qwen3_next import modeling_qwen3_next as m

    cfg = transformers.Qwen3NextConfig(hidden_size=96, linear_num_key_heads=4, linear_key_head_dim=16,
                                       linear_num_value_heads=8, linear_value_head_dim=24, linear_conv_kernel_dim=4,
                                       num_hidden_layers=1, layer_types=["linear_attention"])
    mixer = _meta(lambda: m.Qwen3NextGatedDeltaNet(cfg, layer_idx=0))
    r = RecurrentSpec(kind="gated_deltanet", heads=8, head_dim=24, key_heads=4, key_head_dim=16, conv_kernel=4,
                      chunk_size=64, conv_bias=False)
    assert recurrent_params(r, 96) == _count(mixer)
    assert mixer.in_proj_qkvz.out_features + mixer.in_proj_ba.out_features == r.in_features


def test_scan_flops_by_hand():
    """SSD (Dao & Gu 2024, sec. 6): per token 2 x [Q N G + heads (Q P + 2 N P)] forward.
    Q = 256, N = 128, G = 8, heads = 128, P = 64 (Nemotron-H 8B's mixer):
    2 x (262,144 + 128 x (16,384 + 16,384)) = 8,912,896."""
    r = RecurrentSpec(kind="mamba2", heads=128, head_dim=64, d_state=128, n_groups=8, chunk_size=256)
    assert recurrent_scan_flops_per_token(r, 8192, causal=False) == 8_912_896
    # linear in sequence length: the same per token at 8K and 128K; a short sequence uses its length as the chunk
    assert recurrent_scan_flops_per_token(r, 131072, causal=False) == 8_912_896
    assert recurrent_scan_flops_per_token(r, 128, causal=False) < 8_912_896
    # causal: (Q + 1) / 2 keys in the within-chunk products
    assert recurrent_scan_flops_per_token(r, 8192, causal=True) == 2 * (128.5 * 1024 + 128 * (128.5 * 64 + 16384))
    # chunkwise delta rule (Yang et al. 2024, sec. 3.3): 2 heads [Q (3 dk + 2 dv) + 3 dk dv]
    g = RecurrentSpec(kind="gated_deltanet", heads=32, head_dim=128, key_heads=16, key_head_dim=128, chunk_size=64)
    assert recurrent_scan_flops_per_token(g, 4096, causal=False) == 2 * 32 * (64 * 640 + 3 * 128 * 128)
