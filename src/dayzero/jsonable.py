"""One JSON encoding for every report, ``--json`` output and metrics stream: strict JSON (RFC 8259
has no NaN or Infinity, so non-finite numbers are written as ``null``)."""

from __future__ import annotations

import json
import math
from typing import Any


def json_default(o: Any) -> Any:
    """What ``json.dumps`` cannot encode itself: objects with ``to_dict``, numpy scalars and
    0-d tensors (``item``), sets and tuples; anything else as its ``str``."""
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


def finite(obj: Any, path: str = "", found: list[str] | None = None) -> Any:
    """Plain JSON data (dicts, lists, floats, ...) with every non-finite float replaced by ``None``;
    the dotted paths of the replaced values are appended to ``found``."""
    if isinstance(obj, dict):
        return {k: finite(v, f"{path}.{k}" if path else str(k), found) for k, v in obj.items()}
    if isinstance(obj, list):
        return [finite(v, f"{path}[{i}]", found) for i, v in enumerate(obj)]
    if isinstance(obj, float) and not math.isfinite(obj):
        if found is not None:
            found.append(path)
        return None
    return obj


def plain(obj: Any) -> Any:
    """``obj`` as plain JSON types (``to_dict``, numpy scalars, sets and tuples converted)."""
    return json.loads(json.dumps(obj, default=json_default))


def dumps(obj: Any, indent: int | None = 1) -> str:
    """Strict JSON text of ``obj`` (non-finite numbers as ``null``)."""
    return json.dumps(finite(plain(obj)), indent=indent, allow_nan=False)


def record_line(obj: dict) -> str:
    """One compact line of a JSONL stream: strict JSON; a record whose values were not finite
    names them under ``nonfinite`` (the value itself is written as ``null``)."""
    found: list[str] = []
    clean = finite(plain(obj), found=found)
    if found:
        clean["nonfinite"] = found
    return json.dumps(clean, allow_nan=False)
