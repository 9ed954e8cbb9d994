"""Every private PyTorch API the ops layer uses, in one place, behind a version check.

The operator layer needs a few things PyTorch exposes only privately or from underscore modules:
``TorchDispatchMode`` and pytree helpers, the dispatcher's kernel
registrations per dispatch key, the ``native_functions.yaml`` that ships inside the wheel (via
``torchgen``), the decomposition tables of ``torch._decomp``, and the FLOP formulas of
``torch.utils.flop_counter``. If a PyTorch upgrade moves one of them, this is the only file to fix.
"""

from __future__ import annotations

import os
from functools import lru_cache

import torch

# TorchDispatchMode and the pytree helpers are documented but live in underscore modules
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: F401  (re-exported)
from torch.utils._pytree import tree_flatten, tree_map  # noqa: F401  (re-exported)

from dayzero.errors import DayzeroError


def registrations(dispatch_key: str) -> list[str]:
    """Operators with a kernel registered directly for ``dispatch_key`` in this process, in
    manifest spelling (``aten::add.Tensor`` -> ``aten.add.Tensor``; ``aten::silu`` -> ``aten.silu.default``)."""
    try:
        names = torch._C._dispatch_get_registrations_for_dispatch_key(dispatch_key)
    except RuntimeError:
        raise DayzeroError(f"unknown dispatch key {dispatch_key!r}; use a PyTorch dispatch key such as CPU, CUDA, "
                           "XPU, MPS, PrivateUse1 (or 'core' for the Core ATen opset)") from None
    return sorted({_dispatcher_to_manifest(n) for n in names})


def dispatch_key(name: str) -> str:
    """The dispatch key ``name`` means: a key as PyTorch spells it (``CPU``, ``CUDA``,
    ``PrivateUse1``), or a device type (``cuda``, ``xpu``, or the name an out-of-tree extension
    gave PrivateUse1 with ``torch.utils.rename_privateuse1_backend``, e.g. torch_npu's ``npu``),
    mapped by the dispatcher itself (``torch._C._dispatch_key_for_device``)."""
    try:
        torch._C._dispatch_get_registrations_for_dispatch_key(name)
        return name
    except RuntimeError:
        pass
    try:
        return str(torch._C._dispatch_key_for_device(name))
    except RuntimeError:
        raise DayzeroError(f"unknown dispatch key or device type {name!r}; use a PyTorch dispatch key such as CPU, "
                           "CUDA, XPU, MPS, PrivateUse1, the device type an installed extension registers "
                           f"(here: {privateuse1_name()!r} for PrivateUse1), or 'core' for the Core ATen "
                           "opset") from None


def privateuse1_name() -> str:
    """The device type PrivateUse1 runs under in this process (``privateuseone`` until an extension
    renames it, e.g. ``npu`` once torch_npu is loaded)."""
    return torch._C._get_privateuse1_backend_name()


def backend_extensions() -> list[str]:
    """The out-of-tree device extensions PyTorch loads at ``import torch`` (entry points of group
    ``torch.backends``, RFC https://github.com/pytorch/pytorch/issues/122468; off with
    ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``), as ``distribution version`` strings."""
    from importlib.metadata import entry_points

    out = []
    for ep in entry_points(group="torch.backends"):
        dist = getattr(ep, "dist", None)
        out.append(f"{dist.name} {dist.version}" if dist is not None else ep.name)
    return sorted(out)


def _dispatcher_to_manifest(name: str) -> str:
    ns, _, rest = name.partition("::")
    base, _, overload = rest.partition(".")
    return f"{ns}.{base}.{overload or 'default'}"


def native_functions_path() -> str:
    """The ``native_functions.yaml`` of the installed PyTorch (torchgen ships it in the wheel)."""
    import torchgen

    path = os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native", "native_functions.yaml")
    if not os.path.exists(path):
        raise DayzeroError(f"native_functions.yaml not found at {path}; reinstall torch (the wheel ships torchgen)")
    return path


@lru_cache(maxsize=1)
def decomposition_tables() -> tuple[dict, dict]:
    """(core ATen decompositions, all post-autograd decompositions) of ``torch._decomp``."""
    from torch._decomp import core_aten_decompositions, decomposition_table

    return dict(core_aten_decompositions()), dict(decomposition_table)


def flop_formulas() -> dict:
    """OpOverloadPacket -> FLOP formula (called as ``f(*args, **kwargs, out_val=out)``)."""
    from torch.utils.flop_counter import flop_registry

    return flop_registry


def current_autograd_node():
    """The autograd Node whose backward is executing in this thread (None in the forward)."""
    return torch._C._current_autograd_node()
