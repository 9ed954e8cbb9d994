"""The one place the runtime touches private PyTorch APIs (the version floor they need is
:mod:`dayzero.torch_version`)."""

from __future__ import annotations


def unflatten_mesh(world_mesh, sizes: tuple[int, ...], names: tuple[str, ...]):
    """A view of a 1-D world mesh as an N-D mesh sharing the same root.

    Several such views (dense, expert, ...) over the same ranks are what lets FSDP2 compose with
    DTensor parameters of either view; DeviceMesh offers this only as ``_unflatten`` so far.
    """
    return world_mesh._unflatten(0, tuple(sizes), tuple(names))
