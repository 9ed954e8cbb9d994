"""The operators torch_npu registers, read from Ascend's op-plugin, and MindSpeed's fused replacements.

torch_npu's kernels come from op-plugin (github.com/Ascend/op-plugin, gitcode.com/Ascend is upstream):
``op_plugin/config/op_plugin_functions.yaml`` lists under ``official`` the ATen operators it
implements and under ``custom`` its own (``npu_rms_norm``, ``npu_fusion_attention`` ...), each with
the torch versions it is built for (``all_version``, a list of ``vX.Y``, or ``[vX.Y, newest]``: from
X.Y on); torch_npu itself implements the views, copies and factories (:func:`native_ops`).
``scripts/make_npu_manifest.py`` turns both into a backend manifest (``dayzero ops MODEL
--manifest npu``), where an installed
torch_npu is not at hand to ask (``dayzero ops --emit-manifest npu`` asks it).

:data:`MINDSPEED_FUSED` names, for each fused kernel the ops report finds, the torch_npu operator and
the MindSpeed flag that puts it in the model (github.com/Ascend/MindSpeed mindspeed/arguments.py
``_add_network_size_args``; ``--use-flash-attn`` is Megatron-LM's flag, which MindSpeed serves with
``npu_fusion_attention``).
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from dayzero.errors import ConfigError


@dataclass(frozen=True)
class Replacement:
    kernel: str  # the fused kernel (ops.manifest.FUSED_KERNELS)
    npu_op: str  # the torch_npu operator, as a manifest names it
    flag: str  # the MindSpeed-LLM flag that uses it
    source: str


MINDSPEED_FUSED: tuple[Replacement, ...] = (
    Replacement("attention", "torch_npu.npu_fusion_attention.default", "--use-flash-attn",
                "MindSpeed mindspeed/core/context_parallel/dot_product_attention.py (torch_npu.npu_fusion_attention)"),
    Replacement("rms_norm", "torch_npu.npu_rms_norm.default", "--use-fused-rmsnorm",
                "MindSpeed mindspeed/arguments.py _add_network_size_args; mindspeed/core/fusions/fused_rms_norm.py"),
    Replacement("swiglu", "torch_npu.npu_swiglu.default", "--use-fused-swiglu",
                "MindSpeed mindspeed/arguments.py _add_network_size_args; mindspeed/core/fusions/fused_bias_swiglu.py"),
    Replacement("rotary_embedding", "torch_npu.npu_rotary_mul.default", "--use-fused-rotary-pos-emb",
                "MindSpeed mindspeed/arguments.py _add_network_size_args; mindspeed/core/fusions/fused_rope.py runs "
                "MindSpeed's own built kernel (mindspeed/ops/npu_rotary_position_embedding.py); torch_npu's is "
                "npu_rotary_mul"),
)


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.lstrip("v").split(".") if x.isdigit())


def built_for(spec: object, torch_version: str, all_versions: list[str]) -> bool:
    """Whether an op-plugin version field (``all_version``, ``[v2.1, v2.2]``, ``[v2.7, newest]``)
    covers ``torch_version`` (``2.13``)."""
    want = _version(torch_version)[:2]
    if spec == "all_version":
        return any(_version(v)[:2] == want for v in all_versions)
    if isinstance(spec, list) and spec:
        names = [str(x) for x in spec]
        if names[-1] == "newest":
            return want >= _version(names[0])[:2]
        return any(_version(v)[:2] == want for v in names)
    return False


def _overload(func: str, namespace: str) -> str:
    name = func.split("(", 1)[0]
    base, _, over = name.partition(".")
    return f"{namespace}.{base}.{over or 'default'}"


def registered_ops(text: str, torch_version: str) -> tuple[set[str], set[str]]:
    """(the ATen operators, the torch_npu operators) op-plugin builds for ``torch_version``, as a
    manifest names them (``aten.mm.default``, ``torch_npu.npu_rms_norm.default``)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError("op_plugin_functions.yaml", None, f"not YAML: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("official"), list):
        raise ConfigError("op_plugin_functions.yaml", None, "expected op-plugin's functions file (official:, "
                          "custom:)")
    versions = [str(v) for v in doc.get("all_version") or []]

    def ops(section: str, namespace: str) -> set[str]:
        out = set()
        for e in doc.get(section) or []:
            if isinstance(e, dict) and "func" in e and any(
                    built_for(e.get(k), torch_version, versions) for k in ("acl_op", "op_api")):
                out.add(_overload(str(e["func"]), namespace))
        return out

    return ops("official", "aten"), ops("custom", "torch_npu")


def native_ops(text: str) -> set[str]:
    """The ATen operators torch_npu implements itself (views, copies, factories: ``supported`` in
    torch_npu/csrc/aten/npu_native_functions.yaml of github.com/Ascend/pytorch), as a manifest names them."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError("npu_native_functions.yaml", None, f"not YAML: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("supported"), list):
        raise ConfigError("npu_native_functions.yaml", None, "expected torch_npu's native functions file (supported:)")
    names = [e.get("func") if isinstance(e, dict) else e for e in doc["supported"]]
    return {_overload(str(n), "aten") for n in names if n}


def replacements(manifest_ops: set[str] | list[str], kernels: set[str] | list[str]) -> list[Replacement]:
    """MindSpeed's fused replacements for the fused ``kernels`` a model has, where the manifest
    has the torch_npu operator behind them."""
    have, want = set(manifest_ops), set(kernels)
    return [r for r in MINDSPEED_FUSED if r.kernel in want and r.npu_op in have]


def fused_replacements(report: dict, manifest: str) -> list[Replacement]:
    """MindSpeed's flags for the fused kernels an ops report (``OpsReport.to_dict``) finds provided,
    where the manifest ``manifest`` (a shipped name or a file) holds torch_npu's operator."""
    from dayzero.ops.manifest import load_manifest

    found = {k for f in report["fusions"] if f["provided"] for k in f["provided_by"].split("+")}
    return replacements(load_manifest(manifest).ops, found)
