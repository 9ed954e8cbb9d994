"""The oldest PyTorch dayzero's torch-using layers accept, checked in one place.

Releases before 2.10 compute FSDP2 gradients wrongly on gloo and hang in pipelining (measured on
CPU), so every layer that imports torch (runtime, checkpoints, ``ops``, ``memory --exact``)
refuses them with one line; ``pyproject.toml`` states the same floor (``torch>=2.10``).
"""

from __future__ import annotations

from dayzero.errors import DayzeroError

MIN_TORCH = (2, 10)


def torch_version(text: str) -> tuple[int, int]:
    """'2.13.0+cpu' -> (2, 13); '2.10.0a0+git1234' -> (2, 10)."""
    parts = text.split("+")[0].split(".")[:2]
    return tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in parts)  # type: ignore[return-value]


def require_torch(needed_by: str, error: type[Exception] = DayzeroError) -> None:
    """Raise ``error`` naming ``needed_by`` when the installed torch is older than MIN_TORCH."""
    import torch

    if torch_version(torch.__version__) < MIN_TORCH:
        raise error(f"torch {torch.__version__} is too old for {needed_by}: need torch >= "
                    f"{MIN_TORCH[0]}.{MIN_TORCH[1]} (older FSDP2 computes wrong gradients on gloo); "
                    f"pip install 'torch>={MIN_TORCH[0]}.{MIN_TORCH[1]}'")
