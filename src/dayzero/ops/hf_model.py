"""Build a model's real modeling code on the meta device, at reduced depth.

The model comes from ``transformers`` (its implementation for the config's ``model_type``) or from
a local directory that ships its own ``modeling_*.py`` (only with ``trust_remote_code``). It is
instantiated at full depth on the meta device (no memory, no weights), its decoder layers are
grouped into kinds by structure, and the layer list is cut to one representative per kind, so a
trace of the reduced model times the number of layers of each kind is a trace of the full model.

Layer kinds come from the modules themselves, not from a table per family: two layers are the same
kind when their submodules have the same classes, parameter shapes and scalar attributes (sliding
window, attention type, ...). ``layer_idx`` attributes are renumbered and per-layer config lists
(``layer_types``) are cut to match, because some models index them by position in the forward.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from dayzero.derive.structure import expert_list, expert_tensors, find_layer_list, layer_signature
from dayzero.errors import ConfigError, DayzeroError, one_line
from dayzero.specs.hf_config import SUPPORTED_MODEL_TYPES, load_config_file, spec_from_hf_config
from dayzero.specs.model import ModelSpec
from dayzero.specs.registry import load_model, model_presets

# model_type aliases: presets whose model_type transformers does not implement under that name but
# whose checkpoints name a transformers architecture (Kimi-K2's config.json lists
# "architectures": ["DeepseekV3ForCausalLM"]).
MODEL_TYPE_ALIASES = {"kimi_k2": "deepseek_v3"}
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
EXPERTS_IMPLEMENTATIONS = ("grouped_mm", "eager", "batched_mm")


@dataclass(frozen=True)
class LayerKind:
    """Decoder layers that share one structure; ``traced`` is the representative's index in the
    reduced model, ``layers`` the full model's layer indices of this kind."""

    name: str
    layers: tuple[int, ...]
    traced: int

    def ranges(self) -> str:
        """(0, 1, 2, 5) -> '0-2, 5'; (0, 2, 4, 6) -> '0-6 every 2'."""
        steps = {b - a for a, b in zip(self.layers, self.layers[1:])}
        if len(self.layers) >= 3 and len(steps) == 1 and steps != {1}:
            return f"{self.layers[0]}-{self.layers[-1]} every {steps.pop()}"
        out, start = [], self.layers[0]
        for a, b in zip(self.layers, self.layers[1:] + (None,)):
            if b != a + 1:
                out.append(f"{start}" if start == a else f"{start}-{a}")
                start = b
        return ", ".join(out)


@dataclass
class MetaModel:
    """The reduced model on the meta device and what is needed to scale its trace."""

    model: nn.Module
    name: str
    model_type: str  # as transformers implements it
    kinds: tuple[LayerKind, ...]
    num_layers: int  # of the full model
    layer_list: str  # qualified name of the decoder-layer ModuleList, e.g. "model.layers"
    spec: ModelSpec | None  # None for remote code with a model_type dayzero does not parse
    experts: str = ""  # transformers' experts implementation traced ("" without MoE experts)
    notes: list[str] = field(default_factory=list)


def _quiet_transformers():
    """Silence transformers' info/warning logs for the duration (restores the previous level)."""
    from transformers.utils import logging as hf_logging

    @contextlib.contextmanager
    def ctx():
        before = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            yield
        finally:
            hf_logging.set_verbosity(before)

    return ctx()


def read_model_config(model: str) -> tuple[dict, str, str, Path | None]:
    """MODEL (preset, config.json or directory) -> (config dict, name, source, directory or None)."""
    presets = model_presets()
    path = Path(model)
    if model in presets and not path.exists():
        cfg, name, source, directory = dict(presets[model]), model, f"preset {model}", None
    elif path.exists():
        cfg, source = load_config_file(path)
        directory = path if path.is_dir() else path.parent
        name = directory.name if path.is_dir() or path.name == "config.json" else path.stem
    else:
        load_model(model)  # raises the registry's one-line error (no such preset or file, with hints)
        raise ConfigError(model, None, "no such preset or file")  # pragma: no cover
    cfg.pop("_dayzero", None)
    return cfg, name or "model", source, directory


def config_object(cfg: dict, name: str, source: str, directory: Path | None, trust_remote_code: bool = False):
    """A config dict -> (transformers config, notes, remote code?)."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    mt = cfg.get("model_type")
    notes: list[str] = []
    modeling = sorted(p.name for p in directory.glob("modeling_*.py")) if directory else []
    if modeling:
        if not trust_remote_code:
            raise DayzeroError(f"{directory}: ships its own modeling code ({', '.join(modeling)}), which runs only "
                               "with --trust-remote-code; pass it if you trust that code")
        with _quiet_transformers():
            try:
                config = AutoConfig.from_pretrained(str(directory), trust_remote_code=True, local_files_only=True)
            except Exception as e:  # remote code can fail in any way; report it in one line
                raise ConfigError(str(directory), None, f"cannot load its config with its own code: "
                                  f"{type(e).__name__}: {str(e)[:300]}") from None
        notes.append(f"modeling code from {directory} ({', '.join(modeling)}), trusted by --trust-remote-code")
        return config, notes, True
    if not isinstance(mt, str):
        raise ConfigError(source, "model_type", "is missing; expected the Hugging Face model type, e.g. 'llama'")
    hf_type = MODEL_TYPE_ALIASES.get(mt, mt)
    if hf_type != mt:
        arch = cfg.get("architectures")
        named = f" (its config.json names {', '.join(arch)})" if isinstance(arch, list) and arch else ""
        notes.append(f"transformers has no '{mt}' model; traced its architecture '{hf_type}'{named}")
    if hf_type not in CONFIG_MAPPING:
        import transformers

        raise ConfigError(source, "model_type", f"'{mt}' is not implemented by transformers "
                          f"{transformers.__version__}; pass a directory with its own modeling_*.py "
                          "and --trust-remote-code")
    fields = {k: v for k, v in cfg.items() if k != "model_type"}
    with _quiet_transformers():
        try:
            config = AutoConfig.for_model(hf_type, **fields)
        except Exception as e:
            raise ConfigError(source, None, f"transformers rejects this config: {type(e).__name__}: "
                              f"{str(e)[:300]}") from None
    return as_causal_decoder(language_model_config(config, notes), notes), notes, False


def as_causal_decoder(config, notes: list[str]):
    """``config`` with ``is_decoder`` set where its class has the switch and it is off: an encoder
    family (BERT, RoBERTa, Reformer, ...) built as a causal LM attends bidirectionally unless told it
    is a decoder (transformers' ``BertLMHeadModel`` only warns; ``ReformerModelWithLMHead`` refuses),
    and a causal LM that sees the tokens it predicts is not the model planned."""
    if getattr(config, "is_decoder", None) is False:
        config.is_decoder = True
        notes.append(f"{type(config).__name__} has is_decoder false; built as a causal LM with is_decoder true "
                     "(causal self-attention, as transformers' causal-LM head requires)")
    return config


def language_model_config(config, notes: list[str]):
    """``config`` itself where transformers builds it as a causal LM; else, for a multimodal config
    whose language model is a sub-config (``text_config``: Mistral3, LLaVA-style wrappers), that
    sub-config, with a note naming the towers left out (the planner plans the language model)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING:
        return config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if text is config or type(text) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        return config  # building it fails with transformers' own sentence
    towers = sorted(k for k, v in vars(config).items() if k.endswith("_config") and v is not text
                    and hasattr(v, "to_dict"))
    notes.append(f"{type(config).__name__} is not a causal LM transformers builds alone: its language model "
                 f"({text.model_type}, text_config) is planned; {', '.join(towers) or 'the other towers'} not")
    return text


def resolve_config(model: str, trust_remote_code: bool = False):
    """MODEL -> (transformers config, name, ModelSpec or None, notes, remote code?)."""
    cfg, name, source, directory = read_model_config(model)
    mt = cfg.get("model_type")
    spec = spec_from_hf_config(cfg, name=name, source=source) if mt in SUPPORTED_MODEL_TYPES else None
    config, notes, remote = config_object(cfg, name, source, directory, trust_remote_code)
    return config, name, spec, notes, remote


def build_meta_model(model: str, dtype: str = "bfloat16", experts: str = "grouped_mm",
                     trust_remote_code: bool = False) -> MetaModel:
    """Instantiate MODEL's modeling code on the meta device with one decoder layer per kind."""
    from transformers import AutoModelForCausalLM

    if dtype not in DTYPES:
        raise DayzeroError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    if experts not in EXPERTS_IMPLEMENTATIONS:
        raise DayzeroError(f"--experts-impl {experts!r}: expected one of {', '.join(EXPERTS_IMPLEMENTATIONS)}")
    config, name, spec, notes, remote = resolve_config(model, trust_remote_code)
    # eager attention is the reference implementation every backend can run; fused attention then
    # shows up as a fusion opportunity instead of being hidden inside one SDPA call.
    kwargs = dict(dtype=DTYPES[dtype], attn_implementation="eager", trust_remote_code=remote)
    with _quiet_transformers(), torch.device("meta"):
        try:
            net = AutoModelForCausalLM.from_config(config, **kwargs)
        except Exception as e:
            raise DayzeroError(f"{name}: cannot build {type(config).__name__} on the meta device: "
                               f"{one_line(e)}") from None
    used = ""
    if hasattr(net, "set_experts_implementation") and _has_experts(net):
        used = _set_experts(net, experts, notes)
    net.train()
    layer_list, layers = _find_layer_list(net, config)
    kinds = _group_layers(layers)
    _cut_layers(net, config, layer_list, layers, kinds)
    return MetaModel(model=net, name=name, model_type=config.model_type, kinds=kinds, num_layers=len(layers),
                     layer_list=layer_list, spec=spec, experts=used, notes=notes)


def _has_experts(net: nn.Module) -> bool:
    return any("experts" in type(m).__name__.lower() for m in net.modules())


def _set_experts(net: nn.Module, experts: str, notes: list[str]) -> str:
    """Ask transformers for ``experts``; a model that refuses it (remote code, or a class that does not
    support that implementation) falls back to eager, and the note says so."""
    for impl in dict.fromkeys((experts, "eager")):
        try:
            with _quiet_transformers():
                net.set_experts_implementation(impl)
        except Exception as e:  # noqa: BLE001 - any model may refuse; the fallback is eager
            notes.append(f"{type(net).__name__} refuses experts implementation '{impl}' "
                         f"({one_line(e, 160)})")
            continue
        notes.append(f"MoE experts traced with transformers' '{impl}' implementation"
                     + (" instead" if impl != experts else ""))
        return impl
    notes.append("MoE experts traced as the model's own code runs them")
    return ""


def _find_layer_list(net: nn.Module, config) -> tuple[str, nn.ModuleList]:
    """The ModuleList of decoder layers, found by structure (dayzero.derive.structure)."""
    qual, mod = find_layer_list(net)
    if mod is None:
        raise DayzeroError(f"{type(net).__name__}: no ModuleList of repeated decoder blocks found; "
                           "cannot reduce the depth of this model")
    return qual, mod


def _is_moe_layer(layer: nn.Module) -> bool:
    """Routed experts: 3-D expert weights outside convolutions, or a ModuleList of experts."""
    return bool(expert_tensors(layer)) or expert_list(layer) is not None


def _group_layers(layers: nn.ModuleList) -> tuple[LayerKind, ...]:
    groups: dict[tuple, list[int]] = {}
    for i, layer in enumerate(layers):
        groups.setdefault(layer_signature(layer), []).append(i)
    sigs = list(groups)
    base = ["moe" if _is_moe_layer(layers[groups[s][0]]) else "dense" for s in sigs]
    names = []
    for k, s in enumerate(sigs):
        if base.count(base[k]) == 1:
            names.append(base[k])
            continue
        others = [dict(_flat_attrs(t)) for j, t in enumerate(sigs) if j != k and base[j] == base[k]]
        mine = _flat_attrs(s)
        diff = [v for key, v in mine if isinstance(v, str) and any(o.get(key) != v for o in others)]
        names.append(f"{base[k]}/{diff[0]}" if diff else f"{base[k]}#{base[:k + 1].count(base[k])}")
    return tuple(LayerKind(name=nm, layers=tuple(groups[s]), traced=t) for t, (nm, s) in enumerate(zip(names, sigs)))


def _flat_attrs(sig: tuple) -> list[tuple[str, object]]:
    return [(f"{qual}.{k}", v) for qual, _, attrs, _, _ in sig for k, v in attrs]


def _cut_layers(net: nn.Module, config, layer_list: str, layers: nn.ModuleList, kinds: tuple[LayerKind, ...]) -> None:
    """Keep one layer per kind (in kind order), renumber them, and cut per-layer config lists."""
    reps = [kind.layers[0] for kind in kinds]
    n = len(layers)
    kept = nn.ModuleList([layers[i] for i in reps])
    for new, layer in enumerate(kept):
        for mod in layer.modules():
            if isinstance(getattr(mod, "layer_idx", None), int):
                mod.layer_idx = new
    parent_name, _, attr = layer_list.rpartition(".")
    parent = net.get_submodule(parent_name) if parent_name else net
    setattr(parent, attr, kept)
    for key, value in list(vars(config).items()):
        if isinstance(value, (list, tuple)) and len(value) == n and not key.startswith("_"):
            setattr(config, key, type(value)(value[i] for i in reps))
    try:
        config.num_hidden_layers = len(reps)
    except Exception:  # noqa: BLE001 - a class whose count is derived (ProphetNet refuses the setter): the list is cut
        pass
