"""Tables that never hide a number, at any console width >= 80 (a pipe or CI log is 80).

Every verb builds its tables with :class:`FitTable` and prints them with rich. At render time the
table picks the first layout that shows every cell whole:

1. boxed (rich's default look), then compact (a rule under the header, two spaces between
   columns), each with text wrapped at spaces and no word broken;
2. the same two, now letting tokens longer than :data:`FOLD_AT` cells (flags, paths, ids, URLs)
   fold onto the next line; a plain word or class name (:data:`WORD`) stays whole;
3. vertical: one ``field  value`` block per row, when even that cannot fit.

A cell given as ``str`` is literal text, never rich markup: a finding such as ``pip install
'dayzero[ops]'`` prints as written. A cell meant to be styled is a rich ``Text`` (:func:`styled`).

Number columns (``num=True``, and ``wrap=False`` text such as labels) are never wrapped or cut:
they get at least their widest cell, and a number column's header wraps at spaces instead. Room
left over is shared in proportion to how much each column would like to grow (as HTML tables
do). Nothing is ever cut with an ellipsis. :func:`sheet` renders a record (a dict, as a
verb's ``--json`` has it) as sections of ``field  value`` lines with units, ``—`` for missing
values and nothing left out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

MISSING = "—"
FOLD_AT = 16  # a text token longer than this may fold over lines; shorter words never break


@dataclass
class _Column:
    header: str
    num: bool
    wrap: bool
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

    def add_column(self, header: str = "", *, num: bool = False, wrap: bool = True, style: str | None = None) -> None:
        """``num``: a number column (right-aligned, never wrapped); ``wrap=False``: a text column
        whose cells stay on one line (labels)."""
        self.columns.append(_Column(header, num, wrap and not num, style))

    def add_row(self, *cells: RenderableType | None, style: str | None = None) -> None:
        """A ``str`` cell is literal text (brackets and all); style one with :func:`styled`."""
        if len(cells) != len(self.columns):
            raise ValueError(f"row of {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(_Row([Text(MISSING) if c is None else Text(c) if isinstance(c, str) else c for c in cells],
                              style))

    # -- rendering ------------------------------------------------------------------------------

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        for fold in (False, True):
            for layout in ((COMPACT,) if self.compact else (BOXED, COMPACT)):
                widths = self.widths(console, options, width - layout.chrome(len(self.columns)), fold)
                if widths is not None:
                    yield self._table(layout, widths)
                    return
        yield self._vertical()

    def widths(self, console: Console, options: ConsoleOptions, room: int, fold: bool = True) -> list[int] | None:
        """Content width of every column so that the table takes at most ``room`` cells beside
        its chrome; None when numbers, labels or whole words (with ``fold``: words of up to
        FOLD_AT cells) cannot fit."""
        cap = FOLD_AT if fold else 10**6
        lo, hi = [], []
        for i, col in enumerate(self.columns):
            head = _measure(console, options, col.header) if self.show_header else Measurement(0, 0)
            cells = [_measure(console, options, r.cells[i]) for r in self.rows] or [Measurement(1, 1)]
            widest_cell = max(m.maximum for m in cells)
            if not col.wrap:  # cells whole on one line, the header may wrap at spaces
                lo.append(max(widest_cell, head.minimum, 1))
            else:
                whole = max((_unfoldable(r.cells[i]) for r in self.rows), default=0)  # words never folded
                lo.append(max(min(max(m.minimum for m in cells), cap), min(head.minimum, cap), whole, 1))
            hi.append(max(widest_cell, head.maximum, lo[-1]))
        if sum(lo) > room:
            return None
        widths = list(lo)
        # room left goes first to text that wraps (its cells take fewer lines), then to the rest
        # (number headers, which only wrap their heading)
        for group in ([i for i, c in enumerate(self.columns) if c.wrap], list(range(len(widths)))):
            _grow(widths, hi, group, room - sum(widths))
        return widths

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


def styled(text: str, style: str | None) -> Text:
    """A table cell in a rich style ("green", "bold"; None: plain), its text literal."""
    return Text(text, style=style or "")


def pass_fail(ok: bool, passed: str = "pass", failed: str = "fail") -> Text:
    """A check's result: green ``passed`` or red ``failed``."""
    return styled(passed, "green") if ok else styled(failed, "red")


def hanging(label: str, text: str, width: int, style: str | None = None, label_style: str = "yellow",
            indent: int = 2) -> Text:
    """``label`` then ``text``, wrapped at spaces to ``width`` cells with the lines after the
    first indented by ``indent``; a word longer than a line is kept whole, never cut. Literal text
    (no markup)."""
    import textwrap

    body = textwrap.fill(label + text, width=max(width, 20), subsequent_indent=" " * indent,
                         break_long_words=False, break_on_hyphens=False)
    out = Text(body, style=style or "")
    if label:
        out.stylize(label_style, 0, len(label))
    return out


def _grow(widths: list[int], hi: list[int], group: list[int], spare: int) -> None:
    """Widen the columns of ``group`` towards ``hi`` by ``spare`` cells in all, in proportion to
    how much each still wants."""
    want = {i: hi[i] - widths[i] for i in group if hi[i] > widths[i]}
    if spare <= 0 or not want:
        return
    total = sum(want.values())
    if total <= spare:
        for i, w in want.items():
            widths[i] += w
        return
    add = {i: spare * w // total for i, w in want.items()}
    for i in sorted(want, key=lambda i: add[i] - want[i])[: spare - sum(add.values())]:
        add[i] += 1  # cells lost to rounding, neediest first
    for i, a in add.items():
        widths[i] += a


WORD = re.compile(r"[A-Za-z][A-Za-z0-9]*")  # a word or a class name: never folded (a flag, path, id or URL may be)


def _unfoldable(cell: RenderableType) -> int:
    """Cells of the longest word of a cell that must stay whole when long tokens fold: a plain
    word or class name (letters and digits only, :data:`WORD`), so that ``Qwen3NextGatedDeltaNet``
    is never broken mid-word (the table goes vertical instead); flags, paths, ids and URLs may fold."""
    if not isinstance(cell, Text):
        return 0
    words = (w.strip("()[]{},;:'\"") for w in cell.plain.split())
    return max((cell_len(w) for w in words if WORD.fullmatch(w)), default=0)


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
    columns: tuple[tuple[str, str], ...] = ()  # a list of records: (key, header) of its table


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
        kv.add_column(wrap=False)
        kv.add_column()
        blocks: list[RenderableType] = []
        for f in fs:
            v = record[f.key]
            if isinstance(v, dict) and v:
                for k, x in v.items():
                    kv.add_row(Text(f"{f.label}, {k}"), Text(value_text(x, f.unit)))
            elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
                blocks.append(_records_table(_caption(f, name), v, dict(f.columns)))
            elif isinstance(v, list) and v:
                blocks.append(_bullets(_caption(f, name), [str(x) for x in v]))
            else:
                kv.add_row(Text(f.label), Text(value_text(v, f.unit)))
        if kv.rows:
            parts.append(kv)
        parts.extend(blocks)
    return Group(*parts)


def _caption(f: Field, section: str) -> str | None:
    """A list's own caption, unless the section heading already says it."""
    return None if f.label.lower() == section.lower() else f.label


def _records_table(label: str | None, rows: list[dict], headers: dict[str, str]) -> FitTable:
    keys = list(dict.fromkeys([k for k in headers if any(k in r for r in rows)] + [k for r in rows for k in r]))
    t = FitTable(title=label, compact=True)
    for k in keys:
        t.add_column(headers.get(k, k.replace("_", " ")), num=all(isinstance(r.get(k), (int, float)) for r in rows))
    for r in rows:
        t.add_row(*[Text(value_text(r.get(k))) for k in keys])
    return t


def _bullets(label: str | None, items: list[str]) -> Group:
    g = Table.grid(padding=(0, 1))
    g.add_column(no_wrap=True)
    g.add_column(overflow="fold")
    for it in items:
        g.add_row("-", Text(it))
    return Group(*([Text(label, style="italic")] if label else []), g)
