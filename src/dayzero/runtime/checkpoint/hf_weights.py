"""Hugging Face safetensors checkpoints -> zoo parameters (llama / mistral / qwen / mixtral /
deepseek families).

The zoo names every tensor once (``layers.3.attention.wq.weight``); :func:`hf_sources` lists the
HF names that hold it. Routed experts are one stacked (E, ...) tensor in the zoo and E tensors in
a hub checkpoint (``mlp.experts.{e}.gate_proj.weight``), or the fused ``gate_up_proj`` that
transformers >= 5 uses at run time; both are read. Tensors are read lazily, one at a time, so a
rank only ever holds one full tensor while it copies out its shard.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from dayzero.errors import ConfigError

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "deepseek_v2", "deepseek_v3", "kimi_k2",
            "glm4_moe")

# zoo suffix (after "layers.{i}.") -> HF suffix (after "model.layers.{i}.")
_LAYER = {
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attention.wq.weight": "self_attn.q_proj.weight", "attention.wq.bias": "self_attn.q_proj.bias",
    "attention.wk.weight": "self_attn.k_proj.weight", "attention.wk.bias": "self_attn.k_proj.bias",
    "attention.wv.weight": "self_attn.v_proj.weight", "attention.wv.bias": "self_attn.v_proj.bias",
    "attention.wo.weight": "self_attn.o_proj.weight", "attention.wo.bias": "self_attn.o_proj.bias",
    "attention.q_norm.weight": "self_attn.q_norm.weight", "attention.k_norm.weight": "self_attn.k_norm.weight",
    # MLA (with q_lora_rank the zoo's q_norm is HF's q_a_layernorm)
    "attention.wq_a.weight": "self_attn.q_a_proj.weight", "attention.wq_a.bias": "self_attn.q_a_proj.bias",
    "attention.wq_b.weight": "self_attn.q_b_proj.weight",
    "attention.wkv_a.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attention.wkv_a.bias": "self_attn.kv_a_proj_with_mqa.bias",
    "attention.kv_norm.weight": "self_attn.kv_a_layernorm.weight",
    "attention.wkv_b.weight": "self_attn.kv_b_proj.weight",
    "mlp.w1.weight": "mlp.gate_proj.weight", "mlp.w3.weight": "mlp.up_proj.weight",
          "mlp.w2.weight": "mlp.down_proj.weight",
    "moe.router.gate.weight": "mlp.gate.weight", "moe.router.gate.bias": "mlp.gate.bias",
    "moe.router.e_score_correction_bias": "mlp.gate.e_score_correction_bias",
    "moe.shared.w1.weight": "mlp.shared_experts.gate_proj.weight",
    "moe.shared.w3.weight": "mlp.shared_experts.up_proj.weight",
    "moe.shared.w2.weight": "mlp.shared_experts.down_proj.weight",
    "moe.shared_gate.weight": "mlp.shared_expert_gate.weight",
}
# zoo expert weight -> (Hugging Face name, Mixtral's name): the one table of expert weight names
EXPERT_NAMES = {"w1": ("gate_proj", "w1"), "w3": ("up_proj", "w3"), "w2": ("down_proj", "w2")}
_TOP = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight"}


def hf_sources(fqn: str, mla_q_lora: bool) -> list[str]:
    """Candidate HF names for a zoo tensor, first match wins (experts handled separately)."""
    if fqn in _TOP:
        names = [_TOP[fqn]]
        if fqn == "output.weight":  # tied checkpoints store only the embedding
            names.append("model.embed_tokens.weight")
        return names
    m = re.fullmatch(r"layers\.(\d+)\.(.+)", fqn)
    if not m or m.group(2) not in _LAYER:
        return []
    i, rest = m.groups()
    hf = _LAYER[rest]
    if rest == "attention.q_norm.weight" and mla_q_lora:
        hf = "self_attn.q_a_layernorm.weight"
    names = [f"model.layers.{i}.{hf}"]
    if hf.startswith("mlp."):  # Mixtral keeps its MoE under block_sparse_moe; Qwen2-MoE's shared expert
        names.append(f"model.layers.{i}.block_sparse_moe.{hf[4:]}")
        names.append(f"model.layers.{i}.{hf.replace('shared_experts', 'shared_expert')}")
    return names


def open_safetensors(path: Path):
    """``safe_open`` on ``path``, with a file that is not valid safetensors (empty, truncated, a
    header that is not JSON, an unknown dtype, offsets outside the file) as one ConfigError."""
    from safetensors import SafetensorError, safe_open

    try:
        return safe_open(str(path), framework="pt")
    except (SafetensorError, OSError, ValueError, TypeError, RuntimeError) as e:
        raise ConfigError(str(path), None, f"not a readable safetensors file ({_reason(e)}); re-download or "
                          "re-export it") from None


def read_tensor(handle, path: Path, name: str) -> torch.Tensor:
    """Tensor ``name`` of an open safetensors file (a dtype torch lacks or bad data: one ConfigError)."""
    from safetensors import SafetensorError

    try:
        return handle.get_tensor(name)
    except (SafetensorError, OSError, ValueError, TypeError, RuntimeError) as e:
        raise ConfigError(str(path), name, f"cannot read this tensor ({_reason(e)}); re-download or re-export "
                          "the file") from None


def _reason(e: Exception) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:200]


class HFCheckpoint:
    """A directory of ``*.safetensors`` files, read lazily by zoo name."""

    def __init__(self, path: str | Path, spec):
        self.path, self.spec = Path(path), spec
        if spec.model_type not in FAMILIES:
            raise ConfigError(str(path), "model_type", f"{spec.model_type!r}: HF weight loading supports "
                              f"{', '.join(FAMILIES)}")
        files = sorted(self.path.glob("*.safetensors")) if self.path.is_dir() else [self.path]
        if not files or not all(f.exists() for f in files):
            raise ConfigError(str(path), None, "no *.safetensors files found; pass the checkpoint directory "
                              "(config.json + model*.safetensors)")
        self._open = {f: open_safetensors(f) for f in files}
        self.where: dict[str, Path] = {}
        for f, h in self._open.items():
            for k in h.keys():
                self.where[k] = f

    def _get(self, name: str) -> torch.Tensor:
        f = self.where[name]
        return read_tensor(self._open[f], f, name)

    def tensor(self, fqn: str, shape: tuple[int, ...]) -> torch.Tensor:
        """The full zoo tensor ``fqn`` (fp32), from however many HF tensors hold it."""
        m = re.fullmatch(r"layers\.(\d+)\.moe\.experts\.(w[123])", fqn)
        t = self._experts(int(m.group(1)), m.group(2), shape) if m else self._plain(fqn)
        if tuple(t.shape) != tuple(shape):
            raise ConfigError(str(self.path), fqn, f"checkpoint shape {tuple(t.shape)} != model shape "
                              f"{tuple(shape)}; the config.json does not match these weights")
        return t.float()

    def _plain(self, fqn: str) -> torch.Tensor:
        for name in hf_sources(fqn, self.spec.attention.q_lora_rank is not None):
            if name in self.where:
                return self._get(name)
        raise ConfigError(str(self.path), fqn, "not found in the checkpoint (looked for "
                          f"{', '.join(hf_sources(fqn, False)) or 'no known HF name'})")

    def _experts(self, layer: int, w: str, shape) -> torch.Tensor:
        hf, mixtral = EXPERT_NAMES[w]
        experts = shape[0]
        for prefix in (f"model.layers.{layer}.mlp.experts", f"model.layers.{layer}.block_sparse_moe.experts"):
            for name in (hf, mixtral):
                if f"{prefix}.0.{name}.weight" in self.where:
                    return torch.stack([self._get(f"{prefix}.{e}.{name}.weight") for e in range(experts)])
            fused = f"{prefix}.gate_up_proj" if w != "w2" else f"{prefix}.down_proj"
            if fused in self.where:  # transformers >= 5 run-time layout: gate_up (E, 2I, H)
                t = self._get(fused)
                if w == "w2":
                    return t
                inter = t.shape[1] // 2
                return t[:, :inter] if w == "w1" else t[:, inter:]
        raise ConfigError(str(self.path), f"layers.{layer}.moe.experts.{w}",
                          f"no expert weights found under model.layers.{layer}.mlp.experts")


def checkpoint_config(path: str | Path) -> dict:
    p = Path(path)
    cfg = (p if p.is_dir() else p.parent) / "config.json"
    from dayzero.inputs import load_json

    if not cfg.exists():
        raise ConfigError(str(cfg), None, "cannot read the checkpoint's config.json: file not found")
    try:
        return load_json(cfg, "the checkpoint's config.json")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ConfigError(str(cfg), None, f"cannot read the checkpoint's config.json: {_reason(e)}") from None
