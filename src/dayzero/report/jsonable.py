"""One JSON encoding for every report and ``--json`` output."""

from __future__ import annotations

import json
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


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=json_default)
