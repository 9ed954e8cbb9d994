"""``dayzero models``: the built-in model presets."""

from __future__ import annotations

from dayzero.cli.app import app
from dayzero.cli.common import JsonOpt, console, emit_json, human
from dayzero.cli.next_steps import Step, print_next
from dayzero.cli.render import FitTable


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
    t = FitTable(title="Model presets (also: any HF config.json or directory holding one)")
    for col in ("name", "type", "params", "active", "layers", "hidden", "description"):
        t.add_column(col, num=col in ("params", "active", "layers", "hidden"))
    for r in rows:
        t.add_row(r["name"], r["model_type"], human(r["params_total"]), human(r["params_active"]),
                  str(r["layers"]), str(r["hidden"]), r["description"])
    console.print(t)
    if rows:
        print_next(console, [Step.of("dayzero", "inspect", rows[0]["name"], why="exact counts of one model")])
