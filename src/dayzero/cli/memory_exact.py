"""``dayzero memory --exact``: the runtime's real model and parallelization for one rank per
stage under fake tensors, next to the analytic model (dayzero.validate.exact_memory)."""

from __future__ import annotations

from dayzero.cli.common import console, emit_json, err_console
from dayzero.cli.render import FitTable, styled


def run_exact(spec, parallel, compute_dtype: str, json_out: bool, stages: list[int] | None = None) -> None:
    from dayzero.validate.exact_memory import compare, exact_memory

    with err_console.status("") as status:
        def progress(done, total, stage, last):
            if last is None:
                status.update(f"exact memory: stage {stage} ({done + 1} of {total}) under fake tensors")
            else:
                err_console.print(f"exact memory: stage {stage} measured in {last.seconds:.1f} s ({done} of {total})",
                                  highlight=False)

        exact = exact_memory(spec, parallel, compute_dtype, stages, progress)
    result = compare(spec, parallel, compute_dtype, exact=exact)
    if json_out:
        emit_json(result)
        return
    console.print(f"[bold]{spec.name}[/bold] {parallel.describe()}, computing in {compute_dtype}: one fake rank per "
                  "stage through the runtime (FSDP2 memory tracker) vs the analytic model", highlight=False)
    t = FitTable(compact=True)
    for col in ("stage", "category", "analytic MiB", "exact MiB", "error", "", "explanation"):
        t.add_column(col, num=col not in ("category", "", "explanation"))
    for r in result["rows"]:
        err = "—" if r["rel_error"] is None else f"{r['rel_error']:+.1%}"
        mark = "" if not r["compared"] else ("ok" if r["within"] else
                                             f"explained ({r['residual']:+.1%} left)" if r["explained"] else
                                             styled("off", "red"))
        t.add_row(str(r["stage"]), r["category"], f"{r['analytic'] / 2**20:,.1f}", f"{r['exact'] / 2**20:,.1f}", err,
                  mark, r["explanation"])
    console.print(t)
    s = result["summary"]
    console.print(f"{s['within']} of {s['compared']} compared categories within {result['tolerance']:.0%}, "
                  f"{s['explained']} more explained (measured in {s['seconds']:.1f} s; categories the exact run "
                  "reports as zero are not compared)", highlight=False)
