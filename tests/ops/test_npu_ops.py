"""torch_npu's operators read from op-plugin's published list, the shipped npu manifest, and
MindSpeed's fused replacements."""

from __future__ import annotations

import pytest

from dayzero.errors import ConfigError
from dayzero.ops.manifest import load_manifest
from dayzero.ops.npu_ops import built_for, native_ops, registered_ops, replacements

FUNCTIONS = """all_version: [v2.1, v2.6, v2.13]
official:
  - func: mm(Tensor self, Tensor mat2) -> Tensor
    acl_op: all_version
  - func: add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor
    op_api: [v2.7, newest]
  - func: old_only(Tensor self) -> Tensor
    acl_op: [v2.1]
custom:
  - func: npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)
    op_api: all_version
"""


def test_version_fields_as_op_plugin_writes_them():
    versions = ["v2.1", "v2.6", "v2.13"]
    assert built_for("all_version", "2.13", versions) and not built_for("all_version", "2.12", versions)
    assert built_for(["v2.7", "newest"], "2.13", versions) and not built_for(["v2.7", "newest"], "2.6", versions)
    assert built_for(["v2.1", "v2.2"], "2.2", versions) and not built_for(["v2.1"], "2.13", versions)
    assert not built_for(None, "2.13", versions)


def test_registered_ops_per_torch_version():
    aten, npu = registered_ops(FUNCTIONS, "2.13")
    assert aten == {"aten.mm.default", "aten.add.Tensor"} and npu == {"torch_npu.npu_rms_norm.default"}
    aten, _ = registered_ops(FUNCTIONS, "2.1")
    assert aten == {"aten.mm.default", "aten.old_only.default"}
    with pytest.raises(ConfigError, match="op-plugin"):
        registered_ops("supported: [view]", "2.13")


def test_native_ops_of_torch_npu():
    assert native_ops("backend: NPU\nsupported:\n  - view\n  - func: copy_\n    op_api: True\n") == {
        "aten.view.default", "aten.copy_.default"}


def test_the_shipped_npu_manifest_names_its_source_and_mindspeeds_replacements():
    m = load_manifest("npu")
    assert "op-plugin" in m.source and "npu_native_functions.yaml" in m.source
    assert {"aten.mm.default", "aten.view.default", "torch_npu.npu_rms_norm.default"} <= set(m.ops)
    flags = [r.flag for r in replacements(m.ops, {"attention", "rms_norm", "swiglu", "rotary_embedding"})]
    assert flags == ["--use-flash-attn", "--use-fused-rmsnorm", "--use-fused-swiglu", "--use-fused-rotary-pos-emb"]
    # a backend without torch_npu's kernels gets none
    assert replacements(load_manifest("cpu").ops, {"rms_norm"}) == []
