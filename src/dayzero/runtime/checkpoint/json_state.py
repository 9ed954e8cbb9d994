"""The non-tensor part of a checkpoint as JSON: RNG states and LR-scheduler state.

Nothing here is ever unpickled. :func:`to_json` accepts only plain values (dict with string keys,
list, tuple, str, int, float, bool, None) and small tensors, tagging tuples and tensors so that
:func:`from_json` rebuilds exactly what was saved (a scheduler's ``base_lrs`` list stays a list,
Adam's ``betas`` tuple stays a tuple, a tensor keeps its dtype and bits).
"""

from __future__ import annotations

import base64
import random
from typing import Any

import torch

from dayzero.runtime.checkpoint.manifest import CheckpointError

_TUPLE, _TENSOR = "__tuple__", "__tensor__"


def to_json(obj: Any, where: str = "state") -> Any:
    """Plain-JSON form of ``obj``; raises CheckpointError naming the first unsupported value."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, tuple):
        return {_TUPLE: [to_json(v, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [to_json(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, str):
                raise CheckpointError(f"{where}: key {k!r} is not a string; checkpoint state must be JSON-like")
            if k in (_TUPLE, _TENSOR):
                raise CheckpointError(f"{where}: key {k!r} is reserved")
            out[k] = to_json(v, f"{where}.{k}")
        return out
    if isinstance(obj, torch.Tensor):
        t = obj.detach().to("cpu").contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return {_TENSOR: {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                          "data": base64.b64encode(raw).decode()}}
    if hasattr(obj, "item") and hasattr(obj, "dtype"):  # numpy scalars
        return to_json(obj.item(), where)
    raise CheckpointError(f"{where}: cannot store a {type(obj).__name__} in a checkpoint (JSON values, tuples "
                          "and tensors only); keep callables and objects out of saved state")


def from_json(obj: Any) -> Any:
    if isinstance(obj, list):
        return [from_json(v) for v in obj]
    if isinstance(obj, dict):
        if set(obj) == {_TUPLE}:
            if not isinstance(obj[_TUPLE], list):
                raise CheckpointError(f"checkpoint state: a tuple holds {obj[_TUPLE]!r}, not a list")
            return tuple(from_json(v) for v in obj[_TUPLE])
        if set(obj) == {_TENSOR}:
            return _tensor(obj[_TENSOR])
        return {k: from_json(v) for k, v in obj.items()}
    return obj


def _tensor(d: dict) -> torch.Tensor:
    if not isinstance(d, dict):
        raise CheckpointError(f"checkpoint state: a tensor entry holds {d!r}, not an object")
    dtype = getattr(torch, str(d.get("dtype")), None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"checkpoint state: unknown tensor dtype {d.get('dtype')!r}")
    shape = d.get("shape")
    if not isinstance(shape, list) or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**31
                                              for x in shape):
        raise CheckpointError(f"checkpoint state: tensor shape {shape!r} is not a list of sizes")
    try:
        raw = bytearray(base64.b64decode(d.get("data"), validate=True))
    except (TypeError, ValueError):
        raise CheckpointError("checkpoint state: a tensor's data is not base64") from None
    flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    numel = 1
    for s in shape:
        numel *= s
    if flat.numel() != numel * torch.empty((), dtype=dtype).element_size():
        raise CheckpointError(f"checkpoint state: tensor of shape {shape} has {flat.numel()} bytes")
    return flat.view(dtype).reshape(shape).clone()


# -- RNG ---------------------------------------------------------------------------------------

def capture_rng() -> dict:
    """Every generator the training loop may draw from: torch (CPU and the current accelerator),
    Python's ``random`` and numpy's global generator."""
    import numpy as np

    from dayzero.runtime.device import current_rng_state

    state: dict[str, Any] = {
        **current_rng_state(),  # "torch" and, once initialised, the accelerator's (keyed by its type)
        "python": random.getstate(),
        "numpy": _numpy_state(np.random.get_state()),
    }
    return to_json(state, "rng")


def restore_rng(saved: dict) -> None:
    import numpy as np

    from dayzero.runtime.device import restore_current_rng_state

    s = from_json(saved)
    restore_current_rng_state(s)
    random.setstate(s["python"])
    kind, keys, pos, has_gauss, cached = s["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


def _numpy_state(st: tuple) -> tuple:
    kind, keys, pos, has_gauss, cached = st
    return (str(kind), [int(k) for k in keys], int(pos), int(has_gauss), float(cached))
