"""Model presets (``presets/models/*.json``) and the one way to turn a MODEL argument into a
ModelSpec: a preset name, a path to a ``config.json``, or a directory holding one."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import Path

from dayzero.errors import ConfigError
from dayzero.specs.hf_config import (
    SUPPORTED_MODEL_TYPES,
    check_bounds,
    check_size,
    load_config_file,
    spec_from_hf_config,
)
from dayzero.specs.model import ModelSpec


@lru_cache(maxsize=1)
def model_presets() -> dict[str, dict]:
    """Preset name -> HF config dict (with its ``_dayzero`` description and source)."""
    base = resources.files("dayzero.specs.presets") / "models"
    return {p.name[:-5]: json.loads(p.read_text()) for p in sorted(base.iterdir(), key=lambda p: p.name)
            if p.name.endswith(".json")}


def load_model(model: str | Path, trust_remote_code: bool = False) -> ModelSpec:
    """MODEL argument -> ModelSpec. Presets win over a same-named file in the working directory
    only when no such path exists. A ``model_type`` without a hand-written parser is derived from
    its own modeling code (:func:`derived_model`)."""
    text = str(model)
    presets = model_presets()
    path = Path(text)
    if text in presets and not path.exists():
        cfg = presets[text]
        if _derived(cfg):
            return derived_model(text, cfg, f"preset {text}", trust_remote_code)
        return spec_from_hf_config(cfg, name=text, source=f"preset {text}")
    if not path.exists():
        from dayzero.names import did_you_mean

        hint = did_you_mean(text, presets)
        raise ConfigError(text, None, f"no such preset or file{hint}; see 'dayzero models', or pass a "
                          "config.json or a directory holding one")
    cfg, source = load_config_file(path)
    name = path.name if path.is_dir() else (path.parent.name if path.name == "config.json" else path.stem)
    if _derived(cfg):
        return derived_model(text, cfg, source, trust_remote_code)
    return spec_from_hf_config(cfg, name=name or "model", source=source)


def model_config(model: str | Path) -> dict:
    """The Hugging Face config dict behind MODEL (a preset's, or the file's), without dayzero's own
    ``_dayzero`` notes: what an export writes for an engine that builds the model with transformers."""
    text, path = str(model), Path(str(model))
    presets = model_presets()
    cfg = presets[text] if text in presets and not path.exists() else load_config_file(path)[0]
    return {k: v for k, v in cfg.items() if k != "_dayzero"}


def _derived(cfg: dict) -> bool:
    mt = cfg.get("model_type")
    return isinstance(mt, str) and mt not in SUPPORTED_MODEL_TYPES


def derived_model(model: str, cfg: dict, source: str, trust_remote_code: bool = False) -> ModelSpec:
    """ModelSpec of a model dayzero has no parser for, derived from its own modeling code on the meta
    device (needs torch and transformers, imported only here). ``spec.extra`` carries the description,
    the exact module-tree count, the planner's approximations and the unused config keys."""
    from dayzero.derive.describe import describe, experts_build_modules
    from dayzero.derive.to_spec import spec_from_description
    from dayzero.derive.traced_flops import with_traced_flops

    check_bounds(cfg, source, None if trust_remote_code else lambda key: experts_build_modules(cfg, source, key))
    desc = describe(model, trust_remote_code)
    spec, approximations = spec_from_description(desc)
    check_size(spec, source)
    spec, traced = with_traced_flops(model, desc, spec, trust_remote_code)
    approximations += traced
    spec.extra.update(derived=True, description=desc, approximations=approximations,
                      params_module_tree=desc.total, unused_config_keys=list(desc.unused_config_keys),
                      notes=list(desc.notes))
    return spec
