"""GPU check (prepared; run it where a GPU is lent): predicted vs measured memory and step time on
one GPU (targets for one H200: memory within 5 %, step time within 10 %).

    PYTHONPATH=src python benchmarks/gpu_validate.py [--steps 12] [--quick]

1. ``dayzero calibrate --nproc 1``: bf16/fp32 GEMMs by shape, HBM triad, attention, the CUDA
   context; the profile keeps the catalog peak (H200 989 TFLOP/s bf16 dense) and records the
   measured fractions.
2. Each layout below runs on one GPU through ``dayzero validate`` (bf16 compute, FSDP2 mixed
   precision, fp32 master weights): measured peak memory = PyTorch's peak reserved bytes + what
   the CUDA context holds; measured step time = median of the unprofiled steady steps.
3. Step time is judged two ways: the profile as measured, and leave-one-out (constants fitted on
   the other layouts); memory against the analytic model with the runtime's semantics
   (``runtime.planner_view.memory_options``, device cuda).

Writes ``$OUT/gpu_validate.json`` and ``$OUT/gpu_validate.md`` (``--out`` without $OUT). Exits 0
when it ran; the JSON says which targets were met. Skips cleanly (exit 0, a note) without CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# (name, model, shrink, parallel fields); one rank, so dp = 1; sequence and batch fill an H200 moderately
LAYOUTS = [
    ("llama8b-4L", "llama-3.1-8b", {"layers": 4}, dict(mbs=2, gbs=8, seq=4096, zero=1)),
    ("llama8b-8L-sel", "llama-3.1-8b", {"layers": 8}, dict(mbs=1, gbs=8, seq=4096, zero=1, recompute="selective")),
    ("llama8b-8L-full", "llama-3.1-8b", {"layers": 8}, dict(mbs=4, gbs=16, seq=4096, zero=1, recompute="full")),
    ("qwen3moe-4L", "qwen3-235b-a22b", {"layers": 4, "experts": 32}, dict(mbs=1, gbs=4, seq=4096, zero=1)),
]
QUICK = [("tiny", "tiny-llama", {}, dict(mbs=8, gbs=32, seq=512, zero=1))]
# --cpu-dry-run: the whole script on CPU in fp32 with three tiny layouts (enough for leave-one-out),
# so a GPU session spends its minutes measuring, not debugging; the numbers mean nothing
DRY = [("tiny-a", "tiny-llama", {}, dict(mbs=4, gbs=8, seq=128, zero=1)),
       ("tiny-b", "tiny-llama", {}, dict(mbs=2, gbs=8, seq=128, zero=1, recompute="full")),
       ("tiny-c", "tiny-llama", {"layers": 2}, dict(mbs=8, gbs=16, seq=128, zero=1))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--quick", action="store_true", help="one tiny layout (smoke test)")
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu_validate_out"))
    ap.add_argument("--cpu-dry-run", action="store_true",
                    help="run the script on CPU with tiny layouts (checks the script itself; numbers are meaningless)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch

    if not torch.cuda.is_available() and not a.cpu_dry_run:
        (out / "gpu_validate.json").write_text(json.dumps({"skipped": "no CUDA device"}) + "\n")
        print("gpu_validate: no CUDA device; skipped")
        return 0
    from dayzero.runtime.config import ModelSection
    from dayzero.specs.cluster import get_cluster
    from dayzero.specs.parallel import ParallelConfig
    from dayzero.validate.calibrate import calibrate
    from dayzero.validate.fit import errors, fit, observation_from_record, predict_steps, with_efficiency
    from dayzero.validate.run import ValidationRequest, validate

    t0 = time.time()
    profile = out / "gpu1.yaml"
    cal = calibrate(1, profile, quick=a.quick or a.cpu_dry_run)
    cluster = get_cluster(str(profile))
    device = "cpu (dry run)" if a.cpu_dry_run else torch.cuda.get_device_name(0)
    result = {"device": device, "torch": torch.__version__, "profile": str(profile),
              "calibrate_s": round(time.time() - t0, 1), "fits": cal["summary"]["fits"], "layouts": []}
    records = []
    for name, model, shrink, par in (DRY if a.cpu_dry_run else QUICK if a.quick else LAYOUTS):
        req = ValidationRequest(ModelSection(model, **shrink), ParallelConfig(**par), steps=a.steps,
                                compute_dtype="fp32" if a.cpu_dry_run else "bf16")
        t = time.time()
        try:
            res = validate(req, cluster, 1, step_tolerance=0.10)
        except Exception as e:  # noqa: BLE001 - one layout failing (e.g. out of memory) must not lose the others
            result["layouts"].append({"name": name, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"})
            continue
        m, p = res["measured"], res["prediction"]
        rec = dict(res["record"], label=name)
        records.append(rec)
        result["layouts"].append({
            "name": name, "layout": res["run"]["layout"], "proxy": res["run"]["proxy"], "wall_s": round(time.time() - t,
                                                                                                        1),
            "step_time_s": m["step_time_s"], "predicted_step_s": p["time"]["step_s"],
            "step_rel_error": (p["time"]["step_s"] - m["step_time_s"]) / m["step_time_s"],
            "peak_memory_bytes": m["peak_memory_bytes"], "predicted_memory_bytes": p["memory"]["peak_bytes"],
            "memory_rel_error": (p["memory"]["peak_bytes"] - m["peak_memory_bytes"]) / m["peak_memory_bytes"],
            "mfu": m["mfu"], "predicted_mfu": p["throughput"]["mfu"], "loss_pass": res["checks"][-1]["pass"],
            "checks": res["checks"]})
        (out / f"{name}.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
        print(f"{name}: step {m['step_time_s']:.3f} s (pred {p['time']['step_s']:.3f}), memory "
              f"{m['peak_memory_bytes'] / 2**30:.2f} GiB (pred {p['memory']['peak_bytes'] / 2**30:.2f})", flush=True)
    ok = [x for x in result["layouts"] if "error" not in x]
    if len(records) >= 3:  # leave-one-out calibrated step times
        obs = [observation_from_record(r) for r in records]
        loo = []
        for i in range(len(obs)):
            f = fit(obs[:i] + obs[i + 1:], cluster)
            loo.append(float(predict_steps([obs[i]], with_efficiency(cluster, f["fitted"]))[0]))
        for x, y in zip(ok, loo):
            x["predicted_step_loo_s"] = y
            x["step_rel_error_loo"] = (y - x["step_time_s"]) / x["step_time_s"]
        result["leave_one_out"] = errors(loo, [o.step_time_s for o in obs], [r["label"] for r in records])
    result["targets"] = {
        "memory_within_5pct": all(abs(x["memory_rel_error"]) <= 0.05 for x in ok) if ok else None,
        "step_within_10pct_uncalibrated": all(abs(x["step_rel_error"]) <= 0.10 for x in ok) if ok else None,
        "step_within_10pct_loo": (all(abs(x["step_rel_error_loo"]) <= 0.10 for x in ok)
                                  if ok and "step_rel_error_loo" in ok[0] else None)}
    result["wall_s"] = round(time.time() - t0, 1)
    (out / "gpu_validate.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    lines = [f"# GPU validation on {result['device']} (torch {result['torch']})", "",
             "| layout | proxy | step s | predicted | error | LOO error | peak GiB | predicted | error | MFU |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for x in result["layouts"]:
        if "error" in x:
            lines.append(f"| {x['name']} | failed: {x['error']} |")
            continue
        loo = f"{x['step_rel_error_loo']:+.1%}" if "step_rel_error_loo" in x else "—"
        lines.append(f"| {x['layout']} | {x['proxy']} | {x['step_time_s']:.3f} | {x['predicted_step_s']:.3f} | "
                     f"{x['step_rel_error']:+.1%} | {loo} | {x['peak_memory_bytes'] / 2**30:.2f} | "
                     f"{x['predicted_memory_bytes'] / 2**30:.2f} | {x['memory_rel_error']:+.1%} | {x['mfu']:.1%} |")
    lines += ["", f"targets: {json.dumps(result['targets'])}"]
    (out / "gpu_validate.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
