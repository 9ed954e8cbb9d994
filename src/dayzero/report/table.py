"""One table of a report: a title, a header, rows of text and a note under it. The Markdown and the
HTML renderings (:mod:`dayzero.report.day0_render`) and every section that builds tables
(:mod:`dayzero.report.uncertainty`) share it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Table:
    """A section: its cells are text, whatever values it was given (:func:`cell_text`): a finding
    of an unexpected shape is shown, never an exception."""

    title: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    note: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "rows", tuple(tuple(cell_text(c) for c in row) for row in self.rows))
        object.__setattr__(self, "note", cell_text(self.note))


def cell_text(v) -> str:
    """Any value as a table cell: text as is, a number formatted, a named record (an operator
    ``{"op": ...}``, a layer kind ``{"name": ...}``) by its name, a list joined, a mapping as
    ``key: value`` pairs, nothing as a dash."""
    if isinstance(v, str):
        return v
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        for key in ("op", "name", "metric"):
            if isinstance(v.get(key), str):
                return v[key]
        return ", ".join(f"{k}: {cell_text(x)}" for k, x in v.items())
    if isinstance(v, (list, tuple, set, frozenset)):
        return ", ".join(cell_text(x) for x in v)
    return str(v)

