"""How a rank joins its process group, and leaves it.

``init_distributed()`` joins torchrun's process group (or makes a one-process group when the
process was not started by torchrun) on this rank's device and backend (:mod:`dayzero.runtime.device`);
``init_process_group`` is the restart-safe ``torch.distributed.init_process_group`` it uses under
torchrun, keyed by :func:`restart_attempt`; ``destroy_process_group()`` leaves the group on the way
out, whatever state it is in. Rank launching (:mod:`dayzero.runtime.launch`) and the training loop
(:mod:`dayzero.runtime.train`) both import this module; neither imports the other.
"""

from __future__ import annotations

import os
from datetime import timedelta

from dayzero.runtime.resilience.rank_log import launcher_attempt

PG_TIMEOUT_S = 600  # a rank stuck longer than this in a collective fails instead of hanging


def restart_attempt() -> int:
    """Which restart attempt this process belongs to (0 on the first run): dayzero's launcher
    restarts ranks itself (:mod:`dayzero.runtime.resilience.rank_log`), the user's torchrun counts its own."""
    try:
        return launcher_attempt() + int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        return launcher_attempt()


def init_process_group(backend: str = "gloo", **kwargs) -> None:
    """``torch.distributed.init_process_group`` from torchrun's environment, safe across restarts.

    torchrun's c10d rendezvous shares one TCPStore across restart attempts (torch 2.13), so the
    keys a failed attempt left behind (its ranks' gloo addresses) are still there and the new
    attempt connects to dead peers ("Connection refused" in connectFullMesh). Prefixing every key
    with the attempt number keeps attempts apart. ``kwargs`` go to ``init_process_group``
    (``timeout``, ``device_id``).
    """
    import torch.distributed as dist

    store, rank, world = next(dist.rendezvous("env://"))
    store = dist.PrefixStore(f"dayzero/attempt-{restart_attempt()}", store)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, **kwargs)


def device_slot() -> int:
    """This rank's local device index: ``LOCAL_RANK``, mapped through the launcher's slot list
    when it runs the ranks on chosen devices (spares, excluded ones left out)."""
    from dayzero.runtime.resilience.exclusion import SLOTS_ENV, parse_slots

    local = int(os.environ.get("LOCAL_RANK", "0"))
    slots = parse_slots(os.environ.get(SLOTS_ENV), local + 1)
    return slots[local] if local < len(slots) else local


def init_distributed():
    """Join torchrun's process group (or make a one-process group) and pick this rank's device."""
    import torch.distributed as dist

    from dayzero.runtime import device as devices

    acc = devices.resolve()
    device = devices.bind(acc, device_slot())
    backend = acc.backend
    if not dist.is_initialized():
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            # keys apart from a failed attempt's (torchrun restarts)
            init_process_group(backend, timeout=timedelta(seconds=PG_TIMEOUT_S),
                               device_id=devices.process_group_device(acc, device))
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return device


def destroy_process_group() -> None:
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - shutting down after an error must not mask it
        pass
