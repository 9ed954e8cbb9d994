"""Tables that never hide a number, at any console width >= 80 (a pipe or CI log is 80).

Every verb builds its tables with :class:`FitTable` and prints them with rich. At render time the
table picks the first layout that shows every cell whole:

1. boxed (rich's default look), text columns wrapped at spaces;
2. compact (a rule under the header, two spaces between columns), text wrapped at spaces;
3. vertical: one ``field  value`` block per row, when even the compact grid cannot fit.

Number columns (``num=True``) are never wrapped or cut: they get at least their widest cell, and
their header wraps at spaces instead. Text columns never get less than their longest word (up to
:data:`FOLD_AT` cells: longer tokens, such as paths and URLs, fold onto the next line), so no
word is broken; whatever room is left is shared in proportion to how much each column would
like to grow (as HTML tables do). Nothing is ever cut with an ellipsis. :func:`sheet` renders a record (a dict, as a
verb's ``--json`` has it) as sections of ``field  value`` lines with units, ``—`` for missing
values and nothing left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

MISSING = "—"
FOLD_AT = 24  # a text token longer than this may fold over lines; shorter words never break


@dataclass
class _Column:
    header: str
    num: bool
    style: str | None


@dataclass
class _Row:
    cells: list[RenderableType]
    style: str | None


@dataclass(frozen=True)
class _Layout:
    name: str
    box: box.Box | None
    show_edge: bool
    pad_edge: bool
    collapse_padding: bool

    def chrome(self, n: int) -> int:
        """Width a table of ``n`` columns adds around its cells, as rich lays it out: rules, and
        one space each side of a cell (only on its right with ``collapse_padding``), none at the
        outer edges without ``pad_edge``."""
        rules = (2 if self.show_edge else 0) + (n - 1) if self.box else 0
        if self.collapse_padding:
            return rules + n - (0 if self.pad_edge else 1)
        return rules + 2 * n - (0 if self.pad_edge else 2)


BOXED = _Layout("boxed", box.HEAVY_HEAD, show_edge=True, pad_edge=True, collapse_padding=False)
COMPACT = _Layout("compact", box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)


@dataclass
class FitTable:
    """A table that fits its console; the API follows rich's ``Table`` (``add_column``,
    ``add_row``), with ``num=True`` for number columns instead of ``justify="right"``."""

    title: str | None = None
    show_header: bool = True
    compact: bool = False  # start from the compact layout (dense tables)
    caption: str | None = None
    columns: list[_Column] = field(default_factory=list)
    rows: list[_Row] = field(default_factory=list)

    def add_column(self, header: str = "", *, num: bool = False, style: str | None = None) -> None:
        self.columns.append(_Column(header, num, style))

    def add_row(self, *cells: RenderableType | None, style: str | None = None) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"row of {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(_Row([MISSING if c is None else c for c in cells], style))

    # -- rendering ------------------------------------------------------------------------------

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        for layout in ((COMPACT,) if self.compact else (BOXED, COMPACT)):
            widths = self.widths(console, options, width - layout.chrome(len(self.columns)))
            if widths is not None:
                yield self._table(layout, widths)
                return
        yield self._vertical()

    def widths(self, console: Console, options: ConsoleOptions, room: int) -> list[int] | None:
        """Content width of every column so that the table takes at most ``room`` cells beside
        its chrome; None when numbers or whole words cannot fit."""
        lo, hi = [], []
        for i, col in enumerate(self.columns):
            head = _measure(console, options, col.header) if self.show_header else Measurement(0, 0)
            cells = [_measure(console, options, r.cells[i]) for r in self.rows] or [Measurement(1, 1)]
            widest_cell = max(m.maximum for m in cells)
            if col.num:  # cells whole on one line, the header may wrap at spaces
                lo.append(max(widest_cell, head.minimum, 1))
            else:
                lo.append(max(min(max(m.minimum for m in cells), FOLD_AT), min(head.minimum, FOLD_AT), 1))
            hi.append(max(widest_cell, head.maximum, lo[-1]))
        if sum(lo) > room:
            return None
        if sum(hi) <= room:
            return hi
        spare, want = room - sum(lo), [h - m for m, h in zip(lo, hi)]
        grown = [m + spare * w // sum(want) for m, w in zip(lo, want)]
        for i in sorted(range(len(grown)), key=lambda i: grown[i] - hi[i])[: room - sum(grown)]:
            grown[i] += 1  # hand out the cells lost to rounding, neediest first
        return grown

    def _table(self, layout: _Layout, widths: list[int]) -> Table:
        t = Table(title=self.title, caption=self.caption, show_header=self.show_header, box=layout.box,
                  show_edge=layout.show_edge, pad_edge=layout.pad_edge, padding=(0, 1),
                  collapse_padding=layout.collapse_padding,
                  expand=False, title_justify="center")
        for col, w in zip(self.columns, widths):
            t.add_column(col.header, justify="right" if col.num else "left", width=w, style=col.style,
                         overflow="fold", no_wrap=False)
        for r in self.rows:
            t.add_row(*r.cells, style=r.style)
        return t

    def _vertical(self) -> Group:
        """One block of ``field  value`` lines per row; headerless tables use their first cell as
        the field and the others as its value."""
        g = Table.grid(padding=(0, 2))
        g.add_column(no_wrap=False, overflow="fold", style="bold")
        g.add_column(no_wrap=False, overflow="fold")
        for n, r in enumerate(self.rows):
            if n and self.show_header:
                g.add_row("", "")
            if self.show_header:
                for col, cell in zip(self.columns, r.cells):
                    g.add_row(col.header, cell, style=r.style)
            else:
                g.add_row(r.cells[0], _join(r.cells[1:]), style=r.style)
        parts: list[RenderableType] = []
        if self.title:
            parts.append(Text.from_markup(self.title, style="italic"))
        parts.append(g)
        if self.caption:
            parts.append(Text.from_markup(self.caption, style="dim"))
        return Group(*parts)


def _measure(console: Console, options: ConsoleOptions, cell: RenderableType) -> Measurement:
    if isinstance(cell, str):
        cell = console.render_str(cell)
    return Measurement.get(console, options.update(max_width=10**6), cell)


def _join(cells: Sequence[RenderableType]) -> RenderableType:
    texts = [Text.from_markup(c) if isinstance(c, str) else c for c in cells if c != ""]
    if all(isinstance(t, Text) for t in texts):
        return Text("  ").join(texts)
    return Group(*texts)


# -- sheets: one record as sections of field/value lines ------------------------------------------


@dataclass(frozen=True)
class Field:
    """How :func:`sheet` shows one key of a record: its section, label and unit."""

    key: str
    section: str
    label: str
    unit: str = ""


def value_text(v: Any, unit: str = "") -> str:
    """A scalar for people: '—' when missing, numbers with thousands separators and the unit."""
    if v is None or v == "" or v == {} or v == []:
        return MISSING
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        s = f"{v:,}"
    elif isinstance(v, float):
        s = f"{v:,.6g}" if abs(v) < 1e6 else f"{v:,.0f}"
    else:
        s = str(v)
    return f"{s} {unit}".rstrip()


def sheet(title: str, record: dict, fields: Iterable[Field], other: str = "Other") -> Group:
    """Render ``record`` section by section in the order of ``fields``. A dict value becomes one
    line per key, a list of scalars a bulleted list, a list of dicts a table; keys the fields do
    not name go to an ``other`` section, so nothing is dropped."""
    fields = list(fields)
    named = {f.key for f in fields}
    fields += [Field(k, other, k.replace("_", " ")) for k in record if k not in named]
    sections: dict[str, list[Field]] = {}
    for f in fields:
        if f.key in record:
            sections.setdefault(f.section, []).append(f)
    parts: list[RenderableType] = [Text(title, style="bold")]
    for name, fs in sections.items():
        parts.append(Text(""))
        parts.append(Text(name, style="bold underline"))
        kv = FitTable(show_header=False, compact=True)
        kv.add_column()
        kv.add_column()
        blocks: list[RenderableType] = []
        for f in fs:
            v = record[f.key]
            if isinstance(v, dict) and v:
                for k, x in v.items():
                    kv.add_row(Text(f"{f.label}, {k}"), Text(value_text(x, f.unit)))
            elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
                blocks.append(_records_table(f.label, v, f.unit))
            elif isinstance(v, list) and v:
                blocks.append(_bullets(f.label, [str(x) for x in v]))
            else:
                kv.add_row(Text(f.label), Text(value_text(v, f.unit)))
        if kv.rows:
            parts.append(kv)
        parts.extend(blocks)
    return Group(*parts)


def _records_table(label: str, rows: list[dict], unit: str) -> FitTable:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    t = FitTable(title=label, compact=True)
    for k in keys:
        t.add_column(k.replace("_", " "), num=all(isinstance(r.get(k), (int, float)) for r in rows))
    for r in rows:
        t.add_row(*[Text(value_text(r.get(k))) for k in keys])
    return t


def _bullets(label: str, items: list[str]) -> Group:
    g = Table.grid(padding=(0, 1))
    g.add_column(no_wrap=True)
    g.add_column(overflow="fold")
    for it in items:
        g.add_row("-", Text(it))
    return Group(Text(label, style="italic"), g)
