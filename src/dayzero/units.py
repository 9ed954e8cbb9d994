"""One unit vocabulary for printed sizes: GB = 10**9 bytes, GiB = 2**30 bytes, each always
labelled, one unit per quantity.

Device memory is in GiB: the capacity of a card (vendors size HBM in powers of two of GiB: an
"H100 80GB" holds 80 GiB, nvidia-smi shows 81,559 MiB of it; an Ascend 910B "64 GB" holds 64
GiB) and every per-device memory figure compared with it (peaks, stages, model states). Bytes on
the wire, on disk and in host DRAM stay in decimal GB (and GB/s), as their makers state them.
"""

from __future__ import annotations

GIB = 2**30
TIB = 2**40


def gib(n: float, digits: int = 1) -> str:
    """``n`` bytes as ``'80.0 GiB'``."""
    return f"{n / GIB:,.{digits}f} GiB"


def gib_number(n: float, digits: int = 2) -> str:
    """``n`` bytes in GiB without the unit (for a column whose header names it)."""
    return f"{n / GIB:,.{digits}f}"


def capacity(n: float) -> str:
    """A card's memory, ``n`` bytes: ``'64 GiB'`` (whole where it is, as catalogs list it)."""
    return f"{n / GIB:,.4g} GiB"


def figure(x: float) -> str:
    """A quantity in a sentence: whole with thousands separators from 100 up (``'1,234'``), else three
    significant digits (``'0.876'``, ``'12.5'``)."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"
