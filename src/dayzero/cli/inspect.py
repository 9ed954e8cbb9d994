"""``dayzero inspect MODEL``: exact parameter and FLOP counts."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from dayzero.cli.app import app
from dayzero.cli.common import (
    JsonOpt,
    TrustRemoteCodeOpt,
    commas,
    console,
    emit_json,
    human,
    print_model_notes,
)
from dayzero.cli.next_steps import Step, print_next, starter_devices
from dayzero.cli.render import FitTable


@app.command("inspect")
def inspect_cmd(
    model: Annotated[str, typer.Argument(help="Preset name (dayzero models), config.json, or a directory holding "
                                              "one.")],
    seq: Annotated[Optional[int], typer.Option("--seq", "--seq-length", help="Sequence length for FLOPs (default: "
                                                                             "min(max positions, 4096)).")] = None,
    causal: Annotated[bool, typer.Option("--causal/--full-attention", help="Count only the causal half of attention "
                                                                           "scores (default: full s x s, as Narayanan "
                                                                           "et al. 2021).")] = False,
    with_mtp: Annotated[bool, typer.Option("--with-mtp", help="Add multi-token-prediction layers to "
                                                              "params_total.")] = False,
    trust_remote_code: TrustRemoteCodeOpt = False, json_out: JsonOpt = False,
) -> None:
    """Exact parameters (total, active, embedding, per layer by component) and FLOPs per token.

    Example: [bold]dayzero inspect deepseek-v3 --with-mtp[/bold]; [bold]dayzero inspect ./my-model/ --json[/bold]
    """
    from dayzero.specs.counting import COMPONENTS, summarize
    from dayzero.specs.registry import load_model

    spec = load_model(model, trust_remote_code)
    s = summarize(spec, seq, causal)
    total = s.params_total_with_mtp if with_mtp else s.params_total
    print_model_notes(spec)  # after the work: an error stays one line
    if json_out:
        from dayzero.report.model_notes import model_report

        emit_json(model_report(spec, s, with_mtp))
        return
    t = FitTable(title=f"{spec.name} ({spec.model_type})", show_header=False)
    t.add_column("quantity")
    t.add_column("value", num=True)
    t.add_column("", num=True)
    t.add_row("parameters, total" + (" (with MTP)" if with_mtp else ""), commas(total), human(total))
    t.add_row("parameters, active per token", commas(s.params_active), human(s.params_active))
    t.add_row("parameters, embedding", commas(s.params_embedding), human(s.params_embedding))
    t.add_row("parameters, output head", commas(s.params_head), human(s.params_head))
    if spec.mtp_layers and not with_mtp:
        t.add_row(f"+ {spec.mtp_layers} MTP layer(s) "
                  "(--with-mtp)", commas(s.params_total_with_mtp - s.params_total), "")
    if s.checkpoint_elements != total:
        t.add_row("checkpoint tensor elements", commas(s.checkpoint_elements), human(s.checkpoint_elements))
    conv = "causal" if causal else "full attention"
    t.add_row(f"FLOPs/token, train (seq {s.seq}, {conv})", f"{s.flops.train:.4g}", human(s.flops.train, "FLOP"))
    t.add_row("FLOPs/token, forward", f"{s.flops.forward:.4g}", human(s.flops.forward, "FLOP"))
    console.print(t)

    groups: list[list] = []  # consecutive identical layers collapse into one row
    for lc in s.layers:
        key = tuple(getattr(lc, c) for c in COMPONENTS) + (lc.kind,)
        if groups and groups[-1][0] == key:
            groups[-1][2] = lc.index
        else:
            groups.append([key, lc.index, lc.index, lc])
    lt = FitTable(title="Per layer, by component")
    lt.add_column("layers")
    lt.add_column("kind")
    shown = [c for c in COMPONENTS if c != "recurrent" or spec.recurrent is not None]
    for c in shown:
        lt.add_column(c.replace("_", " "), num=True)
    lt.add_column("total", num=True)
    for _, a, b, lc in groups:
        lt.add_row(f"{a}" if a == b else f"{a}-{b}", lc.kind,
                   *[human(getattr(lc, c)) if getattr(lc, c) else "·" for c in shown],
                   human(lc.total))
    console.print(lt)
    if spec.extra.get("derived"):
        _print_derived_kinds(spec)
    from dayzero.specs.hardware import get_accelerator

    h100 = get_accelerator("h100")
    n = starter_devices(spec, h100)
    print_next(console, [Step.of("dayzero", "plan", model, "--accelerator", "h100", "--devices", n,
                                 why="every layout, on enough H100s to hold it")])


def _print_derived_kinds(spec) -> None:
    """The layer kinds as the modeling code builds them (mixer and feed-forward modules, exact counts)."""
    from dayzero.derive.to_spec import ranges

    desc = spec.extra["description"]
    t = FitTable(title=f"Layer kinds of {desc.architecture} (from its modeling code)")
    for col in ("layers", "kind", "mixer", "feed-forward", "params/layer"):
        t.add_column(col, num=col == "params/layer")
    for k in desc.kinds:
        f = k.ffn
        mixer = " & ".join(f"{m.module} ({m.heads}/{m.kv_heads} heads x {m.head_dim})" for m in k.mixers) or "·"
        ffn = f.module or "·"
        if f.experts:
            ffn += f" ({f.experts.experts} experts top-{f.top_k} x {f.experts.expert.intermediate}" + (
                f", shared {f.shared.intermediate}" if f.shared else "") + ")"
        elif f.dense:
            ffn += f" ({f.dense.intermediate})"
        t.add_row(ranges(k.layers), k.name, mixer, ffn, commas(k.params))
    console.print(t)
