"""Build a ModelSpec from a Hugging Face ``config.json``.

One small parser per family; all fields keep their HF names. Every problem with the input raises
:class:`~dayzero.errors.ConfigError` naming the file, the field and what is expected.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

from dayzero.errors import ConfigError
from dayzero.inputs import load_json
from dayzero.specs.config_keys import unused_keys
from dayzero.specs.model import AttentionSpec, MLPSpec, ModelSpec, MoESpec, RecurrentSpec

# Bounds on config values, so an absurd field is one line instead of a hang, an overflow or a NaN:
# every integer field <= MAX_INT_FIELD (2^24: vocabularies reach 256K, widths 32K), a table size
# (a key naming a vocab) <= MAX_VOCAB_FIELD (2^28: n-gram embedding tables reach 20M rows,
# transformers' qwen4_exp_text ngram_vocab_size_base 20,000,000; times a 32K width stays far inside
# int64); layer counts <= MAX_LAYERS (the deepest published LLMs have ~200 layers). Float fields by name: RoPE bases and
# scaling factors are positive, norm epsilons in (0, 1), loss coefficients non-negative.
MAX_INT_FIELD = 2**24
MAX_VOCAB_FIELD = 2**28
MAX_LAYERS = 10_000
INT_LIMITS = {"num_hidden_layers": MAX_LAYERS, "n_layer": MAX_LAYERS, "num_nextn_predict_layers": MAX_LAYERS,
              "first_k_dense_replace": MAX_LAYERS}
_EPS = (0.0, 1.0, True)
FLOAT_RANGES = {
    "rope_theta": (0.0, math.inf, True), "rms_norm_eps": _EPS, "norm_eps": _EPS, "layer_norm_epsilon": _EPS,
    "routed_scaling_factor": (0.0, 1e6, True), "router_aux_loss_coef": (0.0, 1e3, False),
    "aux_loss_alpha": (0.0, 1e3, False), "swiglu_alpha": (0.0, 1e3, True), "swiglu_limit": (0.0, 1e6, True),
}


def int_limit(key: str) -> int:
    """The largest value dayzero reads for integer field ``key`` (the bounds above)."""
    if key in INT_LIMITS:
        return INT_LIMITS[key]
    return MAX_VOCAB_FIELD if "vocab" in key else MAX_INT_FIELD


class _Reads(dict):
    """A config dict that records every key looked up (``read``), present or not."""

    def __init__(self, cfg: dict):
        super().__init__(cfg)
        self.read: set[str] = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)


class _Fields:
    """Typed, validated access to a config dict, with errors that name the field; records the keys read."""

    def __init__(self, cfg: dict, source: str):
        self.cfg, self.source = _Reads(cfg), source
        self.notes: list[str] = []  # what was assumed where the config leaves it to the modeling code

    def _fail(self, key: str, problem: str):
        raise ConfigError(self.source, key, problem)

    def int(self, key: str, default: Any = ..., minimum: int = 1, alt: tuple[str, ...] = (),
            maximum: int | None = None) -> int | None:
        for k in (key, *alt):
            if k in self.cfg and self.cfg[k] is not None:
                key = k
                break
        else:
            if default is ...:
                self._fail(key, "is missing; expected a positive integer")
            return default
        v = self.cfg[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
            self._fail(key, f"expected an integer, got {v!r}")
        if not math.isfinite(v):
            self._fail(key, f"expected an integer, got {v!r}")
        v = int(v)
        if v < minimum:
            self._fail(key, f"expected an integer >= {minimum}, got {v}")
        top = maximum if maximum is not None else int_limit(key)
        if v > top:
            self._fail(key, f"{v:,} exceeds {top:,}, the largest dayzero plans for (a typo?)")
        return v

    def opt_int(self, key: str, minimum: int = 1, alt: tuple[str, ...] = ()) -> int | None:
        return self.int(key, default=None, minimum=minimum, alt=alt)

    def float(self, key: str, default: float) -> float:
        v = self.cfg.get(key, default)
        if v is None:
            v = default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            self._fail(key, f"expected a number, got {v!r}")
        lo, hi, lo_open = FLOAT_RANGES.get(key, (-math.inf, math.inf, False))
        if not ((v > lo if lo_open else v >= lo) and v <= hi):
            self._fail(key, f"expected a number in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {v!r}")
        return float(v)

    def bool(self, key: str, default: bool) -> bool:
        v = self.cfg.get(key, default)
        if v is None:
            return default
        if not isinstance(v, bool):
            self._fail(key, f"expected true or false, got {v!r}")
        return v

    def str(self, key: str, default: str) -> str:
        v = self.cfg.get(key, default)
        if v is None:
            return default
        if not isinstance(v, str):
            self._fail(key, f"expected a string, got {v!r}")
        return v

    def int_list(self, key: str) -> list[int]:
        v = self.cfg.get(key) or []
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            self._fail(key, f"expected a list of integers, got {v!r}")
        return v

    def str_list(self, key: str) -> list[str] | None:
        v = self.cfg.get(key)
        if v is None:
            return None
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            self._fail(key, f"expected a list of strings, got {v!r}")
        return v


# -- entry points ------------------------------------------------------------------------------

def load_config_file(path: str | Path) -> tuple[dict, str]:
    """Read a config.json (or a directory holding one); returns (dict, source name)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    source = str(p)
    cfg = load_json(p, "pass a preset name (see 'dayzero models'), a config.json or a directory holding one")
    if not isinstance(cfg, dict):
        raise ConfigError(source, None, f"expected a JSON object, got {type(cfg).__name__}")
    return cfg, source


def spec_from_hf_config(cfg: dict, name: str = "model", source: str | None = None) -> ModelSpec:
    """Parse an HF config dict into a ModelSpec (see SUPPORTED_MODEL_TYPES)."""
    source = source or name
    if not isinstance(cfg, dict):
        raise ConfigError(source, None, f"expected a JSON object, got {type(cfg).__name__}")
    mt = cfg.get("model_type")
    hybrid = isinstance(mt, str) and mt not in _PARSERS and is_hybrid_config(cfg)
    if not isinstance(mt, str) or (mt not in _PARSERS and not hybrid):
        got = "missing" if mt is None else repr(mt)
        raise ConfigError(source, "model_type", f"{got} is not supported; supported: "
                                                f"{', '.join(SUPPORTED_MODEL_TYPES)}, or any config with a hybrid "
                                                "layer pattern (hybrid_override_pattern, layers_block_type, or "
                                                "layer_types naming mamba / linear_attention layers)")
    f = _Fields(cfg, source)
    try:
        spec = _hybrid(f, name, mt) if hybrid else _PARSERS[mt](f, name, mt)
        check_size(spec, source)
        spec.extra["unused_config_keys"] = unused_keys(cfg, f.cfg.read | {"model_type"})
        if f.notes:
            spec.extra["notes"] = [*spec.extra.get("notes", []), *f.notes]
        if isinstance(cfg.get("rope_scaling"), dict):  # not modelled (no cost), but an export writes it
            spec.extra["rope_scaling"] = dict(cfg["rope_scaling"])
        return spec
    except ConfigError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as e:  # defensive: never a traceback
        raise ConfigError(source, None, f"inconsistent config ({type(e).__name__}: {e})") from None


def check_bounds(cfg: dict, source: str, experts_are_modules=None) -> None:
    """Every top-level number of ``cfg`` within the bounds the parsers enforce (integers <= their
    limit, floats finite), before a config without a parser is built by its own modeling code.
    ``experts_are_modules(key)``: whether the code builds one module per expert counted by ``key``
    (the expert-module bound applies only then: experts kept as rows of a table, as PEER's million
    experts, He 2024, arXiv:2407.04202, build in seconds at any count)."""
    f = _Fields(cfg, source)
    for key, v in cfg.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            f._fail(key, f"expected a finite number, got {v!r}")
        if isinstance(v, int) and v > int_limit(key):
            top = int_limit(key)
            f._fail(key, f"{v:,} exceeds {top:,}, the largest dayzero plans for (a typo?)")
    layers = f.int("num_hidden_layers", default=None, minimum=1, alt=("n_layer", "num_layers"))
    _check_derived_shapes(f, cfg, layers, experts_are_modules)


# A model's code builds one module per expert per MoE layer; Kimi K2 (moonshotai/Kimi-K2-Instruct
# config.json: n_routed_experts 384, num_hidden_layers 61) builds 23,424, the most of any released
# model. 2^17 (5x that) builds on the meta device in seconds; 2^24 experts would take hours.
MAX_EXPERT_MODULES = 2**17
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
TOP_K_KEYS = ("num_experts_per_tok", "moe_top_k", "moe_k")


def _count(cfg: dict, keys: tuple[str, ...]) -> tuple[str, int] | None:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return k, v
    return None


def _check_derived_shapes(f: "_Fields", cfg: dict, layers: int | None, experts_are_modules=None) -> None:
    """The shape rules dayzero's own parsers apply, checked on a config before its modeling code
    builds it: the expert module count bounded, top-k within the experts. Head widths are the modeling
    code's to compute (a head-size key, or hidden_size // heads) and are read from the built modules."""
    experts, top_k = _count(cfg, EXPERT_KEYS), _count(cfg, TOP_K_KEYS)
    if experts and top_k and top_k[1] > experts[1]:
        f._fail(top_k[0], f"top-k ({top_k[1]}) exceeds the number of experts ({experts[1]})")
    if (experts and layers and experts[1] * layers > MAX_EXPERT_MODULES
            and (experts_are_modules is None or experts_are_modules(experts[0]))):
        f._fail(experts[0], f"{experts[1]:,} experts x {layers:,} layers = {experts[1] * layers:,} expert modules to "
                f"build; dayzero builds at most {MAX_EXPERT_MODULES:,} (5x the largest released model)")


MAX_PARAMS = 10**15  # 1,000 T parameters: 300x the largest model planned today; beyond it int64 FLOP counts overflow


def check_size(spec: ModelSpec, source: str) -> None:
    """Refuse a model beyond ``MAX_PARAMS`` (every product the planner forms then stays in int64)."""
    from dayzero.specs.counting import params_total

    n = params_total(spec, with_mtp=True)
    if n > MAX_PARAMS:
        size = f"{n:.3g}" if n < 10**300 else f"a {len(str(int(n)))}-digit number of"
        raise ConfigError(source, None, f"{size} parameters exceeds {MAX_PARAMS:.0e}, the largest model dayzero "
                          "plans for; check hidden_size, num_hidden_layers and the expert counts")


# -- families ----------------------------------------------------------------------------------

def _gqa_attention(f: _Fields, hidden: int, *, qkv_bias: bool, o_bias: bool, qk_norm: bool = False,
                   sinks: bool = False, sliding_window: int | None = None) -> AttentionSpec:
    heads = f.int("num_attention_heads")
    kv_heads = f.int("num_key_value_heads", default=heads)
    if heads % kv_heads:
        f._fail("num_key_value_heads", f"num_attention_heads ({heads}) must be divisible by num_key_value_heads "
                                       f"({kv_heads})")
    head_dim = f.opt_int("head_dim")
    if head_dim is None:
        head_dim = hidden // heads
        if hidden % heads:  # transformers' attention: getattr(config, "head_dim", hidden_size // num_heads)
            f.notes.append(f"hidden_size ({hidden}) is not divisible by num_attention_heads ({heads}) and no "
                           f"head_dim is set: head_dim {head_dim} (hidden_size // heads, as the modeling code "
                           f"computes it), attention {heads * head_dim} wide; set head_dim if you meant another")
        if head_dim < 1:
            f._fail("num_attention_heads", f"{heads} heads leave less than one dimension each of hidden_size "
                                           f"({hidden}); set head_dim")
    return AttentionSpec(kind="gqa", heads=heads, kv_heads=kv_heads, head_dim=head_dim, v_head_dim=head_dim,
                         qkv_bias=qkv_bias, o_bias=o_bias, qk_norm=qk_norm, sinks=sinks,
                         sliding_window=sliding_window)


def _windows(f: _Fields, layers: int, window: int | None) -> tuple[int | None, ...]:
    """Per-layer sliding windows from ``layer_types`` (HF >= 4.5x) or a global window."""
    types = f.str_list("layer_types")
    if types is not None:
        if len(types) != layers:
            f._fail("layer_types", f"has {len(types)} entries, expected num_hidden_layers = {layers}")
        return tuple(window if t == "sliding_attention" and window else None for t in types)
    return (window,) * layers


def _common(f: _Fields, name: str, mt: str, **kw) -> dict:
    hidden = f.int("hidden_size")
    layers = f.int("num_hidden_layers")
    vocab = f.int("vocab_size")
    return dict(name=name, model_type=mt, hidden=hidden, layers=layers, vocab=vocab,
                tie_embeddings=f.bool("tie_word_embeddings", kw.pop("tie_default", False)),
                max_positions=f.int("max_position_embeddings", default=4096),
                rope_theta=f.float("rope_theta", _rope_parameters_theta(f)),
                norm_eps=f.float("rms_norm_eps", 1e-6), **kw)


def _rope_parameters_theta(f: _Fields) -> float:
    """transformers >= 5 writes ``rope_parameters: {"rope_theta": ...}`` instead of ``rope_theta``."""
    rp = f.cfg.get("rope_parameters")
    v = rp.get("rope_theta") if isinstance(rp, dict) else None
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0:
        return float(v)
    return 10000.0


def _dense(f: _Fields, name: str, mt: str) -> ModelSpec:
    hidden, layers = f.int("hidden_size"), f.int("num_hidden_layers")
    bias = f.bool("attention_bias", False)
    window = f.opt_int("sliding_window")
    if mt == "qwen2":
        window = window if f.bool("use_sliding_window", False) else None
        if window and f.str_list("layer_types") is None:
            start = f.int("max_window_layers", default=layers, minimum=0)
            windows = tuple(window if i >= start else None for i in range(layers))
        else:
            windows = _windows(f, layers, window)
        att = _gqa_attention(f, hidden, qkv_bias=True, o_bias=False, sliding_window=window)
    else:
        windows = _windows(f, layers, window)
        att = _gqa_attention(f, hidden, qkv_bias=bias, o_bias=bias, qk_norm=(mt == "qwen3"),
                             sliding_window=window)
    if mt == "nemotron":
        mlp = MLPSpec(f.int("intermediate_size"), gated=False, bias=f.bool("mlp_bias", False), activation="relu2")
        return ModelSpec(attention=att, mlp=mlp, layer_windows=windows, norm="layernorm", norm_bias=True,
                         **{**_common(f, name, mt), "norm_eps": f.float("norm_eps", 1e-5)})
    mlp = MLPSpec(f.int("intermediate_size"), gated=True, bias=f.bool("mlp_bias", False))
    return ModelSpec(attention=att, mlp=mlp, layer_windows=windows, **_common(f, name, mt))


def _mixtral(f: _Fields, name: str, mt: str) -> ModelSpec:
    hidden, layers = f.int("hidden_size"), f.int("num_hidden_layers")
    att = _gqa_attention(f, hidden, qkv_bias=False, o_bias=False, sliding_window=f.opt_int("sliding_window"))
    experts = f.int("num_local_experts")
    moe = MoESpec(experts=experts, top_k=_top_k(f, experts), expert=MLPSpec(f.int("intermediate_size")),
                  aux_loss_coef=f.float("router_aux_loss_coef", 0.0))
    return ModelSpec(attention=att, mlp=MLPSpec(f.int("intermediate_size")), moe=moe,
                     layer_kinds=("moe",) * layers, layer_windows=_windows(f, layers, att.sliding_window),
                     **_common(f, name, mt))


def _qwen3_moe(f: _Fields, name: str, mt: str) -> ModelSpec:
    hidden, layers = f.int("hidden_size"), f.int("num_hidden_layers")
    bias = f.bool("attention_bias", False)
    att = _gqa_attention(f, hidden, qkv_bias=bias, o_bias=bias, qk_norm=True)
    experts = f.int("num_experts", minimum=0, alt=("num_local_experts",))  # transformers 5 writes the latter
    step = f.int("decoder_sparse_step", default=1)
    only_dense = set(f.int_list("mlp_only_layers"))
    kinds = tuple("moe" if i not in only_dense and experts > 0 and (i + 1) % step == 0 else "dense"
                  for i in range(layers))
    moe = None
    if experts > 0:
        moe = MoESpec(experts=experts, top_k=_top_k(f, experts),
                      expert=MLPSpec(f.int("moe_intermediate_size")),
                      aux_loss_coef=f.float("router_aux_loss_coef", 0.0),
                      norm_topk_prob=f.bool("norm_topk_prob", False))
    return ModelSpec(attention=att, mlp=MLPSpec(f.int("intermediate_size")), moe=moe, layer_kinds=kinds,
                     **_common(f, name, mt))


def _deepseek(f: _Fields, name: str, mt: str) -> ModelSpec:
    layers = f.int("num_hidden_layers")
    heads = f.int("num_attention_heads")
    nope, rope = f.int("qk_nope_head_dim"), f.int("qk_rope_head_dim")
    bias = f.bool("attention_bias", False)
    att = AttentionSpec(kind="mla", heads=heads, kv_heads=heads, head_dim=nope + rope,
                        v_head_dim=f.int("v_head_dim"), qkv_bias=bias, o_bias=bias,
                        q_lora_rank=f.opt_int("q_lora_rank"), kv_lora_rank=f.int("kv_lora_rank"),
                        qk_rope_head_dim=rope, qk_nope_head_dim=nope,
                        rope_interleave=f.bool("rope_interleave", True))
    experts = f.int("n_routed_experts", default=0, minimum=0)
    first_dense = f.int("first_k_dense_replace", default=0, minimum=0)
    freq = f.int("moe_layer_freq", default=1)
    kinds = tuple("moe" if experts and i >= first_dense and i % freq == 0 else "dense" for i in range(layers))
    moe = None
    if experts:
        moe_inter = f.int("moe_intermediate_size")
        shared = f.int("n_shared_experts", default=0, minimum=0)
        topk_method = f.str("topk_method", "noaux_tc" if mt != "deepseek_v2" else "greedy")
        moe = MoESpec(experts=experts, top_k=_top_k(f, experts), expert=MLPSpec(moe_inter),
                      shared_experts=shared, shared_intermediate=shared * moe_inter,
                      score_correction_bias=(topk_method == "noaux_tc"),
                      scoring="softmax" if f.str("scoring_func", "softmax" if mt == "deepseek_v2" else "sigmoid")
                      == "softmax" else "sigmoid",
                      aux_loss_coef=f.float("aux_loss_alpha", 0.0),
                      # defaults are transformers' config-class defaults for each family
                      norm_topk_prob=f.bool("norm_topk_prob", mt != "deepseek_v2"),
                      routed_scaling_factor=f.float("routed_scaling_factor", 1.0 if mt == "deepseek_v2" else 2.5),
                      **_groups(f, experts, *((1, 1) if mt == "deepseek_v2" else (8, 4))))
    fp8 = _fp8_block(f)
    return ModelSpec(attention=att, mlp=MLPSpec(f.int("intermediate_size")), moe=moe, layer_kinds=kinds,
                     mtp_layers=f.int("num_nextn_predict_layers", default=0, minimum=0), fp8_block=fp8,
                     **_common(f, name, mt))


def _glm4_moe(f: _Fields, name: str, mt: str) -> ModelSpec:
    hidden, layers = f.int("hidden_size"), f.int("num_hidden_layers")
    att = _gqa_attention(f, hidden, qkv_bias=f.bool("attention_bias", False), o_bias=False,
                         qk_norm=f.bool("use_qk_norm", False))
    experts = f.int("n_routed_experts")
    first_dense = f.int("first_k_dense_replace", default=0, minimum=0)
    kinds = tuple("moe" if i >= first_dense else "dense" for i in range(layers))
    moe_inter = f.int("moe_intermediate_size")
    shared = f.int("n_shared_experts", default=0, minimum=0)
    moe = MoESpec(experts=experts, top_k=_top_k(f, experts), expert=MLPSpec(moe_inter),
                  shared_experts=shared, shared_intermediate=shared * moe_inter,
                  score_correction_bias=True, scoring="sigmoid",
                  norm_topk_prob=f.bool("norm_topk_prob", True),
                  routed_scaling_factor=f.float("routed_scaling_factor", 1.0),
                  **_groups(f, experts, 1, 1))
    return ModelSpec(attention=att, mlp=MLPSpec(f.int("intermediate_size")), moe=moe, layer_kinds=kinds,
                     mtp_layers=f.int("num_nextn_predict_layers", default=0, minimum=0),
                     **_common(f, name, mt))


def _gpt_oss(f: _Fields, name: str, mt: str) -> ModelSpec:
    hidden, layers = f.int("hidden_size"), f.int("num_hidden_layers")
    window = f.opt_int("sliding_window")
    att = _gqa_attention(f, hidden, qkv_bias=f.bool("attention_bias", True), o_bias=f.bool("attention_bias", True),
                         sinks=True, sliding_window=window)
    windows = _windows(f, layers, window)
    if f.str_list("layer_types") is None and window:  # gpt-oss alternates sliding / full, sliding first
        windows = tuple(window if i % 2 == 0 else None for i in range(layers))
    experts = f.int("num_local_experts")
    # transformers GptOssConfig defaults: swiglu_alpha 1.702, swiglu_limit 7.0 (as in openai/gpt-oss
    # gpt_oss/torch/model.py swiglu(alpha=1.702, limit=7.0))
    expert = MLPSpec(f.int("intermediate_size"), gated=True, bias=True, activation="swiglu_clamped",
                     swiglu_alpha=f.float("swiglu_alpha", 1.702), swiglu_limit=f.float("swiglu_limit", 7.0))
    moe = MoESpec(experts=experts, top_k=_top_k(f, experts, alt=("experts_per_token",)), expert=expert,
                  router_bias=True, aux_loss_coef=f.float("router_aux_loss_coef", 0.0))
    return ModelSpec(attention=att, mlp=expert, moe=moe, layer_kinds=("moe",) * layers, layer_windows=windows,
                     **_common(f, name, mt))


def _gpt2(f: _Fields, name: str, mt: str) -> ModelSpec:
    hidden = f.int("n_embd", alt=("hidden_size",))
    layers = f.int("n_layer", alt=("num_hidden_layers",))
    heads = f.int("n_head", alt=("num_attention_heads",))
    if hidden % heads:
        f._fail("n_head", f"n_embd ({hidden}) must be divisible by n_head ({heads})")
    inner = f.opt_int("n_inner") or 4 * hidden
    att = AttentionSpec(kind="gqa", heads=heads, kv_heads=heads, head_dim=hidden // heads,
                        v_head_dim=hidden // heads, qkv_bias=True, o_bias=True)
    return ModelSpec(name=name, model_type=mt, hidden=hidden, layers=layers, vocab=f.int("vocab_size"),
                     attention=att, mlp=MLPSpec(inner, gated=False, bias=True, activation="gelu"),
                     norm="layernorm", norm_bias=True, position="learned",
                     tie_embeddings=f.bool("tie_word_embeddings", True),
                     max_positions=f.int("n_positions", alt=("max_position_embeddings",), default=1024),
                     norm_eps=f.float("layer_norm_epsilon", 1e-5))


# -- hybrid layer patterns, read by their keys (not by family) ----------------------------------

# Nemotron-H's hybrid_override_pattern characters and layers_block_type / layer_types names ->
# (token mixer, feed-forward block); Megatron-Core's hybrid_layer_allocation uses the same symbols
PATTERN_CHARS = {"M": ("recurrent", "none"), "*": ("attention", "none"), "-": ("none", "dense"),
                 "E": ("none", "moe")}
BLOCK_TYPES = {"mamba": ("recurrent", "none"), "attention": ("attention", "none"), "mlp": ("none", "dense"),
               "moe": ("none", "moe")}
RECURRENT_LAYER_TYPES = ("mamba", "linear_attention")


def is_hybrid_config(cfg: dict) -> bool:
    """A config whose layers are given by a hybrid pattern: ``hybrid_override_pattern``,
    ``layers_block_type``, or ``layer_types`` naming recurrent layers."""
    types = cfg.get("layer_types")
    return (isinstance(cfg.get("hybrid_override_pattern"), str) or isinstance(cfg.get("layers_block_type"), list)
            or (isinstance(types, list) and any(t in RECURRENT_LAYER_TYPES for t in types)))


def _layer_pattern(f: _Fields) -> tuple[list[tuple[str, str]], str]:
    """Per layer (mixer, ffn), from whichever pattern key the config has; and the key's name."""
    pattern = f.cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str):
        bad = sorted(set(pattern) - set(PATTERN_CHARS))
        if bad or not pattern:
            f._fail("hybrid_override_pattern", f"expected a string of {', '.join(PATTERN_CHARS)} (mamba, attention, "
                                               f"MLP, MoE), got {pattern!r}")
        return [PATTERN_CHARS[c] for c in pattern], "hybrid_override_pattern"
    blocks = f.str_list("layers_block_type")
    if blocks is not None:
        bad = sorted(set(blocks) - set(BLOCK_TYPES))
        if bad:
            f._fail("layers_block_type", f"unknown block types {bad}; expected {', '.join(BLOCK_TYPES)}")
        return [BLOCK_TYPES[b] for b in blocks], "layers_block_type"
    types = f.str_list("layer_types") or []
    experts = f.int("n_routed_experts", default=0, minimum=0, alt=("num_experts", "num_local_experts"))
    step = f.int("decoder_sparse_step", default=1)
    only_dense = set(f.int_list("mlp_only_layers"))
    out = []
    for i, t in enumerate(types):  # every layer a mixer plus an FFN, as in a transformer
        mixer = "recurrent" if t in RECURRENT_LAYER_TYPES else "attention"
        moe = experts > 0 and i not in only_dense and (i + 1) % step == 0
        out.append((mixer, "moe" if moe else "dense"))
    return out, "layer_types"


def _recurrent(f: _Fields, hidden: int, kinds: set[str]) -> RecurrentSpec:
    """The recurrent mixer from ``mamba_*`` / ``ssm_*`` keys (Mamba-2) or ``linear_*`` keys (Gated
    DeltaNet), with the defaults of transformers' NemotronHConfig / Qwen3NextConfig where a key is absent."""
    if "linear_attention" in kinds or "linear_num_value_heads" in f.cfg:
        return RecurrentSpec(kind="gated_deltanet", heads=f.int("linear_num_value_heads"),
                             head_dim=f.int("linear_value_head_dim"), key_heads=f.int("linear_num_key_heads"),
                             key_head_dim=f.int("linear_key_head_dim"),
                             conv_kernel=f.int("linear_conv_kernel_dim", default=4), chunk_size=64, conv_bias=False)
    head_dim = f.int("mamba_head_dim", default=64)
    heads = f.opt_int("mamba_num_heads")
    if heads is None:  # Mamba-2's expand x hidden inner width
        heads = f.int("expand", default=2) * hidden // head_dim
    groups = f.int("n_groups", default=8, alt=("mamba_n_groups",))
    if heads % groups:
        f._fail("n_groups", f"mamba heads ({heads}) must be divisible by n_groups ({groups})")
    bias = f.bool("use_bias", False) or f.bool("mamba_proj_bias", False)
    return RecurrentSpec(kind="mamba2", heads=heads, head_dim=head_dim,
                         d_state=f.int("ssm_state_size", default=128, alt=("mamba_d_state", "state_size")),
                         n_groups=groups, conv_kernel=f.int("conv_kernel", default=4, alt=("mamba_d_conv",)),
                         chunk_size=f.int("chunk_size", default=128, alt=("mamba_chunk_size",)),
                         conv_bias=f.bool("use_conv_bias", True), proj_bias=bias)


def _hybrid(f: _Fields, name: str, mt: str) -> ModelSpec:
    """A hybrid model (recurrent / attention / MLP / MoE layers) from its layer-pattern keys.

    Each layer is a mixer (Mamba-2 or Gated DeltaNet, attention) and/or a feed-forward block (dense
    or MoE), one RMSNorm per block, as transformers' NemotronHBlock (one block per layer) and
    Qwen3-Next's decoder layer (mixer + MoE) hold them. Experts are gated SwiGLU unless the MLP
    activation is squared ReLU (Nemotron-H: up and down only). LatentMoE (``moe_latent_size``,
    Nemotron 3 Super; NVIDIA, Nemotron 3 white paper, arXiv 2512.20848) runs the routed experts in
    a latent width ``d`` between a down-projection H -> d and an up-projection d -> H: modelled
    as experts of width ``moe_intermediate_size x d / H`` in H (the same parameters and FLOPs per
    routed token) and the two projections as part of the shared expert (dense, every token; the
    same parameters and FLOPs); the dispatcher moves d-wide tokens (MoESpec.latent_size). Stated in
    ``spec.extra['approximations']``."""
    hidden = f.int("hidden_size")
    pairs, key = _layer_pattern(f)
    layers = f.int("num_hidden_layers", default=len(pairs))
    if len(pairs) != layers:
        f._fail(key, f"describes {len(pairs)} layers, expected num_hidden_layers = {layers}")
    mixers = tuple(m for m, _ in pairs)
    kinds = tuple(k for _, k in pairs)
    types = set(f.str_list("layer_types") or [])
    act = f.str("mlp_hidden_act", f.str("hidden_act", "silu"))
    gated = act != "relu2"
    mlp_bias = f.bool("mlp_bias", False)
    approx: list[str] = []
    mlp = MLPSpec(f.int("intermediate_size", default=hidden * 4) if "dense" in kinds else
                  f.int("intermediate_size", default=1), gated=gated, bias=mlp_bias,
                  activation="relu2" if not gated else "silu")
    moe = None
    if "moe" in kinds:
        experts = f.int("n_routed_experts", alt=("num_experts", "num_local_experts"))
        inter = f.int("moe_intermediate_size")
        shared = f.int("moe_shared_expert_intermediate_size", default=0, minimum=0,
                       alt=("shared_expert_intermediate_size",))
        if not f.int("n_shared_experts", default=1 if shared else 0, minimum=0):
            shared = 0
        latent = f.opt_int("moe_latent_size")
        if latent is not None:
            if (inter * latent) % hidden:
                f._fail("moe_latent_size", f"moe_intermediate_size x moe_latent_size ({inter} x {latent}) is not a "
                                           f"multiple of hidden_size ({hidden}); dayzero's LatentMoE equivalence "
                                           "needs it")
            approx.append(f"LatentMoE (moe_latent_size {latent}): routed experts of width {inter} in the latent "
                          f"{latent} modelled as width {inter * latent // hidden} in {hidden} (same parameters and "
                          f"FLOPs); the latent projections {hidden} -> {latent} -> {hidden} counted with the shared "
                          f"expert (dense); tokens dispatched {latent} wide")
            inter, shared = inter * latent // hidden, shared + latent
        scoring = f.str("scoring_func", "sigmoid" if "n_group" in f.cfg else "softmax")
        moe = MoESpec(experts=experts, top_k=_top_k(f, experts),
                      expert=MLPSpec(inter, gated=gated, bias=mlp_bias, activation=mlp.activation),
                      shared_experts=1 if shared else 0, shared_intermediate=shared,
                      score_correction_bias=scoring == "sigmoid",
                      scoring="sigmoid" if scoring == "sigmoid" else "softmax",
                      norm_topk_prob=f.bool("norm_topk_prob", True),
                      routed_scaling_factor=f.float("routed_scaling_factor", 1.0),
                      **_groups(f, experts, 1, 1), latent_size=latent or 0)
    rec = _recurrent(f, hidden, types) if "recurrent" in mixers else None
    att = _gqa_attention(f, hidden, qkv_bias=f.bool("attention_bias", False), o_bias=f.bool("attention_bias", False))
    common = _common(f, name, mt)
    common["norm_eps"] = f.float("layer_norm_epsilon", f.float("norm_eps", common["norm_eps"]))
    spec = ModelSpec(attention=att, mlp=mlp, moe=moe, recurrent=rec, layer_mixers=mixers, layer_kinds=kinds,
                     **{**common, "layers": layers})
    if approx:
        spec.extra["approximations"] = approx
    return spec


def _groups(f: _Fields, experts: int, n_group: int, topk_group: int) -> dict:
    """``n_group`` and ``topk_group`` of group-limited routing (DeepSeek-V3: the experts split into
    ``n_group`` equal groups, ``topk_group`` of them chosen per token; transformers'
    DeepseekV3MoE.route_tokens_to_experts views the scores as ``[tokens, n_group, experts // n_group]``),
    checked: the groups divide the experts and at most all of them are chosen."""
    n = f.int("n_group", default=n_group)
    k = f.int("topk_group", default=min(topk_group, n))
    if experts % n:
        f._fail("n_group", f"{experts} experts cannot be split into {n} equal routing groups; give an n_group that "
                           "divides n_routed_experts")
    if k > n:
        f._fail("topk_group", f"chooses {k} of {n} routing groups; at most n_group")
    return {"n_group": n, "topk_group": k}


def _top_k(f: _Fields, experts: int, alt: tuple[str, ...] = ()) -> int:
    k = f.int("num_experts_per_tok", alt=alt)
    if k > experts:
        f._fail("num_experts_per_tok", f"top-k ({k}) exceeds the number of experts ({experts})")
    return k


def _fp8_block(f: _Fields) -> tuple[int, int] | None:
    q = f.cfg.get("quantization_config")
    if isinstance(q, dict) and q.get("quant_method") == "fp8":
        b = q.get("weight_block_size")
        if isinstance(b, list) and len(b) == 2 and all(isinstance(x, int) and x > 0 for x in b):
            return (b[0], b[1])
    return None


# the model types with a hand-written parser, in the order error messages list them
_PARSERS: dict[str, Callable[[_Fields, str, str], ModelSpec]] = {
    "llama": _dense, "mistral": _dense, "qwen2": _dense, "qwen3": _dense, "mixtral": _mixtral,
    "qwen3_moe": _qwen3_moe, "deepseek_v2": _deepseek, "deepseek_v3": _deepseek, "kimi_k2": _deepseek,
    "glm4_moe": _glm4_moe, "gpt_oss": _gpt_oss, "nemotron": _dense, "gpt2": _gpt2,
}
SUPPORTED_MODEL_TYPES = tuple(_PARSERS)
