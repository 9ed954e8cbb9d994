"""``dayzero ckpt list|verify|gc|export|import``: inspect, check and convert checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dayzero.cli.app import app
from dayzero.cli.common import JsonOpt, console, emit_json, human
from dayzero.cli.next_steps import Step, print_next
from dayzero.cli.render import FitTable, pass_fail
from dayzero.runtime.checkpoint.manifest import DEFAULT_CHECKSUM
from dayzero.specs.model import SHRINK_KEYS

ckpt_app = typer.Typer(help="Checkpoints: list versions, verify checksums, export/import Hugging Face safetensors.",
                       no_args_is_help=True)
app.add_typer(ckpt_app, name="ckpt")


@ckpt_app.command("list")
def list_cmd(
    root: Annotated[Path, typer.Argument(help="Checkpoint directory (--ckpt-dir of a run) or one version.")],
    json_out: JsonOpt = False,
) -> None:
    """List checkpoint versions in write order: sequence number, step, state (complete/incomplete/partial),
    lineage (the run or branch that wrote it), size, layout, creation time.

    Example: [bold]dayzero ckpt list runs/llama/ckpt[/bold]
    """
    from dayzero.runtime.checkpoint.inventory import list_checkpoints

    rows = list_checkpoints(root)
    if json_out:
        emit_json({"root": str(root), "versions": rows})
        return
    t = FitTable(title=f"Checkpoints in {root}")
    for c in ("seq", "step", "state", "lineage", "size", "world", "layout", "created", "path"):
        t.add_column(c, num=c in ("seq", "step", "size", "world"))
    for r in rows:
        lay = r.get("layout") or {}
        desc = " ".join(f"{k}{lay[k]}" for k in ("tp", "pp", "dp", "cp", "ep") if k in lay and lay[k] != 1) or "-"
        t.add_row(str(r["seq"] if r["seq"] is not None else "-"), str(r["step"]),
                  r["state"] + (" (!)" if r.get("problem") else ""), r["lineage"] or "-",
                  human(r["bytes"], "B") if r["bytes"] is not None else "-", str(r["world"] or "-"), desc,
                  (r["created"] or "-").replace("T", " "), Path(r["path"]).name)
    console.print(t)
    print_next(console, _after_list(root, rows))


@ckpt_app.command("verify", help=f"""Check versions against their manifests: COMPLETE marker, file sizes, the checksum
    of every file (the algorithm each manifest names: {DEFAULT_CHECKSUM} unless the run chose another), safe paths.
    Exits 1 when any version fails.

    Example: [bold]dayzero ckpt verify runs/llama/ckpt/step-00001000[/bold]
    """)
def verify_cmd(
    path: Annotated[Path, typer.Argument(help="Checkpoint directory (all versions) or one version directory.")],
    checksums: Annotated[bool, typer.Option("--checksums/--sizes-only", help="Hash every file (default) or only "
                                                                             "compare sizes.")] = True,
    json_out: JsonOpt = False,
) -> None:
    from dayzero.runtime.checkpoint.inventory import verify_checkpoints

    rows = verify_checkpoints(path, checksums)
    if json_out:
        emit_json({"path": str(path), "versions": rows, "ok": all(r["ok"] for r in rows)})
    else:
        t = FitTable(title=f"Verify {path}")
        for c in ("step", "ok", "problems", "path"):
            t.add_column(c, num=c == "step")
        for r in rows:
            mark = "skipped" if r.get("skipped") else pass_fail(r["ok"], "ok", "FAIL")
            t.add_row(str(r["step"]), mark, r.get("skipped") or "; ".join(r["problems"]) or "-", Path(r["path"]).name)
        console.print(t)
        print_next(console, _after_verify(path, rows))
    if not all(r["ok"] for r in rows):
        raise typer.Exit(1)


@ckpt_app.command("gc")
def gc_cmd(
    path: Annotated[Path, typer.Argument(help="Checkpoint directory (a --ckpt-dir).")],
    json_out: JsonOpt = False,
) -> None:
    """Remove what interrupted saves and deletions left: step-N.partial and step-N.deleting directories. Takes the
    directory's lock first, so it refuses while a job writes there (a job's own start removes them too).

    Example: [bold]dayzero ckpt gc runs/llama/ckpt[/bold]
    """
    from dayzero.runtime.checkpoint.inventory import collect_garbage

    removed = collect_garbage(path)
    if json_out:
        emit_json({"path": str(path), "removed": removed, "bytes": sum(r["bytes"] for r in removed)})
        return
    for r in removed:
        console.print(f"removed {r['path']} ({human(r['bytes'], 'B')})", highlight=False)
    console.print(f"{len(removed)} abandoned director{'y' if len(removed) == 1 else 'ies'} removed from {path}, "
                  f"{human(sum(r['bytes'] for r in removed), 'B')} freed", highlight=False)


@ckpt_app.command("export")
def export_cmd(
    version: Annotated[Path, typer.Argument(help="One checkpoint version directory (step-NNNNNNNN).")],
    out: Annotated[Path, typer.Argument(help="Output directory for model*.safetensors.")],
    dtype: Annotated[Optional[str], typer.Option("--weights-dtype", help="Cast weights: fp32 | bf16 | fp16 (default: "
                                                                         "as saved).")] = None,
    shard_gb: Annotated[float, typer.Option("--shard-gb", help="Maximum size of one output file, GiB.")] = 5.0,
    names: Annotated[str, typer.Option("--names", help="hf: Hugging Face tensor names (+ config.json) when the model "
                                                       "family is mapped | native: dayzero's names.")] = "hf",
    json_out: JsonOpt = False,
) -> None:
    """Export the model weights of a checkpoint (any layout) as consolidated Hugging Face safetensors,
    readable by transformers and by [bold]dayzero train --hf-weights[/bold].

    Example: [bold]dayzero ckpt export runs/llama/ckpt/step-00001000 runs/llama/hf --weights-dtype bf16[/bold]
    """
    from dayzero.runtime.checkpoint.interchange import export_hf
    from dayzero.runtime.checkpoint.manifest import CheckpointError

    if shard_gb <= 0:
        raise CheckpointError(f"--shard-gb {shard_gb}: must be > 0")
    res = export_hf(version, out, dtype=dtype, max_shard_bytes=int(shard_gb * 2**30), names=names)
    obj = {"out": str(res.out_dir), "files": list(res.files), "tensors": res.tensors, "bytes": res.bytes,
           "step": res.step, "names": res.names}
    if json_out:
        emit_json(obj)
    else:
        console.print(f"exported step {res.step}: {res.tensors} tensors ({res.names} names), {human(res.bytes, 'B')} "
                      f"in {len(res.files)} file(s) under {res.out_dir}")
        print_next(console, _after_export(version, res))


@ckpt_app.command("import")
def import_cmd(
    hf_dir: Annotated[Path, typer.Argument(help="Directory holding model*.safetensors (Hugging Face layout).")],
    root: Annotated[Path, typer.Argument(help="Checkpoint directory to write the version into (--ckpt-dir).")],
    step: Annotated[int, typer.Option("--step", min=0, help="Step number of the new version.")] = 0,
    dtype: Annotated[Optional[str], typer.Option("--weights-dtype", help="Cast weights: fp32 | bf16 | fp16 (default: "
                                                                         "fp32 with a model, else as stored).")] = None,
    model: Annotated[Optional[str], typer.Option("--model", help="Map HF names to this model's (preset or "
                                                                 "config.json; default: HF_DIR/config.json if "
                                                                 "present).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Import even if ROOT holds this step: the version named "
                                                        "step-N is moved to a backup (named in the output) "
                                                        "first.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Import Hugging Face safetensors as a model-only checkpoint version: [bold]dayzero train MODEL
    --ckpt-dir ROOT[/bold] resumes from it at any layout with a fresh optimizer. Pickle files (.bin)
    are refused. Never replaces a version (a step already there is refused unless --force) and
    never deletes one; takes ROOT's lock like a training job.

    Example: [bold]dayzero ckpt import ./Llama-3.1-8B runs/llama/ckpt[/bold]
    """
    from dayzero.runtime.checkpoint.interchange import import_hf

    events: list[dict] = []
    path = import_hf(hf_dir, root, step=step, dtype=dtype, model=model, force=force, on_event=events.append)
    backup = next((e["backup"] for e in events if e["event"] == "checkpoint_backup"), None)
    if json_out:
        emit_json({"path": str(path), "step": step, "backup": backup})
    else:
        console.print(f"imported {hf_dir} as {path}", highlight=False, soft_wrap=True)  # paths stay whole
        if backup:
            console.print(f"the version it replaces was moved to {backup}", highlight=False, soft_wrap=True)
        print_next(console, _after_import(path, root))


# -- the next command after each (built from the checkpoints just read) ---------------------------


def _model_args(model: dict | None) -> list[str] | None:
    """``MODEL [--layers N ...]`` of the run that wrote a checkpoint (its recorded recipe), or a
    preset's name; None when the manifest does not say."""
    from dayzero.specs.registry import model_presets

    model = model or {}
    recipe = model.get("recipe") or {}
    if recipe.get("model"):
        shrink = [w for k in SHRINK_KEYS if recipe.get(k) is not None
                  for w in (f"--{k}", str(recipe[k]))]
        return [recipe["model"], *shrink]
    return [model["name"]] if model.get("name") in model_presets() else None


def _export_step(version: str, root: Path) -> Step:
    return Step.of("dayzero", "ckpt", "export", version, f"{str(root).rstrip('/')}-hf",
                   why="its weights as Hugging Face safetensors")


def _after_list(root: Path, rows: list[dict]) -> list[Step]:
    good = [r for r in rows if r["state"] == "complete" and not r.get("problem")]
    if not good:
        return [Step.of("dayzero", "ckpt", "verify", root, why="what is wrong with each version")]
    steps = [_export_step(good[-1]["path"], root)]
    model = _model_args(good[-1].get("model"))
    if model:
        steps.append(Step.of("dayzero", "train", *model, "--ckpt-dir", root, why="resume from the newest good one"))
    return steps


def _after_verify(path: Path, rows: list[dict]) -> list[Step]:
    versions = [r for r in rows if not r.get("skipped")]
    ok = [r for r in versions if r["ok"]]
    if len(ok) < len(versions):
        return [Step.of("dayzero", "ckpt", "list", path, why="every version's state; resume skips the failed ones")]
    if not ok:
        return [Step.of("dayzero", "ckpt", "gc", path, why="remove what interrupted saves left")]
    newest = max(ok, key=lambda r: r["step"])
    return [_export_step(newest["path"], Path(newest["path"]).parent)]


def _after_export(version: Path, res) -> list[Step]:
    from dayzero.runtime.checkpoint.manifest import read_manifest

    model = _model_args(read_manifest(version).model.model_dump())
    if res.names == "hf" and model:
        return [Step.of("dayzero", "train", *model, "--hf-weights", res.out_dir, why="train on from these weights")]
    return [Step.of("dayzero", "ckpt", "import", res.out_dir, f"{str(res.out_dir).rstrip('/')}-ckpt",
                    why="back into a checkpoint any layout resumes from")]


def _after_import(version: Path, root: Path) -> list[Step]:
    from dayzero.runtime.checkpoint.manifest import read_manifest

    model = _model_args(read_manifest(version).model.model_dump())
    if model:
        return [Step.of("dayzero", "train", *model, "--ckpt-dir", root, why="resume from it at any layout")]
    return [Step.of("dayzero", "ckpt", "list", root, why="the version just written")]
