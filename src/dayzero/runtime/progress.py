"""Rank 0's progress bar (rich), silent when disabled."""

from __future__ import annotations


class Progress:
    def __init__(self, total: int, enabled: bool, start: int = 0):
        self.total, self.enabled, self.start = total, enabled, start
        self._p = self._task = None

    def __enter__(self):
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            from dayzero.runtime.resilience.rank_log import terminal_stream

            self._p = RichProgress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                   TextColumn("{task.fields[info]}"), TimeRemainingColumn(),
                                   # the terminal even when this rank's stderr goes to ranks.log; other
                                   # stderr lines are not redrawn above the bar (they would skip the log)
                                   console=Console(file=terminal_stream()), transient=False,
                                   redirect_stderr=False)
            self._p.__enter__()
            self._task = self._p.add_task("train", total=self.total, completed=self.start, info="")
        return self

    def update(self, rec) -> None:
        if self._p is not None:
            info = f"loss {rec.loss:.4f}  {rec.tokens_per_s:,.0f} tok/s  {rec.step_time_s * 1e3:.0f} ms/step"
            self._p.update(self._task, completed=rec.step, info=info)

    def __exit__(self, *exc):
        if self._p is not None:
            self._p.__exit__(*exc)
        return False
