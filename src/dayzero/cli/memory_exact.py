"""``dayzero memory --exact``: the runtime's real model and parallelization for one rank per
stage under fake tensors, next to the analytic model (dayzero.validate.exact_memory)."""

from __future__ import annotations

from dayzero.cli.common import console, emit_json
from dayzero.cli.render import FitTable


def run_exact(spec, parallel, compute_dtype: str, json_out: bool) -> None:
    from dayzero.validate.exact_memory import compare

    result = compare(spec, parallel, compute_dtype)
    if json_out:
        emit_json(result)
        return
    console.print(f"[bold]{spec.name}[/bold] {parallel.describe()}, computing in {compute_dtype}: one fake rank per "
                  "stage through the runtime (FSDP2 memory tracker) vs the analytic model", highlight=False)
    t = FitTable(compact=True)
    for col in ("stage", "category", "analytic MiB", "exact MiB", "error", ""):
        t.add_column(col, num=col not in ("category", ""))
    for r in result["rows"]:
        err = "—" if r["rel_error"] is None else f"{r['rel_error']:+.1%}"
        mark = "" if not r["compared"] else ("ok" if r["within"] else "[red]off[/red]")
        t.add_row(str(r["stage"]), r["category"], f"{r['analytic'] / 2**20:,.1f}", f"{r['exact'] / 2**20:,.1f}", err, mark)
    console.print(t)
    s = result["summary"]
    console.print(f"{s['within']} of {s['compared']} compared categories within {result['tolerance']:.0%} "
                  "(categories the exact run reports as zero at its peak are not compared)")
