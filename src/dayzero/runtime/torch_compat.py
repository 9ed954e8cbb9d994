"""The one place that touches private PyTorch APIs, behind a version check.

Releases before 2.10 compute FSDP2 gradients wrongly on gloo and hang in pipelining (measured on
CPU), so the runtime refuses them with one clear line instead of training silently wrong.
"""

from __future__ import annotations

import torch

from dayzero.errors import DayzeroError

MIN_TORCH = (2, 10)


def require_torch() -> None:
    major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if (major, minor) < MIN_TORCH:
        raise DayzeroError(f"torch {torch.__version__} is too old for the runtime: need torch >= "
                           f"{MIN_TORCH[0]}.{MIN_TORCH[1]} (older FSDP2 computes wrong gradients on gloo); "
                           "pip install 'torch>=2.10'")


def unflatten_mesh(world_mesh, sizes: tuple[int, ...], names: tuple[str, ...]):
    """A view of a 1-D world mesh as an N-D mesh sharing the same root.

    Several such views (dense, expert, ...) over the same ranks are what lets FSDP2 compose with
    DTensor parameters of either view; DeviceMesh offers this only as ``_unflatten`` so far.
    """
    return world_mesh._unflatten(0, tuple(sizes), tuple(names))
