"""Regenerate the shipped operator manifests (src/dayzero/ops/manifests/*.yaml).

    PYTHONPATH=src python scripts/make_ops_manifests.py

cpu.yaml comes from the kernels registered in this process's dispatcher, cuda.yaml from the
installed torch's native_functions.yaml; example-npu.yaml is the Core ATen opset with the edits
below. Run after upgrading torch.
"""
import pathlib

from dayzero.ops.manifest import Manifest, emit_manifest

d=pathlib.Path("src/dayzero/ops/manifests")
for key in ["CPU","CUDA"]:
    m,h=emit_manifest(key)
    (d/f"{key.lower()}.yaml").write_text(m.to_yaml(h))
core,h=emit_manifest("core")
gemm=["aten.mm.default","aten.bmm.default","aten.addmm.default","aten.baddbmm.default"]
npu=Manifest(name="example-npu",
  description=("Example non-CUDA accelerator: a backend whose library implements PyTorch's Core ATen opset "
               "(plus PyTorch's backend-agnostic composite kernels), GEMMs in bf16/fp16/fp32 only, and the "
               "fused kernels Ascend's torch_npu exposes (npu_fusion_attention, npu_rms_norm, npu_rotary_mul, "
               "npu_swiglu). Illustrative: not the op list of a real product."),
  source=core.source + "; fused-kernel names from Ascend torch_npu / op-plugin docs (torch_npu.npu_rms_norm, "
                       "npu_rotary_mul, npu_swiglu, npu_fusion_attention)",
  ops=core.ops, dtypes={**{g:["bfloat16","float16","float32"] for g in gemm if g in core.ops},
                        "aten._grouped_mm.default": ["bfloat16","float16","float32","int32"]},
  fused=["attention","rms_norm","rotary_embedding","swiglu"])
hdr=("Example manifest for a non-CUDA accelerator (illustrative). Made with\n"
     "`dayzero ops --emit-manifest core --name example-npu`, then edited (scripts/make_ops_manifests.py):\n"
     "GEMM dtypes restricted to bf16/fp16/fp32 (+ int32 group offsets for grouped GEMM) and the fused\n"
     "kernels listed that torch_npu provides. Schema: docs/ops.md.")
(d/"example-npu.yaml").write_text(npu.to_yaml(hdr))
