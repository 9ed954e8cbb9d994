"""``dayzero models``: the built-in model presets."""

from __future__ import annotations

from rich.table import Table

from dayzero.cli.app import app
from dayzero.cli.common import JsonOpt, console, emit_json, human


@app.command("models")
def models_cmd(json_out: JsonOpt = False) -> None:
    """List built-in model presets with their size.

    Example: [bold]dayzero models --json[/bold]
    """
    from dayzero.specs.counting import params_active, params_total
    from dayzero.specs.registry import load_model, model_presets

    rows = []
    for name, cfg in model_presets().items():
        spec = load_model(name)
        meta = cfg.get("_dayzero", {})
        rows.append({"name": name, "model_type": spec.model_type, "params_total": params_total(spec),
                     "params_active": params_active(spec), "layers": spec.layers, "hidden": spec.hidden,
                     "moe": spec.is_moe, "description": meta.get("description", ""), "source": meta.get("source", "")})
    if json_out:
        emit_json({"models": rows})
        return
    t = Table(title="Model presets (also: any HF config.json or directory holding one)")
    for col in ("name", "type", "params", "active", "layers", "hidden", "description"):
        t.add_column(col, justify="right" if col in ("params", "active", "layers", "hidden") else "left",
                     no_wrap=col != "description", overflow="ellipsis" if col == "description" else "fold")
    for r in rows:
        t.add_row(r["name"], r["model_type"], human(r["params_total"]), human(r["params_active"]),
                  str(r["layers"]), str(r["hidden"]), r["description"])
    console.print(t)
