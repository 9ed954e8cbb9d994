"""GPU check for `dayzero ops` (prepared; not run in the development session, which had no GPU).

    PYTHONPATH=src python benchmarks/gpu_check_ops.py        # on a machine with a CUDA build of torch

The shipped cuda.yaml is generated on a CPU-only build from native_functions.yaml. On a CUDA build
this script asks the live dispatcher instead (`--emit-manifest CUDA --manifest-source dispatcher`)
and reports (1) how the two lists differ, (2) whether every operator traced for each model preset
is supported by the live CUDA kernels (coverage should be 100 %), and (3) re-runs the numerical
check of the decompositions of the `example-npu` gaps on the GPU. Writes gpu_check_ops.md to
$OUT (or benchmarks/). Exits 0 without doing anything when CUDA is not available.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 0
    from dayzero.ops.manifest import emit_manifest, load_manifest

    lines = [f"# dayzero ops GPU check: {torch.cuda.get_device_name(0)}, torch {torch.__version__}", ""]
    live, _ = emit_manifest("CUDA", source="dispatcher")
    shipped = load_manifest("cuda")
    only_live = sorted(set(live.ops) - set(shipped.ops))
    only_shipped = sorted(set(shipped.ops) - set(live.ops))
    lines += [f"- live CUDA dispatcher: {len(live.ops)} ops; shipped cuda.yaml ({shipped.source}): {len(shipped.ops)} "
              "ops",
              f"- only in the live dispatcher: {len(only_live)} (first: {', '.join(only_live[:15])})",
              f"- only in cuda.yaml: {len(only_shipped)} (first: {', '.join(only_shipped[:15])})", ""]
    try:
        import transformers  # noqa: F401
    except ImportError:
        lines.append("transformers not installed: skipped the per-model coverage check")
    else:
        from dayzero.ops.report import map_trace
        from dayzero.ops.trace import trace_model
        from dayzero.specs.registry import model_presets

        lines += ["| model | coverage on live CUDA kernels | unsupported |", "|---|---|---|"]
        for name in model_presets():
            trace = trace_model(name)
            report = map_trace(trace, live, check=False)
            lines.append(f"| {name} | {100 * report.coverage:.2f} % | "
                         f"{', '.join(r.op for r in report.unsupported) or '—'} |")
        lines.append("")
        # decompositions of the example-npu gaps, checked on the GPU
        from dayzero.ops import decompose as dec

        trace = trace_model("tiny-moe", seq=256)
        npu = load_manifest("example-npu")
        lines += ["| op (example-npu gap) | verified on CUDA | max abs err |", "|---|---|---|"]
        for (op, dts), example in sorted(trace.examples.items()):
            if npu.supports(op, dts):
                continue
            d = _decompose_on(dec, op, example, npu, "cuda")
            lines.append(f"| {op} {dts} | {d[0]} | {d[1]} |")
    text = "\n".join(lines) + "\n"
    out = Path(os.environ.get("OUT", ROOT / "benchmarks")) / "gpu_check_ops.md"
    out.write_text(text)
    print(text)
    return 0


def _decompose_on(dec, op: str, example: tuple, manifest, device: str):
    """Run the op and its lowering on random inputs on ``device``; (verified, max abs err)."""
    import torch

    func = dec._resolve(op)
    choice: dict = {}
    meta_args, meta_kwargs = dec._materialize(example, "meta", None, {})
    low = dec.Lowering(manifest.supports, choice)
    try:
        low.expand(func, meta_args, meta_kwargs)
        gen = torch.Generator().manual_seed(0)
        args, kwargs = dec._materialize(example, "cpu", gen, dec._shrink_map(example), 1)
        args, kwargs = dec.tree_map(lambda a: a.to(device) if isinstance(a, torch.Tensor) else a, (args, kwargs))
        ref = func(*dec.tree_map(lambda a: a.clone() if isinstance(a, torch.Tensor) else a, args), **kwargs)
        got = dec.Lowering(manifest.supports, choice).expand(func, args, kwargs)
    except Exception as e:  # report, do not stop the check
        return f"not checked ({type(e).__name__})", "—"
    pairs = [(r, g) for r, g in zip(dec.tree_flatten(ref)[0], dec.tree_flatten(got)[0])
             if isinstance(r, torch.Tensor) and r.is_floating_point()]
    err = max((float((r.double() - g.double()).abs().max()) for r, g in pairs if r.numel()), default=0.0)
    return "yes" if all(torch.allclose(r.double(), g.double(), rtol=2e-2, atol=1e-3, equal_nan=True)
                        for r, g in pairs) else "no", f"{err:.3g}"


if __name__ == "__main__":
    sys.exit(main())
