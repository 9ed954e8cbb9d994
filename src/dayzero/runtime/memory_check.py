"""Will the run fit? The planner's peak per rank against this machine's free memory, checked
before any rank starts, so a model too large for the host is one line with the numbers and the
proxy flags that would fit, not a process the kernel's OOM killer ends a minute later.

* Per rank: the analytic peak of the runtime's own layout and dtypes
  (``runtime.planner_view.memory_options``: FSDP2 mixed precision, eager kernels), busiest stage.
* Where ranks share memory (CPU: every rank is a process on this host) the need is ranks x per
  rank against the host's available memory (``MemAvailable``); on an accelerator each rank has
  its own device and the need is one rank's peak against that device's free memory.
* CPU processes carry no accelerator context or communicator buffers: a rank's fixed cost is the torch runtime,
  ``CPU_RANK_CONTEXT_BYTES`` (303 MiB measured by ``dayzero calibrate`` on this project's CI
  host, torch 2.13, gloo: ``memory_overhead.runtime_context_bytes``).
* ``HEADROOM``: the check refuses when the need exceeds 90 % of what is available, leaving room
  for the allocator and the page cache the data loader uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dayzero.errors import DayzeroError
from dayzero.specs.counting import params_total
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import ParallelConfig

MiB = 2**20
GiB = 2**30
CPU_RANK_CONTEXT_BYTES = 303 * MiB
HEADROOM = 0.90
ACCELERATOR = "accelerator"  # the planner's memory options tell only "cpu" from any accelerator
PROXY_LAYERS = (64, 32, 16, 8, 4, 2)
PROXY_HIDDEN = (8192, 4096, 2048, 1024, 512, 256)
PROXY_EXPERTS = (64, 16, 8, 4)


class InsufficientMemory(DayzeroError):
    """The predicted peak does not fit this machine's free memory."""


@dataclass(frozen=True)
class MemoryNeed:
    per_rank_bytes: int
    ranks_sharing: int  # ranks whose peaks add up in the memory checked (all on CPU, 1 per device)
    available_bytes: int
    where: str  # "host" | the device's name

    @property
    def need_bytes(self) -> int:
        return self.per_rank_bytes * self.ranks_sharing

    @property
    def fits(self) -> bool:
        return self.need_bytes <= HEADROOM * self.available_bytes


def host_available_bytes() -> int:
    """The host's available memory (Linux ``MemAvailable``; elsewhere free physical pages)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def device_available_bytes() -> tuple[int, str] | None:
    """(free bytes, name) of the current accelerator (:mod:`dayzero.runtime.device`); None on a
    CPU-only machine or where the backend does not report memory."""
    from dayzero.runtime import device as devices

    if not devices.has_accelerator():
        return None
    device = devices.current_device()
    free = devices.memory_stats(device).free
    return None if free is None else (int(free), f"{device.type} device")


def peak_per_rank(spec: ModelSpec, parallel: ParallelConfig, compute_dtype: str, device: str) -> int:
    """The planner's peak bytes of the busiest rank for the runtime running ``parallel``."""
    from dayzero.planner.memory.memory import estimate_memory
    from dayzero.runtime.planner_view import memory_options, runtime_layout

    eff = runtime_layout(parallel)
    opts = memory_options(None, compute_dtype, spec, eff, device)
    if device == "cpu":
        opts = opts.with_(runtime_context_bytes=CPU_RANK_CONTEXT_BYTES, comm_buffer_bytes=0)
    return estimate_memory(spec, eff, 1 << 62, opts).peak_bytes


def memory_need(spec: ModelSpec, parallel: ParallelConfig, world: int, compute_dtype: str,
                device: str | None = None) -> MemoryNeed:
    """What ``world`` ranks of this run need, against what this machine has free."""
    dev = None if device == "cpu" else device_available_bytes()
    if dev is None:
        return MemoryNeed(peak_per_rank(spec, parallel, compute_dtype, "cpu"), world, host_available_bytes(), "host")
    free, name = dev
    return MemoryNeed(peak_per_rank(spec, parallel, compute_dtype, ACCELERATOR), 1, free, name)


def proxy_that_fits(spec: ModelSpec, parallel: ParallelConfig, need: MemoryNeed, compute_dtype: str) -> dict | None:
    """The largest proxy (fewest size reductions first: depth, then width, then experts) whose need
    fits; its shrink flags, or None when even the smallest does not."""
    device = "cpu" if need.where == "host" else ACCELERATOR
    layers = [n for n in PROXY_LAYERS if n < spec.layers and n >= parallel.pp] or [spec.layers]
    hidden = [None] + [h for h in PROXY_HIDDEN if h < spec.hidden]
    experts = [None] + ([e for e in PROXY_EXPERTS if spec.moe and e < spec.moe.experts and e % parallel.ep == 0]
                        if spec.moe else [])
    best = None
    for n in [None] + layers:
        for h in hidden:
            for e in experts:
                flags = {k: v for k, v in (("layers", n), ("hidden", h), ("experts", e)) if v is not None}
                if not flags:
                    continue
                try:
                    proxy = spec.shrink(**flags)
                    per = peak_per_rank(proxy, parallel, compute_dtype, device)
                except DayzeroError:
                    continue
                if per * need.ranks_sharing <= HEADROOM * need.available_bytes / 2:  # half: room to spare
                    size = params_total(proxy)
                    if best is None or size > best[0]:
                        best = (size, flags)
    return None if best is None else best[1]


def check_memory(spec: ModelSpec, parallel: ParallelConfig, world: int, compute_dtype: str,
                 device: str | None = None, override: str | None = "--skip-memory-check") -> MemoryNeed:
    """Raise :class:`InsufficientMemory` (the numbers, and the proxy flags that would fit) when
    the run cannot fit; return the need otherwise."""
    need = memory_need(spec, parallel, world, compute_dtype, device)
    if need.fits:
        return need
    share = f"{need.ranks_sharing} rank(s) x {need.per_rank_bytes / GiB:,.2f} GiB" if need.ranks_sharing > 1 else \
        f"{need.per_rank_bytes / GiB:,.2f} GiB per rank"
    msg = (f"{spec.name} with {parallel.describe()} needs about {share} = {need.need_bytes / GiB:,.2f} GiB "
           f"(planner, {compute_dtype}), but the {need.where} has {need.available_bytes / GiB:,.2f} GiB available "
           f"({HEADROOM:.0%} usable)")
    flags = proxy_that_fits(spec, parallel, need, compute_dtype)
    if flags:
        msg += "; train a proxy of the same architecture: " + " ".join(f"--{k} {v}" for k, v in flags.items())
    else:
        msg += "; use more devices (shard with --zero 3, --tp or --pp) or a smaller model"
    if override:
        msg += f" (or {override} to run anyway)"
    raise InsufficientMemory(msg)
