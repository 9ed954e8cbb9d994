"""Numbers in published-runs columns: ``4``, ``8k`` (8192), ``1m``, ``128K``; blank means unknown.
A value followed by a remark in parentheses or brackets (``250680 (padded to 250880)``) reads as
the number it starts with: the value the source states, its remark aside."""

from __future__ import annotations

import math
import re
import sys

from dayzero.errors import DayzeroError

MAX_WHOLE = 2**53  # float64's exact integers (IEEE 754 binary64); no size, degree or count is larger


def whole(row: dict, key: str, default: int | None = None, strict: bool = True) -> int | None:
    """A positive whole-number column (``4``, ``8k`` = 8192, ``1m``); blank -> ``default``. Any other
    text is the row's skip reason (``strict``; lenient columns such as ``fsdp`` may hold words)."""
    v = stated(row, key)
    if not v:
        return default
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kKmM]?)", v)
    x = float(m.group(1)) * {"": 1, "k": 1024, "m": 2**20}[m.group(2).lower()] if m else None
    if x is None or not x.is_integer() or x < 1:
        if strict:
            raise DayzeroError(f"{key} {v!r} is not a positive whole number")
        return default
    if x > MAX_WHOLE:
        raise DayzeroError(f"{key} {v[:20]}{'...' if len(v) > 20 else ''} ({len(v)} characters) is beyond any "
                           "size, degree or count of a training run (at most 2^53)")
    return int(x)


def positive(row: dict, key: str) -> float | None:
    """A positive finite number, or None (blank, not a number, or subnormal: below 2.2e-308 a ratio
    to it overflows, and no measured rate is that small)."""
    try:
        v = float(stated(row, key))
    except ValueError:
        return None
    return v if math.isfinite(v) and v >= sys.float_info.min else None


_REMARK = re.compile(r"\s{0,8}[(\[][^()\[\]]{0,200}[)\]]\s{0,8}$")


def stated(row: dict, key: str) -> str:
    """The cell without thousands separators and without a trailing remark in parentheses or
    brackets (``250680 (padded to 250880)`` -> ``250680``)."""
    v = (row.get(key) or "").strip().replace(",", "")
    while m := _REMARK.search(v):
        if m.start() == 0:
            break
        v = v[:m.start()]
    return v.strip()


def text(row: dict, key: str) -> str:
    return (row.get(key) or "").strip()
