"""Numbers in published-runs columns: ``4``, ``8k`` (8192), ``1m``, ``128K``; blank means unknown."""

from __future__ import annotations

import math
import re

from dayzero.errors import DayzeroError


def whole(row: dict, key: str, default: int | None = None, strict: bool = True) -> int | None:
    """A positive whole-number column (``4``, ``8k`` = 8192, ``1m``); blank -> ``default``. Any other
    text is the row's skip reason (``strict``; lenient columns such as ``fsdp`` may hold words)."""
    v = (row.get(key) or "").strip().replace(",", "")
    if not v:
        return default
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kKmM]?)", v)
    x = float(m.group(1)) * {"": 1, "k": 1024, "m": 2**20}[m.group(2).lower()] if m else None
    if x is None or not x.is_integer() or x < 1:
        if strict:
            raise DayzeroError(f"{key} {v!r} is not a positive whole number")
        return default
    return int(x)


def positive(row: dict, key: str) -> float | None:
    """A positive finite number, or None (blank or not a number)."""
    try:
        v = float((row.get(key) or "").strip().replace(",", ""))
    except ValueError:
        return None
    return v if math.isfinite(v) and v > 0 else None


def text(row: dict, key: str) -> str:
    return (row.get(key) or "").strip()
