"""User-facing errors.

Every error a user can cause (bad config, impossible layout, a plan that cannot fit, a corrupt
checkpoint) is a :class:`DayzeroError`. The CLI prints its message as one line on stderr and exits
with code 2; it never shows a traceback for these. Messages say what is wrong, with the numbers that
disagree, and what to do.
"""

from __future__ import annotations


def one_line(e: BaseException, limit: int | None = 300) -> str:
    """``Type: message`` of a foreign exception (modeling code, a tracer) on one line, cut at ``limit``
    characters of the message, for a DayzeroError or a report to quote."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text if limit is None else text[:limit]}"


class DayzeroError(ValueError):
    """An error caused by the user's input; ``str(err)`` is a complete one-line message."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class ConfigError(DayzeroError):
    """A model config, cluster file or manifest is malformed."""

    def __init__(self, source: str, field: str | None, problem: str):
        where = f"{source}: field '{field}'" if field else str(source)
        super().__init__(f"{where}: {problem}")
        self.source, self.field, self.problem = source, field, problem


class LayoutError(DayzeroError):
    """A parallel layout is impossible for this model or cluster."""


class FitError(DayzeroError):
    """No plan fits in device memory."""
