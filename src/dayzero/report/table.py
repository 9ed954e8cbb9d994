"""One table of a report: a title, a header, rows of text and a note under it. The Markdown and the
HTML renderings (:mod:`dayzero.report.day0_render`) and every section that builds tables
(:mod:`dayzero.report.uncertainty`) share it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Table:
    title: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    note: str = ""
