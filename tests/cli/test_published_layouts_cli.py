"""The published at-scale layouts fit from the CLI with the facts their papers state (issue #35):
Llama 3.1 405B (arXiv 2407.21783 sec. 3.3: tp8 pp16 vpp8 dp128, FSDP sharding optimizer states and
gradients = ZeRO-2, no recompute, 8K, 16M tokens a batch, expandable segments) and DeepSeek-V3
(arXiv 2412.19437 sec. 3: pp16 ep64, DualPipe, block-scaled FP8, FP8 dispatch, 20 reserved SMs,
recompute of RMSNorm / MLA up-projection / SwiGLU, BF16 moments, FP8 SwiGLU inputs, routing weights
on the SwiGLU input)."""

import json

import pytest

from dayzero.cli.app import main


def _predict(capsys, *argv):
    assert main(["predict", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_llama_405b_published_layout_fits_within_10_percent(capsys):
    d = _predict(capsys, "llama-3.1-405b", "-a", "h100", "-n", "16384", "--tp", "8", "--pp", "16", "--vpp", "8",
                 "--dp", "128", "--zero", "2", "--gbs", "2048", "--seq", "8192", "--allocator", "expandable",
                 "--sequence-parallel", "--no-tp-overlap")
    assert d["memory"]["fits"]
    assert d["throughput"]["model_tflops_per_device"] == pytest.approx(400, rel=0.10)


def test_deepseek_v3_published_layout_fits_within_15_percent(capsys):
    d = _predict(capsys, "deepseek-v3", "-a", "h800", "-n", "2048", "--tp", "1", "--pp", "16", "--ep", "64", "--dp",
                 "128", "--zero", "1", "--schedule", "dualpipe", "--precision", "fp8", "--fp8-scaling", "block",
                 "--fp8-dispatch", "--comm-sm-reserved", "--recompute", "selective", "--recompute-modules",
                 "layernorm,mla_up_proj,moe_act", "--moments", "bf16", "--activation-func-fp8-input-store",
                 "--moe-probs", "activation", "--gbs", "15360", "--seq", "4096")
    assert d["memory"]["fits"]
    assert d["throughput"]["tokens_per_s_per_device"] == pytest.approx(1543, rel=0.15)


def test_bad_allocator_and_moe_probs_are_one_line(capsys):
    for flag, value in (("--allocator", "greedy"), ("--moe-probs", "both")):
        assert main(["predict", "tiny-moe", "-a", "h100", "-n", "2", flag, value]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"dayzero: error: {flag}") and len(err.splitlines()) == 1
