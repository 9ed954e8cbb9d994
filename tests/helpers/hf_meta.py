"""Parameter counts of transformers' own model on the meta device (what `dayzero inspect` must equal)."""

from __future__ import annotations


def meta_count(model_type: str, cfg: dict) -> int:
    """Parameters (a shared tensor once) plus persistent buffers of the causal LM transformers builds
    for ``model_type`` with ``cfg`` (no ``model_type`` key), built on the meta device."""
    import torch
    import transformers

    config = transformers.AutoConfig.for_model(model_type, **cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() for m in model.modules() for n, b in m._buffers.items()
                  if b is not None and n not in m._non_persistent_buffers_set)
    return params + buffers
