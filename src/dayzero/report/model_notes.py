"""What a verb reports about the model config it read (``--json`` keys shared by every verb), and
the model object of ``dayzero inspect --json`` and the Day-0 report (:func:`model_report`)."""

from __future__ import annotations


def model_notes(spec) -> dict:
    """What every config-reading verb reports about the config: the keys it did not use, and for a
    model derived from its modeling code, the planner's approximations and the exact module-tree count."""
    extra = spec.extra
    out = {"unused_config_keys": list(extra.get("unused_config_keys", [])),
           "derived_from_modeling_code": bool(extra.get("derived")),
           # how the config was read: what was assumed where it is silent (specs.hf_config), the architecture
           # traced, remote code trusted, the language model of a multimodal config (ops.hf_model.config_object)
           "config_notes": list(extra.get("notes", []))}
    if extra.get("derived"):
        out["approximations"] = list(extra.get("approximations", []))
        out["params_module_tree"] = extra.get("params_module_tree")
        desc = extra["description"]
        out["remote_code"] = desc.remote_code
        out["layer_kinds_derived"] = [
            {"name": k.name, "layers": list(k.layers), "params_per_layer": k.params,
             "mixer": _mixer(k.mixer), "mixer_beside": _mixer(k.beside),
             "ffn": {"kind": k.ffn.kind, "module": k.ffn.module, "params": k.ffn.params,
                     "experts": k.ffn.experts.experts if k.ffn.experts else 0, "top_k": k.ffn.top_k,
                     "expert_intermediate": k.ffn.experts.expert.intermediate if k.ffn.experts else 0,
                     "shared_intermediate": k.ffn.shared.intermediate if k.ffn.shared else 0,
                     "intermediate": k.ffn.dense.intermediate if k.ffn.dense else 0},
             "norms": k.norms, "other": k.other} for k in desc.kinds]
        out["params_vision"] = desc.vision
    return out


def _mixer(m) -> dict | None:
    """A derived layer kind's token mixer (describe.Mixer) as ``--json`` lists it."""
    if m is None:
        return None
    return {"kind": m.kind, "module": m.module, "heads": m.heads, "kv_heads": m.kv_heads, "head_dim": m.head_dim,
            "window": m.window, "chunk": m.chunk, "rope": m.rope, "params": m.params}


def model_report(spec, summary, with_mtp: bool = False) -> dict:
    """``dayzero inspect --json`` (and the Day-0 report's ``model``): the exact counts of
    ``summary`` (:func:`dayzero.specs.counting.summarize` of ``spec``) and the model notes."""
    return {**summary.to_dict(spec, with_mtp), **model_notes(spec)}
