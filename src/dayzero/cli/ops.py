"""``dayzero ops MODEL``: every ATen operator the model's real code runs, mapped to a backend."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from dayzero.cli.app import app
from dayzero.cli.common import JsonOpt, TrustRemoteCodeOpt, console, emit_json, human
from dayzero.cli.next_steps import Step, print_next, starter_devices
from dayzero.cli.render import FitTable, styled
from dayzero.errors import DayzeroError
from dayzero.ops.manifest import DEFAULT_MANIFEST, SHIPPED

# the dtype vocabulary of every verb (bf16 | fp16 | fp32) -> transformers' torch dtype names
TRACE_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@app.command("ops")
def ops_cmd(
    model: Annotated[Optional[str], typer.Argument(help="Preset name, config.json, or a directory (with its own "
                                                        "modeling_*.py: needs --trust-remote-code).")] = None,
    manifest: Annotated[str, typer.Option("--manifest", "-m", help=f"Backend manifest: {', '.join(SHIPPED)}, or a "
                                                                   "YAML file.")] = DEFAULT_MANIFEST,
    seq: Annotated[Optional[int], typer.Option("--seq", "--seq-length", help="Sequence length traced (default: "
                                                                             "min(max positions, 4096)).")] = None,
    batch: Annotated[int, typer.Option("--batch", help="Micro-batch size traced.")] = 1,
    compute_dtype: Annotated[str, typer.Option("--compute-dtype", help="Dtype the model is traced in: bf16 | fp16 | "
                                                                       "fp32.")] = "bf16",
    experts_impl: Annotated[str, typer.Option("--experts-impl", help="transformers' MoE experts implementation: "
                                                                     "grouped_mm | eager | "
                                                                     "batched_mm.")] = "grouped_mm",
    trust_remote_code: TrustRemoteCodeOpt = False,
    check: Annotated[bool, typer.Option("--check/--no-check", help="Check decompositions numerically on random CPU "
                                                                   "inputs.")] = True,
    top: Annotated[int, typer.Option("--top", help="Rows in the operator table (0: all).")] = 25,
    emit_manifest: Annotated[Optional[str], typer.Option("--emit-manifest", help="Print a manifest for a dispatch key "
                                                                                 "or device type (CPU, CUDA, "
                                                                                 "PrivateUse1 or the device type an "
                                                                                 "installed extension registers; "
                                                                                 "'core' = Core ATen opset) and "
                                                                                 "exit.")] = None,
    manifest_source: Annotated[str, typer.Option("--manifest-source", help="With --emit-manifest: auto | dispatcher | "
                                                                           "native_functions.")] = "auto",
    name: Annotated[Optional[str], typer.Option("--name", help="With --emit-manifest: the manifest's name.")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="With --emit-manifest: write to this file instead "
                                                                    "of stdout.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Trace one training step of MODEL's real modeling code (transformers, meta tensors, one layer
    per kind, scaled to full depth), map every ATen operator to a backend manifest, decompose the
    missing ones (checked numerically) and list fusion opportunities.

    Example: [bold]dayzero ops deepseek-v3 --manifest example-npu[/bold];
    [bold]dayzero ops ./my-model/ --trust-remote-code --json[/bold];
    [bold]dayzero ops --emit-manifest CUDA -o runs/manifests/cuda.yaml[/bold]
    """
    from dayzero.outputs import prepare_output

    if out:
        prepare_output(out, "--out")
    _require("torch", *(() if emit_manifest else ("transformers",)))
    if emit_manifest:
        _emit_manifest(emit_manifest, manifest_source, name, out)
        return
    if not model:
        raise DayzeroError("give a MODEL (preset, config.json or directory), or --emit-manifest KEY")
    from dayzero.ops.report import analyze

    dtype = TRACE_DTYPES.get(compute_dtype)
    if dtype is None:
        raise DayzeroError(f"--compute-dtype {compute_dtype!r}: expected one of {', '.join(TRACE_DTYPES)}")
    report = analyze(model, manifest=manifest, seq=seq, batch=batch, dtype=dtype, experts=experts_impl,
                     trust_remote_code=trust_remote_code, check=check)
    obj = report.to_dict()
    from dayzero.ops.npu_ops import fused_replacements

    # MindSpeed's flags for the fused kernels the model has, where the manifest holds torch_npu's operator
    swaps = fused_replacements(obj, manifest)
    if swaps:
        obj["mindspeed_fused"] = [{"kernel": r.kernel, "npu_op": r.npu_op, "flag": r.flag, "source": r.source}
                                  for r in swaps]
    if json_out:
        emit_json(obj)
        return
    _print(obj, top)
    for r in swaps:
        console.print(f"MindSpeed: {r.flag} runs {r.kernel} as {r.npu_op} ({r.source})", highlight=False)
    steps = []
    if top > 0 and len(obj["ops"]) > top:
        again = ["dayzero", "ops", model, "--manifest", manifest, "--top", "0"]
        for flag, v, default in (("--seq", seq, None), ("--batch", batch, 1), ("--compute-dtype", compute_dtype,
                                                                               "bf16"),
                                 ("--experts-impl", experts_impl, "grouped_mm")):
            if v != default:
                again += [flag, v]
        steps.append(Step.of(*again, *(["--trust-remote-code"] if trust_remote_code else []), why="every operator"))
    print_next(console, steps + [_plan_step(model)])


def _plan_step(model: str) -> Step:
    """Plan the model on enough H100s to hold it (cli.next_steps.starter_devices)."""
    from dayzero.specs.hardware import get_accelerator
    from dayzero.specs.registry import load_model

    n = starter_devices(load_model(model), get_accelerator("h100"))
    return Step.of("dayzero", "plan", model, "--accelerator", "h100", "--devices", n,
                   why="every layout, on enough H100s to hold it")


def _emit_manifest(key: str, source: str, name: str | None, out: Path | None) -> None:
    """--emit-manifest: the manifest of a dispatch key or device type (ops.manifest.emit_manifest), to
    --out (with the next step: the Day-0 model against it) or stdout."""
    from dayzero.ops.manifest import emit_manifest as emit

    m, header = emit(key, source=source, name=name)
    text = m.to_yaml(header)
    if not out:
        typer.echo(text, nl=False)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    console.print(f"wrote {out} ({len(m.ops)} operators, fused: {', '.join(m.fused) or 'none'})")
    from dayzero.cli.plan import DEFAULT_MODEL

    print_next(console, [Step.of("dayzero", "ops", DEFAULT_MODEL, "--manifest", out,
                                 why="the Day-0 model's operators against this manifest")])


def _require(*modules: str) -> None:
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise DayzeroError(f"dayzero ops needs {' and '.join(missing)}; install them: pip install 'dayzero[ops]'")


def _short(op: str) -> str:
    """aten.mm.default -> mm; aten.add.Tensor -> add.Tensor (the JSON keeps full names)."""
    ns, name, overload = op.split(".")
    base = name if overload == "default" else f"{name}.{overload}"
    return base if ns == "aten" else f"{ns}.{base}"


_DT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64", "int64": "i64",
       "int32": "i32", "bool": "bool", "uint8": "u8", "int8": "i8"}


def _dts(names: list[str]) -> str:
    return ", ".join(_DT.get(n, n) for n in names)


def _ops_list(ops: list[str], limit: int = 4) -> str:
    short = [_short(o) for o in ops]
    return ", ".join(short[:limit]) + (f" +{len(short) - limit}" if len(short) > limit else "")


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _print(r: dict, top: int) -> None:
    t = FitTable(title=f"{r['model']} ({r['model_type']}) on {r['manifest']}", show_header=False)
    t.add_column("quantity", wrap=False)
    t.add_column("value")
    kinds = "; ".join(f"{k['name']} x{k['count']} (layers {k['layers']})" for k in r["layer_kinds"])
    experts = f", experts: {r['experts']}" if r["experts"] else ""
    t.add_row("traced step", f"batch {r['batch']} x seq {r['seq']}, {r['dtype']}, forward + backward{experts}")
    t.add_row("layer kinds", kinds)
    t.add_row("operator calls / step", f"{r['calls']:,} ({len(r['ops'])} distinct overloads)")
    t.add_row("FLOPs / token (traced)", human(r["flops_per_token"], "FLOP"))
    fc = r["flops_check"]
    if fc:
        note = (" (sliding windows: inspect counts the window, eager attention computes s x s)"
                if fc["sliding_window"] else "")
        t.add_row("  vs dayzero "
                  "inspect", f"{human(fc['inspect_per_token'], 'FLOP')}, {100 * fc['rel_diff']:+.2f} %{note}")
    t.add_row("coverage by calls", _pct(r["coverage"]))
    t.add_row("coverage by FLOPs", _pct(r["coverage_flops"]))
    t.add_row("memory traffic / step", human(r["bytes"], "B"))
    for n in r["notes"]:
        t.add_row("note", n)
    console.print(t)

    ot = FitTable(title="Operators (by FLOPs, then bytes)")
    ot.add_column("op", wrap=False)
    for col in ("calls", "FLOPs", "bytes", "dtypes", "where", "backend"):
        ot.add_column(col, num=col in ("calls", "FLOPs", "bytes"))
    rows = r["ops"] if top <= 0 else r["ops"][:top]
    for o in rows:
        where = ", ".join(list(o["categories"])[:2])
        decomposes = o["decomposition"] and o["decomposition"]["complete"]
        ok = (styled("yes", "green") if o["supported"] else
              styled("decomposes", "yellow") if decomposes else styled("no", "red"))
        ot.add_row(_short(o["op"]), f"{o['count']:,}", human(o["flops"]) if o["flops"] else "·",
                   human(o["bytes"], "B") if o["bytes"] else "·",
                   _dts(o["dtypes"]), where, ok)
    if top > 0 and len(r["ops"]) > top:
        ot.caption = f"{len(r['ops']) - top} more (--top 0 shows all)"
    console.print(ot)

    if r["unsupported"]:
        ut = FitTable(title=f"Unsupported on {r['manifest']}")
        ut.add_column("op", wrap=False)
        for col in ("calls", "FLOPs/bytes %", "decomposition", "checked"):
            ut.add_column(col, num=col in ("calls", "FLOPs/bytes %"))
        for u in r["unsupported"]:
            d = u["decomposition"] or {}
            why = "" if u["reason"] == "not in manifest" else f"{u['reason']}; "
            if u["needs_kernel"]:
                missing = [m for m in d.get("missing", []) if m != u["op"]]
                dec = (Text(why) + styled("needs a kernel", "red")
                       + (f" (missing {_ops_list(missing)})" if missing else ""))
            else:
                dec = Text(why + _ops_list(d["ops"]))
            chk = {True: styled("ok", "green"), False: styled("mismatch", "red"), None: "—"}[d.get("verified")]
            share = f"{100 * u['flops_share']:.1f}/{100 * u['bytes_share']:.1f}"
            ut.add_row(_short(u["op"]), f"{u['unsupported_count']:,}", share, dec, chk)
        console.print(ut)
    else:
        console.print(f"[green]Every operator is supported by {r['manifest']}.[/green]")

    if r["fusions"]:
        ft = FitTable(title="Fusion opportunities (forward, per step)")
        for col in ("pattern", "where", "kernels", "x", "launches saved", "traffic saved", "provided by"):
            ft.add_column(col, num=col in ("kernels", "x", "launches saved", "traffic saved"))
        for f in r["fusions"][: max(top, 1) if top > 0 else None]:
            ft.add_row(f["pattern"], f"{f['where']} / {f['category']}", str(f["kernels"]), f"{f['occurrences']:,}",
                       f"{f['launches_saved']:,}", human(f["bytes_saved"], "B"),
                       styled(f["provided_by"], "green") if f["provided"] else styled("not in manifest", "yellow"))
        console.print(ft)
