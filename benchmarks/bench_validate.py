"""Predicted vs measured step time of many layouts on 8 gloo ranks, with a calibrated profile.

    PYTHONPATH=src python benchmarks/bench_validate.py [--profile FILE] [--repeats 2] [--steps 10]
                                                        [--layouts A,B,...] [--out DIR]

1. ``dayzero calibrate --nproc 8`` measures this machine (skipped with --profile).
2. Every layout below runs ``repeats`` times on 8 ranks (``dayzero.validate.run.validate``, the
   same code as ``dayzero validate``), round-robin so that machine load hits all layouts alike;
   a layout's measured step time is the median over its repeats.
3. Predictions three ways: the profile as measured (no fit); **leave-one-out**: each layout
   predicted with constants fitted on the other layouts only (the honest out-of-sample figure);
   in-sample: fitted on all layouts (what ``dayzero validate --calibrate`` stores).
4. Targets: median |relative error| <= 20 %, Spearman >= 0.8, and the layout the
   planner ranks first is among the two fastest measured.

Writes ``<out>/bench_validate.json``, the runs, the calibrated profile, and the Markdown tables
to ``benchmarks/RESULTS_validate.md`` (``$OUT`` is used for ``--out`` when set).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PROXY = str(ROOT / "benchmarks" / "validate" / "proxy-moe.json")

# name -> ParallelConfig fields; gbs 16 sequences of 256 tokens for all, so every layout does the same work
LAYOUTS = {
    "A": dict(dp=8, mbs=2, zero=1),
    "B": dict(dp=8, mbs=2, zero=3),
    "C": dict(tp=2, dp=4, mbs=2, zero=1),
    "D": dict(tp=4, dp=2, mbs=2, zero=2),
    "E": dict(tp=2, pp=2, dp=2, mbs=1, zero=1),
    "F": dict(pp=2, dp=4, mbs=1, zero=1, recompute="full"),
    "G": dict(dp=8, ep=8, mbs=2, zero=1),
    "H": dict(tp=2, dp=4, ep=4, mbs=2, zero=1),
    "I": dict(pp=4, dp=2, mbs=1, zero=0),
    "J": dict(dp=8, ep=4, mbs=2, zero=2, recompute="selective"),
    "K": dict(tp=2, pp=2, dp=2, ep=2, mbs=1, zero=1),
}
GBS, SEQ, NPROC = 16, 256, 8


def load_avg() -> float:
    return os.getloadavg()[0]


def wait_for_quiet(max_load: float, max_wait_s: float) -> float:
    """Sleep until the 1-minute load average is below ``max_load`` (other jobs share the cores),
    at most ``max_wait_s``; returns the load when starting."""
    t = time.time()
    while load_avg() > max_load and time.time() - t < max_wait_s:
        time.sleep(15)
    return load_avg()


def main() -> None:
    from dayzero.runtime.config import ModelSection
    from dayzero.specs.cluster import get_cluster
    from dayzero.specs.parallel import ParallelConfig
    from dayzero.validate.calibrate import calibrate
    from dayzero.validate.run import ValidationRequest, validate

    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default=None, help="use this profile instead of calibrating")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "validate" / "results"))
    ap.add_argument("--results-md", default=str(ROOT / "benchmarks" / "RESULTS_validate.md"))
    ap.add_argument("--max-load", type=float, default=3.0, help="wait for the load average to drop below this")
    ap.add_argument("--max-wait", type=float, default=600, help="seconds to wait for a quiet machine per run")
    ap.add_argument("--analyse", action="store_true", help="only re-analyse the runs already in --out")
    a = ap.parse_args()
    out = Path(a.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    names = [n.strip() for n in a.layouts.split(",") if n.strip()]
    if a.analyse:
        reanalyse(out, names, a.profile or str(out / "host8.yaml"), a.results_md)
        return
    meta = {"date": dt.datetime.now().isoformat(timespec="seconds"), "host": platform.node(), "cores": os.cpu_count(),
            "python": sys.version.split()[0], "load_start": load_avg()}
    import torch

    meta["torch"] = torch.__version__
    if a.profile:
        profile = a.profile
    else:
        wait_for_quiet(a.max_load, a.max_wait)
        t = time.time()
        profile = str(out / "host8.yaml")
        calibrate(NPROC, profile)
        meta["calibrate_s"] = round(time.time() - t, 1)
    meta["profile"] = profile
    cluster = get_cluster(profile)
    requests = {n: ValidationRequest(ModelSection(PROXY), ParallelConfig(**LAYOUTS[n], gbs=GBS, seq=SEQ), steps=a.steps,
                                     compute_dtype="fp32") for n in names}
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(a.repeats):
        for n in names:
            done = out / "runs" / f"{n}_r{r}.json"
            if done.exists():  # resume an interrupted invocation
                runs[n].append(json.loads(done.read_text()))
                continue
            res = None
            for attempt in range(2):  # a rank killed by the shared machine (OOM) gets one retry
                load0 = wait_for_quiet(a.max_load, a.max_wait)
                t = time.time()
                try:
                    res = validate(requests[n], cluster, NPROC)
                    break
                except Exception as e:  # noqa: BLE001
                    print(f"{n} r{r} attempt {attempt} failed: {str(e).splitlines()[0][:200]}", flush=True)
            if res is None:
                continue
            res["bench"] = {"layout": n, "repeat": r, "load_before": load0, "load_after": load_avg(),
                            "wall_s": round(time.time() - t, 1)}
            (out / "runs" / f"{n}_r{r}.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
            runs[n].append(res)
            print(f"{n} r{r} {requests[n].parallel.describe():40s} measured {res['measured']['step_time_s']:.3f} s "
                  f"predicted {res['prediction']['time']['step_s']:.3f} s load {load0:.1f}", flush=True)
    meta["load_end"] = load_avg()
    summary = analyse(names, requests, runs, cluster, profile, out)
    summary["meta"] = meta
    (out / "bench_validate.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    Path(a.results_md).write_text(markdown(summary))
    print(markdown(summary))


def reanalyse(out: Path, names, profile: str, results_md: str) -> None:
    """The summary again from the run files of an earlier invocation."""
    from dayzero.runtime.config import ModelSection
    from dayzero.specs.cluster import get_cluster
    from dayzero.specs.parallel import ParallelConfig
    from dayzero.validate.run import ValidationRequest

    old = json.loads((out / "bench_validate.json").read_text()) if (out / "bench_validate.json").exists() else {}
    runs = {n: [json.loads(f.read_text()) for f in sorted((out / "runs").glob(f"{n}_r*.json"))] for n in names}
    steps = next((r[0]["run"]["steps"] for r in runs.values() if r), 10)
    requests = {n: ValidationRequest(ModelSection(PROXY), ParallelConfig(**LAYOUTS[n], gbs=GBS, seq=SEQ), steps=steps,
                                     compute_dtype="fp32") for n in names}
    summary = analyse([n for n in names if runs[n]], requests, runs, get_cluster(profile), profile, out)
    summary["meta"] = old.get("meta", {"profile": profile})
    (out / "bench_validate.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    Path(results_md).write_text(markdown(summary))
    print(markdown(summary))


def analyse(names, requests, runs, cluster, profile, out) -> dict:
    from dayzero.validate.calibration_store import calibrate_profile
    from dayzero.validate.fit import errors, fit, observation_from_record, predict_steps, with_efficiency

    names = [n for n in names if runs[n]]
    records = []
    for n in names:
        rec = dict(runs[n][0]["record"])
        rec["label"] = n
        rec["step_time_s"] = float(statistics.median(x["measured"]["step_time_s"] for x in runs[n]))
        records.append(rec)
    obs = [observation_from_record(r) for r in records]
    measured = np.array([o.step_time_s for o in obs])
    raw = predict_steps(obs, cluster)
    loo = np.zeros(len(obs))
    loo_fits = {}
    for i in range(len(obs)):
        others = obs[:i] + obs[i + 1:]
        f = fit(others, cluster)
        loo_fits[names[i]] = f["fitted"]
        loo[i] = predict_steps([obs[i]], with_efficiency(cluster, f["fitted"]))[0]
    full = fit(obs, cluster)
    insample = predict_steps(obs, with_efficiency(cluster, full["fitted"]))
    calibrated = calibrate_profile(profile, records, out=str(out / "host8-calibrated.yaml"))

    def verdict(pred) -> dict:
        e = errors(pred, measured, names)
        first = names[int(np.argmin(pred))]
        two_fastest = [names[i] for i in np.argsort(measured)[:2]]
        e.update(planner_first=first, two_fastest_measured=two_fastest, first_in_two_fastest=first in two_fastest,
                 targets_met=bool(e["median_abs_rel_error"] <= 0.20 and (e["spearman"] or 0) >= 0.8
                                  and first in two_fastest))
        return e

    table = []
    for i, n in enumerate(names):
        r0 = runs[n][0]
        table.append({"layout": n, "parallel": requests[n].parallel.describe(),
                      "measured_s": [x["measured"]["step_time_s"] for x in runs[n]], "measured_median_s": measured[i],
                      "predicted_raw_s": raw[i], "predicted_loo_s": loo[i], "predicted_fit_s": insample[i],
                      "comm_ratio_measured": statistics.median(x["measured"]["comm_ratio"] for x in runs[n]),
                      "comm_ratio_predicted": r0["prediction"]["comm_ratio"],
                      "peak_mem_measured": max(x["measured"]["peak_memory_bytes"] for x in runs[n]),
                      "peak_mem_predicted": r0["prediction"]["memory"]["peak_bytes"],
                      "loss_pass": all(x["checks"][-1]["pass"] for x in runs[n]),
                      "load": [x["bench"]["load_before"] for x in runs[n]]})
    return {"layouts": table, "raw": verdict(raw), "leave_one_out": verdict(loo), "in_sample": verdict(insample),
            "fitted_all": full["fitted"], "fitted_loo": loo_fits, "calibrated_profile": calibrated["profile"]}


def markdown(s: dict) -> str:
    m = s.get("meta", {})
    lines = ["# Validation benchmark: predicted vs measured step time", "",
             f"Date {m.get('date')}; machine: {m.get('cores')}-core CPU (shared with other jobs), 24 GiB, torch "
             f"{m.get('torch')}, 8 gloo ranks, one thread each; load average {m.get('load_start', 0):.1f} at start, "
             f"{m.get('load_end', 0):.1f} at end. Proxy: benchmarks/validate/proxy-moe.json (Mixtral architecture, "
             "width 256, 4 layers, 8 experts top-2), gbs 16 x 256 tokens, fp32. Reproduce: "
             "`PYTHONPATH=src python benchmarks/bench_validate.py`.", "",
             "| layout | parallel | measured s (repeats) | predicted, no fit | leave-one-out | in-sample | comm ratio "
             "meas./pred. | peak MiB meas./pred. | loss ↓ |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in s["layouts"]:
        meas = ", ".join(f"{x:.2f}" for x in r["measured_s"])
        lines.append(f"| {r['layout']} | {r['parallel']} | {r['measured_median_s']:.2f} ({meas}) | "
                     f"{r['predicted_raw_s']:.2f} | {r['predicted_loo_s']:.2f} | {r['predicted_fit_s']:.2f} | "
                     f"{r['comm_ratio_measured']:.0%} / {r['comm_ratio_predicted']:.0%} | "
                     f"{r['peak_mem_measured'] / 2**20:,.0f} / {r['peak_mem_predicted'] / 2**20:,.0f} | "
                     f"{'yes' if r['loss_pass'] else 'NO'} |")
    lines += ["", "| predictions | median abs error | MAPE | Spearman | planner's first | two fastest measured | "
                  "targets met |",
              "|---|---|---|---|---|---|---|"]
    for key, label in (("raw", "profile as measured"), ("leave_one_out", "calibrated, leave-one-out"),
                       ("in_sample", "calibrated on all")):
        v = s[key]
        sp = "—" if v["spearman"] is None else f"{v['spearman']:.2f}"
        lines.append(f"| {label} | {v['median_abs_rel_error']:.1%} | {v['mape']:.1%} | {sp} | {v['planner_first']} | "
                     f"{', '.join(v['two_fastest_measured'])} | {'yes' if v['targets_met'] else 'no'} |")
    lines += ["", "Fitted on all layouts: " + ", ".join(f"{k} = {v:.4g}" for k, v in s["fitted_all"].items()),
              f"(stored in {s['calibrated_profile']})."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
