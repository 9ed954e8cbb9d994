"""Megatron-LM / Megatron-Core: the ``pretrain_gpt.py`` argument list of a plan, the same plan as
Megatron-Core's own config objects, and the reverse (an argument list -> ParallelConfig).

Flag names are Megatron-LM's (``megatron/training/arguments.py``): ZeRO-1 is
``--use-distributed-optimizer``; ZeRO-2/3 are Megatron FSDP (``--use-megatron-fsdp
--data-parallel-sharding-strategy optim_grads|optim_grads_params``); interleaving is
``--num-virtual-stages-per-pipeline-rank``; FP8 is ``--fp8-format hybrid``, NVFP4 ``--fp4-format
e2m1``. Gradients are reduced in FP32 unless a plan says otherwise (Megatron's default for BF16).
"""

from __future__ import annotations

import argparse
import functools
import shlex
from pathlib import Path

from dayzero.errors import ConfigError
from dayzero.export.common import Export, integer_setting, require_engine
from dayzero.export.quoting import argument_lines
from dayzero.planner.perf.comm import CommOptions, ep_overlapped, tp_overlapped
from dayzero.specs.grid import columns
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import ParallelConfig

ARGS_FILE = "megatron_args.txt"
# the architecture flags model_args writes: an importer reads the layout and leaves these to the model
MODEL_FLAGS = frozenset((
    "--num-layers", "--hidden-size", "--num-attention-heads", "--ffn-hidden-size", "--max-position-embeddings",
    "--vocab-size", "--position-embedding-type", "--normalization", "--kv-channels", "--group-query-attention",
    "--num-query-groups", "--multi-latent-attention", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim",
    "--v-head-dim", "--q-lora-rank", "--swiglu", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
    "--qk-layernorm", "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size", "--moe-token-dispatcher-type",
    "--moe-grouped-gemm", "--moe-shared-expert-intermediate-size", "--moe-router-score-function",
    "--moe-router-enable-expert-bias", "--moe-router-num-groups", "--moe-router-group-topk", "--moe-layer-freq",
    "--moe-flex-dispatcher-backend",
    "--mtp-num-layers", "--norm-epsilon", "--rotary-base", "--rotary-interleaved", "--rope-type",
    "--use-rope-scaling", "--rope-scaling-factor", "--rotary-scaling-factor", "--mscale", "--mscale-all-dim",
    "--add-qkv-bias", "--softmax-type", "--window-size", "--window-attn-skip-freq", "--moe-shared-expert-gate",
    "--moe-router-topk-scaling-factor", "--make-vocab-size-divisible-by", "--quick-geglu",
    "--glu-linear-offset", "--activation-func-clamp-value", "--moe-router-pre-softmax",
    "--overlap-moe-expert-parallel-comm"))  # from the layout (planner.perf.comm.ep_overlapped), as the planner does
SHARDING = {2: "optim_grads", 3: "optim_grads_params"}
QUICK_GELU_ALPHA = 1.702  # Megatron-Core activations.quick_gelu: x * sigmoid(1.702 x)


def dispatcher_config(p: ParallelConfig, vendor: str | None = None) -> dict:
    """The token dispatcher the planner priced for Megatron (:data:`dayzero.planner.engines.MEGATRON`):
    with experts across ranks the flex dispatcher on DeepEP, which sends a token once per rank and
    once per remote node (needs the deep_ep package, CUDA only: planner.engines.FEATURES); within one
    rank, or on a ``vendor`` without DeepEP, the plain all-to-all."""
    from dayzero.planner.engines import feature_runs_on

    if p.ep > 1 and feature_runs_on("deepep_dispatcher", vendor):
        return {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "deepep"}
    return {"moe_token_dispatcher_type": "alltoall"}


def dispatcher_args(p: ParallelConfig, vendor: str | None = None) -> list[str]:
    return [x for k, v in dispatcher_config(p, vendor).items() for x in (f"--{k.replace('_', '-')}", v)]


def vendor_notes(p: ParallelConfig, vendor: str | None) -> list[str]:
    """What a Megatron export for ``vendor``'s accelerators substitutes for the CUDA-only features
    the layout would otherwise get (planner.engines.FEATURES); Megatron FSDP is refused by
    :func:`refuse_vendor`."""
    from dayzero.planner.engines import feature_runs_on

    notes = []
    if p.ep > 1 and not feature_runs_on("deepep_dispatcher", vendor):
        notes.append(f"MoE dispatcher: --moe-token-dispatcher-type alltoall instead of the flex dispatcher on DeepEP "
                     f"(CUDA only; not on {vendor}): every routed copy is sent, priced as such by a plan for {vendor}")
    if p.sequence_parallel and p.tp > 1 and not feature_runs_on("tp_comm_overlap", vendor):
        notes.append(f"no --tp-comm-overlap (Transformer Engine userbuffers, CUDA only; not on {vendor}): the TP "
                     "collectives run exposed")
    return notes


def refuse_vendor(p: ParallelConfig, vendor: str | None, target: str = "--to megatron") -> None:
    """One ConfigError where the layout needs a CUDA-only feature with no substitute on ``vendor``."""
    from dayzero.planner.engines import feature_runs_on

    if p.zero >= 2 and not feature_runs_on("megatron_fsdp", vendor):
        raise ConfigError(target, None, f"ZeRO-{p.zero} is Megatron FSDP (--use-megatron-fsdp), which does not run "
                          f"on {vendor}; plan with --zero 0,1 (or --engine mindspeed on Ascend)")


def layout_args(p: ParallelConfig, fp8_param_gather: bool = False, optimizer_offload: bool = False,
                activation_offload_layers: int = 0, vendor: str | None = None) -> list[str]:
    """The flags that state the layout, batch and precision; ``fp8_param_gather``: FP8 parameter
    storage and all-gathers (MemoryOptions.fp8_params), Megatron's ``--fp8-param-gather``, written
    under an FP8 recipe only (the flag works with ``--fp8-format``); ``optimizer_offload``: the
    whole optimizer on the host (MemoryOptions.optimizer_offload), ``--optimizer-cpu-offload
    --optimizer-offload-fraction 1.0`` with the ``--use-precision-aware-optimizer`` it runs under
    (Megatron-Core docs/user-guide/features/optimizer_cpu_offload.md, HybridDeviceOptimizer);
    ``activation_offload_layers`` N: the saved activations of the first N layers on the host
    (MemoryOptions.activation_offload_layers), ``--cpu-offloading --cpu-offloading-num-layers N``
    (TransformerConfig cpu_offloading_activations defaults to True, cpu_offloading_weights to False:
    activations only)."""
    from dayzero.planner.engines import feature_runs_on

    # the memory switches the plan chose (ParallelConfig fields, planner.search.switches) or the export's flags
    fp8_param_gather = fp8_param_gather or p.fp8_param_gather
    optimizer_offload = optimizer_offload or p.optimizer_offload
    # the layout's own N (a searched plan's, ParallelConfig.activation_offload_layers), at least the export's flag
    activation_offload_layers = max(activation_offload_layers, p.activation_offload_layers)
    a = ["--tensor-model-parallel-size", p.tp, "--pipeline-model-parallel-size", p.pp,
         "--context-parallel-size", p.cp, "--expert-model-parallel-size", p.ep, "--expert-tensor-parallel-size", p.etp,
         "--micro-batch-size", p.mbs, "--global-batch-size", p.gbs, "--seq-length", p.seq, "--bf16"]
    if p.cp > 1 and p.cp_comm != "p2p":  # Ulysses all-to-all (Megatron-LM arguments.py --cp-comm-type; default p2p)
        a += ["--cp-comm-type", p.cp_comm]
    if p.vpp > 1:
        a += ["--num-virtual-stages-per-pipeline-rank", p.vpp]
    if p.sequence_parallel:
        a.append("--sequence-parallel")
        if tp_overlapped(columns(p), CommOptions())[()] > 0 and feature_runs_on("tp_comm_overlap", vendor):
            # the overlap the planner priced for this layout (planner.perf.comm.tp_overlapped: tp > 1 with
            # sequence parallelism, which Megatron-LM's arguments.py requires of --tp-comm-overlap)
            a.append("--tp-comm-overlap")
    if p.zero == 1:
        a.append("--use-distributed-optimizer")
    elif p.zero >= 2:
        a += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", SHARDING[p.zero],
              "--use-distributed-optimizer"]
    if p.recompute == "selective":
        a += ["--recompute-granularity", "selective"]
        if tuple(p.recompute_modules) not in ((), ("core_attn",)):
            a += ["--recompute-modules", *p.recompute_modules]
    elif p.recompute == "full" and p.recompute_layers is not None:
        # the first N layers of each model chunk (Megatron-LM transformer_block.py _checkpointed_forward,
        # recompute_method "block": each virtual chunk is its own TransformerBlock)
        a += ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers",
              p.recompute_layers]
    elif p.recompute == "full":
        a += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", 1]
    if p.precision == "fp8":
        a += ["--fp8-format", "hybrid"]
        if fp8_param_gather and p.zero >= 1:  # Megatron allows it only with a sharded optimizer / FSDP
            a.append("--fp8-param-gather")
    elif p.precision == "fp4":
        a += ["--fp4-format", "e2m1"]
    if optimizer_offload:
        a += ["--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.0", "--use-precision-aware-optimizer"]
    if activation_offload_layers:
        a += ["--cpu-offloading", "--cpu-offloading-num-layers", activation_offload_layers]
    return [str(x) for x in a]


def refuse_unexpressible(spec: ModelSpec) -> None:
    """One ConfigError naming the first layer kind ``pretrain_gpt.py``'s GPT model cannot build
    (never approximated as attention): a recurrent mixer (Gated-DeltaNet linear attention, Mamba-2),
    a layer without a token mixer or without a feed-forward block."""
    kinds = []
    for i, (mixer, ffn) in enumerate(zip(spec.layer_mixers, spec.layer_kinds)):
        if mixer != "attention":
            what = (f"{spec.recurrent.kind} recurrent mixer" if "recurrent" in mixer and spec.recurrent
                    else f"'{mixer}' token mixer")
            kinds.append(f"layer {i} has a {what}")
        elif ffn == "none":
            kinds.append(f"layer {i} has no feed-forward block")
    if kinds:
        raise ConfigError("--to megatron", None, f"{spec.name}: {kinds[0]} ({len(kinds)} such layer(s)); "
                          "Megatron-LM's pretrain_gpt.py builds attention + MLP/MoE layers only, and dayzero does "
                          "not export Megatron's hybrid or experimental linear-attention models; export it --to "
                          "slurm/kubernetes on dayzero's runtime instead")


def _number(x: float) -> str:
    """A float flag's value as Megatron's argparse reads it (``repr`` round-trips a float)."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def rope_args(spec: ModelSpec) -> tuple[list[str], list[str]]:
    """The rotary embedding: base (``--rotary-base``, an int in Megatron-LM's arguments.py) and the
    config's ``rope_scaling``. llama3 scaling is ``--use-rope-scaling --rope-scaling-factor F``,
    whose other numbers Megatron-Core fixes (rotary_pos_embedding.py ``_apply_scaling``: low 1,
    high 4, original 8192 positions); YaRN under MLA is ``--rope-type yarn`` with MLATransformerConfig's
    fields; MLA without scaling is ``--rope-type rope`` (MLATransformerConfig defaults to yarn)."""
    a: list = []
    missing: list[str] = []
    if spec.position != "rope":
        return a, missing
    if float(spec.rope_theta).is_integer():
        a += ["--rotary-base", int(spec.rope_theta)]
    else:
        missing.append(f"rope theta {spec.rope_theta} (Megatron's --rotary-base is an integer)")
    if spec.attention.rope_interleave and spec.attention.kind != "mla":  # MLA's rope interleaves as DeepSeek's
        a.append("--rotary-interleaved")  # (Megatron-Core rope_utils: multi_latent_attention rearranges x)
    scaling = spec.extra.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    mla = spec.attention.kind == "mla"
    if kind in (None, "default"):
        if mla:
            a += ["--rope-type", "rope"]
    elif kind == "llama3" and not mla:
        a += ["--use-rope-scaling", "--rope-scaling-factor", _number(scaling.get("factor", 8.0))]
        fixed = {"low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 8192}
        off = {k: scaling[k] for k, v in fixed.items() if k in scaling and float(scaling[k]) != v}
        if off:
            missing.append(f"llama3 rope scaling {off} (Megatron-Core fixes low_freq_factor 1, high_freq_factor 4, "
                           "original_max_position_embeddings 8192)")
    elif kind == "yarn" and mla:
        a += ["--rope-type", "yarn", "--rotary-scaling-factor", _number(scaling.get("factor", 1.0)),
              "--mscale", _number(scaling.get("mscale", 1.0)),
              "--mscale-all-dim", _number(scaling.get("mscale_all_dim", 0.0))]
        fixed = {"beta_fast": 32, "beta_slow": 1, "original_max_position_embeddings": 4096}
        off = {k: scaling[k] for k, v in fixed.items() if k in scaling and float(scaling[k]) != v}
        if off:
            missing.append(f"yarn rope scaling {off} (pretrain_gpt.py keeps MLATransformerConfig's beta_fast 32, "
                           "beta_slow 1, original_max_position_embeddings 4096)")
    else:
        missing.append(f"{kind} rope scaling {scaling} ({'MLA' if mla else 'GQA'} attention: pretrain_gpt.py has no "
                       "flags for it)")
    return [str(x) for x in a], missing


def window_args(spec: ModelSpec) -> list[str]:
    """Sliding-window attention: ``--window-size W-1,0`` (flash-attention's (left, right), the
    window of transformers' flash path: sliding_window - 1 keys back) and, where some layers attend
    fully, ``--window-attn-skip-freq`` as a per-layer list, 1 = windowed, 0 = full (Megatron-LM
    arguments.py)."""
    windows = spec.layer_windows or ((spec.attention.sliding_window,) * spec.layers)
    sizes = {w for w in windows if w}
    if not sizes:
        return []
    if len(sizes) > 1:
        raise ConfigError("--to megatron", None, f"{spec.name}: windows of {sorted(sizes)} tokens on different "
                          "layers; Megatron takes one --window-size")
    a = ["--window-size", f"{sizes.pop() - 1},0"]
    if not all(windows):
        a += ["--window-attn-skip-freq", "[" + ",".join("1" if w else "0" for w in windows) + "]"]
    return a


def _attention_args(att) -> list:
    """The flags of grouped-query and multi-latent attention."""
    a: list = []
    if att.kind == "gqa" and att.kv_heads != att.heads:
        a += ["--group-query-attention", "--num-query-groups", att.kv_heads]
    if att.kind == "mla":
        a += ["--multi-latent-attention", "--kv-lora-rank", att.kv_lora_rank, "--qk-head-dim", att.qk_nope_head_dim,
              "--qk-pos-emb-head-dim", att.qk_rope_head_dim, "--v-head-dim", att.v_head_dim]
        if att.q_lora_rank:
            a += ["--q-lora-rank", att.q_lora_rank]
    return a


def _mlp_args(mlp) -> tuple[list, list[str]]:
    """The gated MLP's activation flag, and what Megatron's flags cannot say about it."""
    a: list = []
    missing = []
    if mlp.gated and mlp.activation == "silu":
        a.append("--swiglu")
    elif mlp.gated and mlp.activation == "swiglu_clamped" and mlp.swiglu_alpha == QUICK_GELU_ALPHA:
        # gpt-oss: (up + 1) * gate * sigmoid(1.702 gate), both clamped at the limit; Megatron-LM's
        # quick GEGLU (x * sigmoid(1.702 x)) with --glu-linear-offset 1 and --activation-func-clamp-value
        a += ["--quick-geglu", "--glu-linear-offset", "1", "--activation-func-clamp-value",
              _number(mlp.swiglu_limit or 0.0)]
    elif mlp.gated:
        missing.append(f"gated MLP with {mlp.activation} (Megatron's gated MLP flags are --swiglu and --geglu-style "
                       "custom activations)")
    return a, missing


def _bias_args(spec: ModelSpec) -> list:
    """The bias flags; refused (ConfigError) where Megatron's all-or-none linear biases cannot state them.
    Megatron's biases: add_bias_linear for every linear (attention output, MLP, experts), add_qkv_bias
    for the QKV projection alone (TransformerConfig)."""
    att, mlp = spec.attention, spec.mlp
    a: list = []
    moe = spec.moe if spec.moe is not None and spec.is_moe else None
    biases = {"attention output": att.o_bias}
    if "dense" in spec.layer_kinds:
        biases["MLP"] = mlp.bias
    if moe:
        biases.update({"experts": moe.expert.bias, "router": moe.router_bias})
    linear_bias = set(biases.values())
    if len(linear_bias) > 1:
        raise ConfigError("--to megatron", None, f"{spec.name}: biases on some linear layers and not others "
                          f"({', '.join(f'{k} {v}' for k, v in biases.items())}); Megatron's --disable-bias-linear "
                          "sets them all")
    if True not in linear_bias:
        a.append("--disable-bias-linear")
    if att.qkv_bias and True not in linear_bias:
        a.append("--add-qkv-bias")
    elif not att.qkv_bias and True in linear_bias:
        raise ConfigError("--to megatron", None, f"{spec.name}: biases on the linear layers but not on QKV; "
                          "Megatron adds a QKV bias with every linear bias")
    return a


def _moe_args(spec: ModelSpec, p: ParallelConfig, vendor: str | None, ep_overlap_flag: str | None) -> tuple[list,
                                                                                                     list[str]]:
    """The mixture-of-experts flags (none for a dense model), and what they cannot say about its routing."""
    a: list = []
    missing = []
    if not (spec.moe is not None and spec.is_moe):
        return a, missing
    m = spec.moe
    a += ["--num-experts", m.experts, "--moe-router-topk", m.top_k, "--moe-ffn-hidden-size", m.expert.intermediate,
          *dispatcher_args(p, vendor), "--moe-grouped-gemm"]
    if m.shared_experts:
        a += ["--moe-shared-expert-intermediate-size", m.shared_intermediate]
    if m.shared_expert_gate:
        a.append("--moe-shared-expert-gate")
    if m.scoring == "sigmoid":
        a += ["--moe-router-score-function", "sigmoid"]
    # top-k weights: Megatron-Core's softmax after the top-k is the normalised top-k (norm_topk_prob);
    # the softmax over every expert before it is --moe-router-pre-softmax; sigmoid scores are always
    # normalised over the top-k (moe_utils.topk_softmax_with_capacity)
    if m.scoring == "softmax" and not m.norm_topk_prob:
        a.append("--moe-router-pre-softmax")
    elif m.scoring == "sigmoid" and not m.norm_topk_prob and m.top_k > 1:
        missing.append("sigmoid routing without normalised top-k weights (Megatron-Core normalises them)")
    if m.score_correction_bias:
        a.append("--moe-router-enable-expert-bias")
    if m.routed_scaling_factor != 1.0:
        a += ["--moe-router-topk-scaling-factor", _number(m.routed_scaling_factor)]
    if m.n_group > 1:
        a += ["--moe-router-num-groups", m.n_group, "--moe-router-group-topk", m.topk_group]
    if ep_overlap_flag and ep_overlapped(columns(p), CommOptions())[()] > 0:
        # the overlap the planner priced for this layout (planner.perf.comm.ep_overlapped: Megatron-Core's
        # conditions, ep > 1, no full recompute, a virtual pipeline when pp > 1)
        a.append(ep_overlap_flag)
    dense = [i for i, k in enumerate(spec.layer_kinds) if k != "moe"]
    if dense:
        pattern = "[" + ",".join("0" if k != "moe" else "1" for k in spec.layer_kinds) + "]"
        a += ["--moe-layer-freq", pattern]
    return a, missing


def model_args(spec: ModelSpec, parallel: ParallelConfig | None = None, vendor: str | None = None,
               ep_overlap_flag: str | None = "--overlap-moe-expert-parallel-comm") -> tuple[list[str], list[str]]:
    """The flags that state the architecture (and the token dispatcher ``parallel``'s EP needs on
    ``vendor``'s accelerators), and what the argument list cannot say about it. A layer kind the GPT
    model cannot build is refused (:func:`refuse_unexpressible`). ``ep_overlap_flag``: the flag of
    the engine's EP overlap, written where the planner priced it (None: the caller writes its own)."""
    refuse_unexpressible(spec)
    p = parallel or ParallelConfig()
    att, mlp = spec.attention, spec.mlp
    a: list = ["--num-layers", spec.layers, "--hidden-size", spec.hidden, "--num-attention-heads", att.heads,
               "--ffn-hidden-size", mlp.intermediate, "--max-position-embeddings", spec.max_positions,
               "--vocab-size", spec.vocab, "--position-embedding-type",
               "rope" if spec.position == "rope" else "learned_absolute",
               "--normalization", "RMSNorm" if spec.norm == "rmsnorm" else "LayerNorm",
               "--norm-epsilon", _number(spec.norm_eps), "--kv-channels", att.head_dim]
    missing = []
    rope, rope_missing = rope_args(spec)
    a += rope
    missing += rope_missing
    a += _attention_args(att)
    mlp_flags, mlp_missing = _mlp_args(mlp)
    a += mlp_flags
    missing += mlp_missing
    if not spec.tie_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    a += _bias_args(spec)
    if att.qk_norm or att.kind == "mla":  # under MLA the flag builds the RMSNorms of the q and kv latents
        a.append("--qk-layernorm")  # (Megatron-Core gpt_layer_specs: q/kv_layernorm of MLA only with it)
    if att.sinks:  # one learned logit per head: Megatron-LM's --softmax-type learnable
        a += ["--softmax-type", "learnable"]
    a += window_args(spec)
    moe_flags, moe_missing = _moe_args(spec, p, vendor, ep_overlap_flag)
    a += moe_flags
    missing += moe_missing
    if spec.mtp_layers:
        a += ["--mtp-num-layers", spec.mtp_layers]
    pad, padded = vocab_padding(spec.vocab, p.tp)
    a += ["--make-vocab-size-divisible-by", pad]
    if padded != spec.vocab:
        missing.append(f"vocab {spec.vocab} padded to {padded} (Megatron-LM pads it to a multiple of "
                       f"--make-vocab-size-divisible-by x tp = {pad} x {p.tp}: {(padded - spec.vocab) * spec.hidden} "
                       "more parameters per embedding)")
    return [str(x) for x in a], missing


def vocab_padding(vocab: int, tp: int) -> tuple[int, int]:
    """(``--make-vocab-size-divisible-by``, the vocabulary Megatron-LM builds): the largest power of
    two up to Megatron's default 128 whose multiple by tp divides the vocabulary, so no row is
    added; a vocabulary tp does not divide is padded (Megatron-LM ``_vocab_size_with_padding``:
    the next multiple of the flag x tp)."""
    for d in (128, 64, 32, 16, 8, 4, 2, 1):
        if vocab % (d * tp) == 0:
            return d, vocab
    return 128, -(-vocab // (128 * tp)) * 128 * tp


def export(spec: ModelSpec, parallel: ParallelConfig, nodes: int | None = None, devices_per_node: int = 8,
           fp8_param_gather: bool = False, optimizer_offload: bool = False,
           activation_offload_layers: int = 0, vendor: str | None = None) -> Export:
    """``vendor``: the accelerators' vendor (a plan file's cluster); on one without a CUDA-only
    feature the layout would get, the export substitutes it with a note or refuses
    (:func:`vendor_notes`, :func:`refuse_vendor`)."""
    activation_offload_layers = max(activation_offload_layers, parallel.activation_offload_layers)  # the plan's own
    require_engine("megatron", parallel, {"activation_offload_layers": activation_offload_layers})
    refuse_vendor(parallel, vendor)
    if activation_offload_layers:
        from dayzero.planner.predict import check_offload_layout

        check_offload_layout(spec, parallel, activation_offload_layers)
    margs, missing = model_args(spec, parallel, vendor)
    args = margs + layout_args(parallel, fp8_param_gather, optimizer_offload, activation_offload_layers, vendor)
    missing += vendor_notes(parallel, vendor)
    if (fp8_param_gather or parallel.fp8_param_gather) and (parallel.precision != "fp8" or parallel.zero < 1):
        missing.append(f"--fp8-param-gather under {parallel.precision}, ZeRO-{parallel.zero} (Megatron takes it "
                       "with --fp8-format and --use-distributed-optimizer or FSDP only)")
    nnodes = nodes or max(1, parallel.world // devices_per_node)
    per_node = parallel.world // nnodes
    command = ["torchrun", f"--nnodes={nnodes}", f"--nproc-per-node={per_node}", "--rdzv-backend=c10d",
               "--rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT", "pretrain_gpt.py", *args]
    text = argument_lines(args, "a Megatron argument")
    if parallel.layer_split:
        missing.append(f"layer split {parallel.layer_split} (Megatron splits evenly, with "
                       "--decoder-first/last-pipeline-num-layers for the ends)")
    return Export("megatron", {ARGS_FILE: text}, command, missing)


class _Parser(argparse.ArgumentParser):
    """Megatron's flags as its own parser reads them; a bad value is a ConfigError, never an exit."""

    def error(self, message: str):
        raise ConfigError("megatron arguments", None, f"{message}; fix the argument list") from None


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(add_help=False, allow_abbrev=False)
    for flag, default in (("--tensor-model-parallel-size", 1), ("--pipeline-model-parallel-size", 1),
                          ("--context-parallel-size", 1), ("--expert-model-parallel-size", 1),
                          ("--expert-tensor-parallel-size", None), ("--micro-batch-size", 1),
                          ("--global-batch-size", None), ("--seq-length", 4096),
                          ("--num-virtual-stages-per-pipeline-rank", None), ("--recompute-num-layers", None),
                          ("--cpu-offloading-num-layers", 0)):
        ap.add_argument(flag, type=functools.partial(integer_setting, "megatron arguments", flag), default=default)
    for flag in ("--sequence-parallel", "--use-distributed-optimizer", "--use-megatron-fsdp", "--bf16",
                 "--fp8-param-gather", "--optimizer-cpu-offload", "--use-precision-aware-optimizer",
                 "--cpu-offloading", "--tp-comm-overlap"):  # the last derived from the layout (tp_overlapped)
        ap.add_argument(flag, action="store_true")
    ap.add_argument("--data-parallel-sharding-strategy", default="no_shard")
    ap.add_argument("--recompute-granularity", default=None)
    ap.add_argument("--recompute-method", default=None)
    ap.add_argument("--recompute-modules", nargs="*", default=None)
    ap.add_argument("--optimizer-offload-fraction", default=None)
    ap.add_argument("--fp8-format", default=None)
    ap.add_argument("--fp4-format", default=None)
    ap.add_argument("--cp-comm-type", nargs="+", default=["p2p"])  # one type, or one per layer
    return ap


def parallel_from_args(argv: list[str], world: int | None = None) -> tuple[ParallelConfig, list[str]]:
    """A Megatron argument list -> (ParallelConfig on ``world`` ranks, the flags it did not read).
    The world size comes from the launcher, not the arguments, so it must be given."""
    ns, rest = _parser().parse_known_args(argv)
    tp, pp, cp = ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size, ns.context_parallel_size
    if world is None:
        raise ConfigError("megatron arguments", "world", "the data-parallel degree needs the world size; give "
                          "--devices N (the ranks the job runs on)")
    if world % (tp * pp * cp):
        raise ConfigError("megatron arguments", "world", f"{world} ranks are not divisible by tp*pp*cp = "
                                                         f"{tp * pp * cp}")
    zero = 0
    if ns.use_megatron_fsdp:
        zero = {v: k for k, v in SHARDING.items()}.get(ns.data_parallel_sharding_strategy, 1)
    elif ns.use_distributed_optimizer:
        zero = 1
    recompute = ns.recompute_granularity or "none"
    precision = "fp8" if ns.fp8_format else "fp4" if ns.fp4_format else "bf16"
    dp = world // (tp * pp * cp)
    vpp = ns.num_virtual_stages_per_pipeline_rank or 1
    comm = set(ns.cp_comm_type)
    if not comm <= {"p2p", "a2a"} or len(comm) > 1:
        raise ConfigError("megatron arguments", "--cp-comm-type", f"{' '.join(ns.cp_comm_type)}: dayzero models one "
                          "context-parallel exchange for every layer, p2p or a2a (not allgather, a2a+p2p or a mix); "
                          "give one of them")
    p = ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, cp_comm=comm.pop(), ep=ns.expert_model_parallel_size,
                       etp=ns.expert_tensor_parallel_size or 1,
                       vpp=vpp, mbs=ns.micro_batch_size, gbs=ns.global_batch_size or 0, seq=ns.seq_length, zero=zero,
                       recompute=recompute, recompute_modules=tuple(ns.recompute_modules or ()),
                       recompute_layers=(ns.recompute_num_layers
                                         if recompute == "full" and ns.recompute_method == "block" else None),
                       sequence_parallel=ns.sequence_parallel, precision=precision,
                       # the memory switches (planner.search.switches); a partial offload fraction is not the
                       # whole-optimizer offload the planner models, so it reads as off
                       fp8_param_gather=ns.fp8_param_gather and precision != "bf16",
                       optimizer_offload=ns.optimizer_cpu_offload and float(ns.optimizer_offload_fraction or 1) >= 1,
                       # activation offload of the first N layers of each chunk (planner.memory.activation_offload)
                       activation_offload_layers=ns.cpu_offloading_num_layers if ns.cpu_offloading else 0)
    return p, [w for w in rest if w.startswith("--") and w not in MODEL_FLAGS]


def import_file(path: str | Path, world: int | None = None) -> tuple[ParallelConfig, list[str]]:
    from dayzero.inputs import read_text

    argv = shlex.split(read_text(path, "a Megatron argument list (one or more flags per line)"), comments=True)
    if argv and argv[0] == "torchrun":  # a whole launch line: the arguments after the script
        script = next((i for i, w in enumerate(argv) if w.endswith(".py")), len(argv) - 1)
        argv = argv[script + 1:]
    parallel, unread = parallel_from_args(argv, world)
    return parallel, [f"{flag}: not a layout or architecture flag, not read" for flag in unread]


def core_configs(spec: ModelSpec, parallel: ParallelConfig) -> dict:
    """The plan as Megatron-Core's own config objects (needs ``megatron-core``): their
    ``__post_init__`` checks are Megatron's verdict on the layout."""
    import torch
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    p, att = parallel, spec.attention
    kw = dict(num_layers=spec.layers, hidden_size=spec.hidden, num_attention_heads=att.heads,
              ffn_hidden_size=spec.mlp.intermediate, kv_channels=att.head_dim,
              num_query_groups=att.kv_heads if att.kind == "gqa" else None,
              tensor_model_parallel_size=p.tp, pipeline_model_parallel_size=p.pp, context_parallel_size=p.cp,
              expert_model_parallel_size=p.ep, expert_tensor_parallel_size=p.etp,
              virtual_pipeline_model_parallel_size=p.vpp if p.vpp > 1 else None,
              sequence_parallel=p.sequence_parallel, bf16=True, params_dtype=torch.bfloat16,
              pipeline_dtype=torch.bfloat16 if p.pp > 1 else None,
              gated_linear_unit=spec.mlp.gated, normalization="RMSNorm" if spec.norm == "rmsnorm" else "LayerNorm")
    if p.cp > 1:  # TransformerConfig.cp_comm_type (one type for every layer)
        kw.update(cp_comm_type=p.cp_comm)
    if p.recompute == "selective":
        kw.update(recompute_granularity="selective")
    elif p.recompute == "full" and p.recompute_layers is not None:
        kw.update(recompute_granularity="full", recompute_method="block", recompute_num_layers=p.recompute_layers)
    elif p.recompute == "full":
        kw.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    notes = []
    if p.precision in ("fp8", "fp4"):
        import importlib.util

        if importlib.util.find_spec("transformer_engine") is None:  # Megatron's FP8/FP4 checks need TE
            notes.append(f"{p.precision} recipe not checked: Megatron-Core checks it only with Transformer Engine "
                         "installed")
        else:
            kw.update(fp8="hybrid") if p.precision == "fp8" else kw.update(fp4="e2m1")
    if spec.moe is not None and spec.is_moe:
        kw.update(num_moe_experts=spec.moe.experts, moe_router_topk=spec.moe.top_k,
                  moe_ffn_hidden_size=spec.moe.expert.intermediate, **dispatcher_config(p),
                  moe_shared_expert_intermediate_size=spec.moe.shared_intermediate or None)
    ddp = DistributedDataParallelConfig(use_distributed_optimizer=p.zero >= 1, grad_reduce_in_fp32=True,
                                        use_megatron_fsdp=p.zero >= 2,
                                        data_parallel_sharding_strategy=SHARDING.get(p.zero, "no_shard"))
    opt = OptimizerConfig(bf16=True, use_distributed_optimizer=p.zero >= 1)
    return {"transformer": TransformerConfig(**kw), "ddp": ddp, "optimizer": opt, "notes": notes}
