"""An export read back by the engine's own classes: the model the engine would build from the files
the export wrote, built on the meta device (no memory, no accelerator, no weights initialised) and
counted. This is the engine's verdict on the architecture, independent of dayzero's own formulas
(:mod:`dayzero.specs.counting`): a flag the export forgot, or wrote wrongly, changes the count.

* Megatron: the argument list parsed with the types Megatron-LM's ``arguments.py`` gives those
  flags, turned into Megatron-Core's ``TransformerConfig`` / ``MLATransformerConfig`` field by field
  as Megatron-LM's ``core_transformer_config_from_args`` does (a field takes the argument of its
  name; ``--swiglu``, ``--disable-bias-linear``, ``--num-experts``, ``--norm-epsilon`` and
  ``--untie-embeddings-and-output-weights`` are its renames), and ``GPTModel`` built from it with
  Megatron-Core's own layer specs (``get_gpt_decoder_block_spec``, local modules: no Transformer
  Engine), the vocabulary padded as Megatron-LM pads it (``--make-vocab-size-divisible-by`` x tp).
* DeepSpeed: ``DeepSpeedConfig`` parses ``ds_config.json`` (its batch arithmetic is DeepSpeed's
  check), and the model is the written Hugging Face ``config.json`` built by transformers'
  ``AutoModelForCausalLM.from_config``, the model the launch's ``train.py`` trains.

Needs the engines installed (the ``test`` extras); a single rank's process groups on gloo are
created for Megatron's parallel state when none exist.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
from unittest import mock

import torch


def _int_list(text: str):
    """Megatron-LM's ``moe_freq_type``: an integer or a Python list expression like ``[0]*3+[1]*58``."""
    try:
        return int(text)
    except ValueError:
        value = ast.literal_eval(text) if "*" not in text else _repeat(text)
        return list(value)


def _repeat(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split("+"):
        items, _, times = part.partition("*")
        out += list(ast.literal_eval(items.strip())) * int(times or 1)
    return out


def _model_parser() -> argparse.ArgumentParser:
    """The architecture flags with the types Megatron-LM's arguments.py gives them."""
    ap = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in ("--num-layers", "--hidden-size", "--num-attention-heads", "--ffn-hidden-size", "--kv-channels",
                 "--num-query-groups", "--max-position-embeddings", "--vocab-size", "--rotary-base",
                 "--kv-lora-rank", "--q-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim",
                 "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size",
                 "--moe-router-num-groups", "--moe-router-group-topk", "--mtp-num-layers",
                 "--make-vocab-size-divisible-by", "--tensor-model-parallel-size"):
        ap.add_argument(flag, type=int, default=None)
    for flag in ("--norm-epsilon", "--rope-scaling-factor", "--rotary-scaling-factor", "--mscale", "--mscale-all-dim",
                 "--moe-router-topk-scaling-factor", "--glu-linear-offset", "--activation-func-clamp-value"):
        ap.add_argument(flag, type=float, default=None)
    for flag in ("--position-embedding-type", "--normalization", "--rope-type", "--softmax-type",
                 "--moe-router-score-function"):
        ap.add_argument(flag, default=None)
    ap.add_argument("--window-size", type=lambda t: tuple(int(x) for x in t.strip("()").split(",")), default=None)
    for flag in ("--window-attn-skip-freq", "--moe-layer-freq"):
        ap.add_argument(flag, type=_int_list, default=None)
    for flag in ("--group-query-attention", "--multi-latent-attention", "--swiglu",
                 "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--add-qkv-bias",
                 "--qk-layernorm", "--use-rope-scaling",
                 "--rotary-interleaved", "--moe-shared-expert-gate", "--moe-router-enable-expert-bias",
                 "--quick-geglu"):
        ap.add_argument(flag, action="store_true")
    return ap


def megatron_configs(argv: list[str]):
    """(TransformerConfig or MLATransformerConfig, GPTModel keyword arguments) of a Megatron argument list."""
    import torch
    import torch.nn.functional as F
    from megatron.core.activations import quick_gelu
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    a, _ = _model_parser().parse_known_args(argv)
    kw = dict(num_layers=a.num_layers, hidden_size=a.hidden_size, num_attention_heads=a.num_attention_heads,
              ffn_hidden_size=a.ffn_hidden_size, kv_channels=a.kv_channels,
              num_query_groups=a.num_query_groups if a.group_query_attention else None,
              normalization=a.normalization or "LayerNorm", layernorm_epsilon=a.norm_epsilon or 1e-5,
              add_bias_linear=not a.disable_bias_linear, add_qkv_bias=a.add_qkv_bias, qk_layernorm=a.qk_layernorm,
              gated_linear_unit=a.swiglu or a.quick_geglu,
              activation_func=F.silu if a.swiglu else quick_gelu if a.quick_geglu else F.gelu,
              glu_linear_offset=a.glu_linear_offset or 0.0, activation_func_clamp_value=a.activation_func_clamp_value,
              rotary_interleaved=a.rotary_interleaved, softmax_type=a.softmax_type or "vanilla",
              window_size=a.window_size, window_attn_skip_freq=a.window_attn_skip_freq,
              mtp_num_layers=a.mtp_num_layers, use_cpu_initialization=True, perform_initialization=False,
              params_dtype=torch.bfloat16, bf16=True)
    if a.num_experts:
        kw.update(num_moe_experts=a.num_experts, moe_router_topk=a.moe_router_topk,
                  moe_ffn_hidden_size=a.moe_ffn_hidden_size,
                  moe_shared_expert_intermediate_size=a.moe_shared_expert_intermediate_size,
                  moe_shared_expert_gate=a.moe_shared_expert_gate,
                  moe_router_score_function=a.moe_router_score_function or "softmax",
                  moe_router_enable_expert_bias=a.moe_router_enable_expert_bias,
                  moe_router_num_groups=a.moe_router_num_groups, moe_router_group_topk=a.moe_router_group_topk,
                  moe_router_topk_scaling_factor=a.moe_router_topk_scaling_factor,
                  moe_layer_freq=a.moe_layer_freq if a.moe_layer_freq is not None else 1,
                  moe_token_dispatcher_type="allgather")  # no parameters; needs no CUDA stream
    if a.multi_latent_attention:
        kw.update(q_lora_rank=a.q_lora_rank, kv_lora_rank=a.kv_lora_rank, qk_head_dim=a.qk_head_dim,
                  qk_pos_emb_head_dim=a.qk_pos_emb_head_dim, v_head_dim=a.v_head_dim,
                  rope_type=a.rope_type or "yarn", rotary_base=a.rotary_base or 10000)
        for key in ("rotary_scaling_factor", "mscale", "mscale_all_dim"):
            if getattr(a, key) is not None:
                kw[key] = getattr(a, key)
        config = MLATransformerConfig(**kw)
    else:
        config = TransformerConfig(**kw)
    multiple = (a.make_vocab_size_divisible_by or 128) * (a.tensor_model_parallel_size or 1)
    vocab = -(-a.vocab_size // multiple) * multiple  # Megatron-LM's _vocab_size_with_padding
    model = dict(vocab_size=vocab, max_sequence_length=a.max_position_embeddings,
                 position_embedding_type=a.position_embedding_type or "learned_absolute",
                 rotary_base=a.rotary_base or 10000, rope_scaling=a.use_rope_scaling,
                 rope_scaling_factor=a.rope_scaling_factor or 8.0,
                 share_embeddings_and_output_weights=not a.untie_embeddings_and_output_weights)
    return config, model


@contextlib.contextmanager
def _single_rank():
    """Megatron-Core's model-parallel state on one gloo rank (an in-memory store: no port, no process)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    made = not dist.is_initialized()
    if made:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel()
    try:
        yield
    finally:
        if made:
            parallel_state.destroy_model_parallel()
            dist.destroy_process_group()


def megatron_parameters(argv: list[str]) -> int:
    """Parameters of the GPTModel Megatron-Core builds from ``argv`` (MTP modules included)."""
    import torch
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_mtp_block_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    config, model = megatron_configs(argv)
    # a learnable-softmax offset asks for a card; MLA checks Transformer Engine's linear type even where the
    # engine's import shim stood in for the missing package (multi_latent_attention.HAVE_TE, TELinear None)
    with _single_rank(), torch.device("meta"), mock.patch("torch.cuda.current_device", lambda: "meta"), \
            mock.patch("megatron.core.transformer.multi_latent_attention.HAVE_TE", False):
        block = get_gpt_decoder_block_spec(config, use_transformer_engine=False)
        for layer in block.layer_specs:
            _without_kernel(layer)
        mtp = (get_gpt_mtp_block_spec(config, block.layer_specs[-1], use_transformer_engine=False)
               if config.mtp_num_layers else None)
        gpt = GPTModel(config, block, mtp_block_spec=mtp, **model)
    # the aux-loss-free routing bias is a buffer in Megatron-Core (router.py expert_bias), a weight elsewhere
    extra = sum(b.numel() for n, b in gpt.named_buffers() if n.endswith("expert_bias"))
    return sum(p.numel() for p in gpt.parameters()) + extra


class _CoreAttention(torch.nn.Module):
    """Stands in for MLA's core attention, which Megatron-Core builds only with Transformer Engine's
    kernel (its local DotProductAttention takes no ``k_channels``): the softmax over keys holds no
    parameters, so the count is the same."""

    def __init__(self, *args, **kwargs):
        super().__init__()


def _without_kernel(layer) -> None:
    attention = getattr(getattr(layer, "submodules", None), "self_attention", None)
    sub = getattr(attention, "submodules", None)
    if sub is not None and hasattr(sub, "linear_kv_down_proj"):  # MLA
        sub.core_attention = _CoreAttention


def deepspeed_parameters(files: dict[str, str], dp: int) -> int:
    """``ds_config.json`` parsed by DeepSpeed's own ``DeepSpeedConfig`` over ``dp`` data-parallel
    ranks (its batch arithmetic is DeepSpeed's check; it raises on a mismatch), and the parameters
    of the model transformers builds from the written ``config.json``."""
    import transformers
    from deepspeed.runtime import config as ds_config

    from dayzero.export.deepspeed import CONFIG_FILE, MODEL_FILE

    class _DataParallel:  # the process-group view DeepSpeed divides the batch by
        def get_data_parallel_world_size(self):
            return dp

    with mock.patch.object(ds_config.dist, "get_rank", lambda *a, **k: 0):  # asked only to pick the world size
        ds_config.DeepSpeedConfig(json.loads(files[CONFIG_FILE]), mpu=_DataParallel())
    cfg = transformers.AutoConfig.for_model(**json.loads(files[MODEL_FILE]))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    # the aux-loss-free routing bias is a buffer in transformers (DeepseekV3TopkRouter e_score_correction_bias)
    extra = sum(b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
    return sum(p.numel() for p in model.parameters()) + extra
