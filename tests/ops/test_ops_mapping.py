"""Manifests, the mapping report, decompositions and fusion opportunities."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from dayzero.errors import ConfigError, DayzeroError  # noqa: E402
from dayzero.ops import decompose as dec  # noqa: E402
from dayzero.ops.manifest import emit_manifest, load_manifest, parse_manifest  # noqa: E402
from dayzero.ops.report import map_trace  # noqa: E402
from dayzero.ops.trace import TensorSpec, trace_model  # noqa: E402

REMOVED = ("aten.silu.default", "aten.rsqrt.default")


@pytest.fixture(scope="module")
def llama_trace():
    return trace_model("tiny-llama", seq=64)


@pytest.fixture(scope="module")
def moe_trace():
    return trace_model("tiny-moe", seq=64)


def test_manifest_minus_ops_reports_exactly_those_with_verified_decompositions(llama_trace):
    manifest = load_manifest("cpu").without(*REMOVED)
    report = map_trace(llama_trace, manifest)
    assert sorted(r.op for r in report.unsupported) == sorted(REMOVED)
    for row in report.unsupported:
        d = row.decomposition
        assert d.complete and d.verified is True, d
        assert not row.needs_kernel
        assert d.leaves and all(manifest.supports(op) for op in d.leaves)
        assert row.op not in d.leaves
    silu = next(r for r in report.unsupported if r.op == "aten.silu.default").decomposition
    assert {"aten.sigmoid.default", "aten.mul.Tensor"} <= set(silu.leaves)
    rsqrt = next(r for r in report.unsupported if r.op == "aten.rsqrt.default").decomposition
    assert set(rsqrt.leaves) == {"aten.sqrt.default", "aten.reciprocal.default"}
    assert report.coverage < 1.0 and report.coverage_flops == 1.0
    js = report.to_dict()
    assert set(js) >= {"coverage", "ops", "unsupported", "fusions"}
    assert {u["op"] for u in js["unsupported"]} == set(REMOVED)
    assert all(set(o) >= {"op", "count", "flops", "bytes", "supported", "decomposition"} for o in js["ops"])


def test_cpu_manifest_covers_everything_traced(llama_trace, moe_trace):
    """The cpu manifest lists the kernels registered in this very process: whatever runs here
    must be supported."""
    for tr in (llama_trace, moe_trace):
        report = map_trace(tr, "cpu", check=False)
        assert report.coverage == 1.0 and not report.unsupported


def test_example_npu_needs_decompositions_and_a_kernel(moe_trace):
    report = map_trace(moe_trace, "example-npu")
    by_op = {r.op: r for r in report.unsupported}
    assert {"aten.silu.default", "aten.silu_backward.default", "aten.nll_loss_forward.default"} <= set(by_op)
    assert by_op["aten.silu.default"].decomposition.verified is True
    # MoE routing's histogram has no decomposition anywhere: the backend needs a kernel for it
    assert by_op["aten.histc.default"].needs_kernel
    assert "aten.histc.default" in {n["op"] for n in report.to_dict()["needs_kernel"]}
    # in-place ops lower through functionalization (x.op_(y) = x.copy_(op(x, y)))
    assert "functionalization" in by_op["aten.div_.Tensor"].decomposition.sources


def test_dtype_restrictions_make_calls_unsupported(llama_trace):
    text = load_manifest("cpu").to_yaml().replace("name: cpu", "name: no-fp32-mean")
    text += "dtypes:\n  aten.mean.dim: [bfloat16]\n"
    manifest = parse_manifest(text)
    report = map_trace(llama_trace, manifest)
    (row,) = report.unsupported
    assert row.op == "aten.mean.dim" and "float32" in row.reason
    assert row.decomposition.complete and row.decomposition.verified is True  # sum then divide


def test_numeric_check_catches_a_wrong_decomposition(monkeypatch):
    wrong = dict(dec.IDENTITIES)
    wrong[torch.ops.aten.rsqrt.default] = lambda x: torch.ops.aten.sqrt.default(x)
    monkeypatch.setattr(dec, "IDENTITIES", wrong)
    manifest = load_manifest("cpu").without("aten.rsqrt.default")
    example = ((TensorSpec((4, 8), torch.float32),), {})
    d = dec.decompose("aten.rsqrt.default", example, manifest.supports)
    assert d.complete and d.verified is False


def test_no_decomposition_means_needs_a_kernel():
    manifest = load_manifest("cpu").without("aten.mm.default")
    example = ((TensorSpec((4, 8), torch.bfloat16), TensorSpec((8, 3), torch.bfloat16)), {})
    d = dec.decompose("aten.mm.default", example, manifest.supports)
    assert not d.complete and d.missing


def test_fusions_found_and_matched_against_manifests(llama_trace):
    cuda = {f.pattern: f for f in map_trace(llama_trace, "cuda", check=False).fusions}
    assert {"attention", "rms_norm", "swiglu", "rotary_embedding"} <= set(cuda)
    att = cuda["attention"]
    assert att.ops[0] == att.ops[-1] == "aten.bmm.default" and "aten._softmax.default" in att.ops
    assert att.occurrences == 4 and att.bytes_saved > 0 and att.launches_saved == 4 * (att.kernels - 1)
    assert att.provided_by == "attention"  # CUDA has flash attention
    assert cuda["rms_norm"].provided_by == "rms_norm"  # and aten._fused_rms_norm
    assert cuda["swiglu"].provided_by is None and cuda["rotary_embedding"].provided_by is None
    npu = {f.pattern: f for f in map_trace(llama_trace, "example-npu", check=False).fusions}
    assert npu["swiglu"].provided_by == "swiglu" and npu["rotary_embedding"].provided_by == "rotary_embedding"
    for f in cuda.values():
        assert 0 <= f.bytes_fused and f.bytes_saved <= f.bytes_unfused


# -- manifests ---------------------------------------------------------------------------------

def test_shipped_manifests_load():
    for name in ("cuda", "cpu", "example-npu"):
        m = load_manifest(name)
        assert m.supports("aten.mm.default") and len(m.ops) > 1000
    npu = load_manifest("example-npu")
    assert not npu.supports("aten.mm.default", ("float64",)) and npu.supports("aten.mm.default", ("bfloat16",))
    assert set(load_manifest("cuda").fused) >= {"attention", "rms_norm"}


def test_shipped_manifests_match_the_installed_torch():
    cpu = load_manifest("cpu")
    if torch.__version__ not in cpu.source:
        pytest.skip(f"shipped manifests were generated with another torch ({cpu.source})")
    assert emit_manifest("CPU")[0].ops == cpu.ops
    assert emit_manifest("CUDA")[0].ops == load_manifest("cuda").ops


def test_native_functions_parser_agrees_with_the_dispatcher():
    """cuda.yaml comes from parsing native_functions.yaml; the same parser for CPU must agree
    with the kernels actually registered for CPU in this process."""
    live = set(emit_manifest("CPU", source="dispatcher")[0].ops)
    parsed = set(emit_manifest("CPU", source="native_functions")[0].ops)
    assert len(live ^ parsed) < 0.02 * len(live)
    for op in ("aten.add.Tensor", "aten.silu.default", "aten.mm.default", "aten._softmax.default"):
        assert op in parsed


@pytest.mark.parametrize("text,field", [
    ("name: x\nops: [aten.mm.default\n", None),  # malformed YAML
    ("name: x\n", "ops"),
    ("ops: [aten.mm.default]\n", "name"),
    ("name: x\nops: [mm]\n", "ops"),
    ("name: x\nops: [aten.mm.default]\nfused: [warp_speed]\n", "fused"),
    ("name: x\nops: [aten.mm.default]\ndtypes: {aten.bmm.default: [bfloat16]}\n", None),
    ("name: x\nops: [aten.mm.default]\ndtypes: {aten.mm.default: [bf16]}\n", None),
    ("name: x\nops: [aten.mm.default]\nkernels: 3\n", "kernels"),
    ("- just\n- a list\n", None),
])
def test_malformed_manifests_are_one_line_errors(text, field):
    with pytest.raises(ConfigError) as e:
        parse_manifest(text, "bad.yaml")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("bad.yaml")
    if field:
        assert e.value.field == field


def test_emit_manifest_errors():
    with pytest.raises(DayzeroError, match="unknown dispatch key or device type 'NoSuchKey'"):
        emit_manifest("NoSuchKey")
    with pytest.raises(DayzeroError, match="no kernels in native_functions.yaml.*--manifest-source dispatcher"):
        emit_manifest("PrivateUse1", source="native_functions")
    # no extension registers PrivateUse1 kernels here: auto reads the dispatcher and says what to install
    with pytest.raises(DayzeroError, match="no ATen kernels are registered for dispatch key 'PrivateUse1'.*extension"):
        emit_manifest("PrivateUse1")


def test_device_types_name_their_dispatch_keys():
    from dayzero.ops._torch_compat import dispatch_key

    assert [dispatch_key(n) for n in ("CPU", "cpu", "CUDA", "cuda", "xpu", "privateuseone")] == [
        "CPU", "CPU", "CUDA", "CUDA", "XPU", "PrivateUse1"]
    assert emit_manifest("cuda")[0].ops == emit_manifest("CUDA")[0].ops


_OUT_OF_TREE = """
import sys, torch
from dayzero.ops.manifest import emit_manifest, load_manifest
torch.utils.rename_privateuse1_backend("fakenpu")
lib = torch.library.Library("aten", "IMPL")
for op in ("embedding_dense_backward", "add.Tensor", "_softmax"):
    lib.impl(op, lambda *a, **k: None, "PrivateUse1")
m, header = emit_manifest("fakenpu")  # auto: the dispatcher, by the device type the extension registered
assert m.name == "fakenpu" and "PrivateUse1 (fakenpu)" in m.source, m.source
assert m.supports("aten.embedding_dense_backward.default") and m.supports("aten._softmax.default")
assert not m.supports("aten.native_dropout.default")  # neither registered nor composite
assert not m.supports("aten._scaled_dot_product_flash_attention.default")
assert emit_manifest("PrivateUse1")[0].ops == m.ops
path = sys.argv[1]
open(path, "w").write(m.to_yaml(header))
assert load_manifest(path).ops == m.ops
print("ok", len(m.ops))
"""


@pytest.mark.slow
def test_emit_manifest_reads_an_out_of_tree_backends_kernels(tmp_path):
    """A renamed PrivateUse1 backend (what torch_npu does: device type ``npu``) with kernels
    registered in the dispatcher: ``--emit-manifest <device type>`` lists exactly those kernels
    (plus the composite ones), named after the device type, and the file loads as a manifest.
    In a subprocess: the rename and the registrations are process-wide."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _OUT_OF_TREE, str(tmp_path / "fakenpu.yaml")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stderr[-2000:]


def test_core_manifest_is_the_core_aten_opset():
    core, header = emit_manifest("core")
    assert "Core ATen" in core.description and "core" in header
    assert core.supports("aten.rsqrt.default") and not core.supports("aten.silu.default")
    npu = load_manifest("example-npu")
    assert set(npu.ops) <= set(core.ops) or torch.__version__ not in npu.source
