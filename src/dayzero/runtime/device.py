"""The one place that knows device types and process-group backends.

Every other module asks this one: which device this process computes on, which backend its
process group uses, how much memory the device holds, how to wait for it, time on it and save its
random state. Everything goes through PyTorch's device-generic API (``torch.accelerator``,
``torch.get_device_module``, ``torch.Event``), so CUDA, Ascend (torch_npu registers device type
``npu`` and backend ``hccl``), XPU and any PrivateUse1 accelerator run the same code; where a
backend lacks a generic call, its device module's function of the same name is the one fallback.

Which device: ``--device`` (``DAYZERO_DEVICE`` for ranks the CLI starts), else
``torch.accelerator.current_accelerator()``, else CPU. Which backend: ``--backend``
(``DAYZERO_BACKEND``), else PyTorch's own device-to-backend map
(``torch.distributed.Backend.default_device_backend_map``: cpu -> gloo, and whatever a vendor
extension registers for its device). Importing this module imports nothing but the standard
library; torch is imported on first use.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import time
from dataclasses import dataclass
from typing import Any, Mapping

from dayzero.errors import DayzeroError

DEVICE_ENV = "DAYZERO_DEVICE"
BACKEND_ENV = "DAYZERO_BACKEND"
# PyTorch >= 2.9 reads one allocator setting for every device; vendors keep their own too
ALLOC_CONF_ENV = "PYTORCH_ALLOC_CONF"
_EXTENSIONS = {"npu": "torch_npu"}  # the package that registers a device type with PyTorch
# where each vendor's health counters come from (dayzero.runtime.telemetry); psutil elsewhere
_TELEMETRY = {"cuda": "nvml", "npu": "npu-smi"}
# the device type whose kernel set is the porting reference (``dayzero ops``' default manifest)
REFERENCE_DEVICE_TYPE = "cuda"


@dataclass(frozen=True)
class Accelerator:
    """What a rank computes on: a torch device type and the process-group backend for it."""

    type: str  # "cpu", or the accelerator's torch device type
    backend: str  # the torch.distributed backend

    @property
    def is_cpu(self) -> bool:
        return self.type == "cpu"

    def env(self) -> dict[str, str]:
        """The environment that makes ranks started from this process choose the same."""
        return {DEVICE_ENV: self.type, BACKEND_ENV: self.backend}

    @contextlib.contextmanager
    def exported(self):
        """Within the block, ranks this process starts (and :func:`resolve` here) choose this
        device and backend; the environment is restored after."""
        saved = {k: os.environ.get(k) for k in self.env()}
        os.environ.update(self.env())
        try:
            yield self
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@dataclass(frozen=True)
class MemoryStats:
    """Device memory of one device, bytes; None where the backend does not report a number."""

    allocated: int | None
    peak_allocated: int | None
    reserved: int | None
    peak_reserved: int | None
    free: int | None
    total: int | None

    @property
    def context(self) -> int | None:
        """What the device holds outside PyTorch's allocator (runtime context, communicators)."""
        if None in (self.free, self.total, self.reserved):
            return None
        return max(0, self.total - self.free - self.reserved)


# -- choosing ------------------------------------------------------------------------------------

def default_backend(device_type: str) -> str:
    """PyTorch's process-group backend for ``device_type`` (what a vendor extension registered)."""
    from torch.distributed import Backend

    known = Backend.default_device_backend_map
    if device_type in known:
        return known[device_type]
    raise DayzeroError(f"no process-group backend is registered for device {device_type!r} (known: "
                       f"{', '.join(f'{d} -> {b}' for d, b in sorted(known.items()))}); pass --backend NAME")


def resolve(device: str | None = None, backend: str | None = None,
            environ: Mapping[str, str] | None = None) -> Accelerator:
    """The device and backend to run on: the arguments, else the environment, else the current
    accelerator (CPU without one). Raises DayzeroError, one line, when that device cannot run."""
    import torch

    environ = os.environ if environ is None else environ
    kind = device or environ.get(DEVICE_ENV) or None
    if kind is None:
        acc = torch.accelerator.current_accelerator()
        kind = "cpu" if acc is None else acc.type
    kind = _device_type(kind)
    if kind != "cpu":
        _check_present(kind)
    return Accelerator(kind, backend or environ.get(BACKEND_ENV) or default_backend(kind))


def _device_type(name: str) -> str:
    import torch

    try:
        d = torch.device(name)
    except RuntimeError:
        raise DayzeroError(f"--device {name!r}: PyTorch knows no such device type (install the vendor's "
                           "PyTorch extension, e.g. torch_npu for Ascend, or use cpu)") from None
    if d.index is not None:
        raise DayzeroError(f"--device {name!r}: give the device type only; each rank takes device LOCAL_RANK")
    return d.type


def _check_present(kind: str) -> None:
    """The device type has a device module and at least one device."""
    try:
        n = _call("device_count", kind)
    except (RuntimeError, AttributeError, ModuleNotFoundError, NotImplementedError) as e:
        raise DayzeroError(f"device {kind!r} cannot run here: PyTorch has no device module or kernels for it "
                           f"({_first_line(e)}); {_install_hint(kind)}") from None
    if not n:
        raise DayzeroError(f"device {kind!r}: no device is visible to this process; {_install_hint(kind)}")


def _install_hint(kind: str) -> str:
    pkg = _EXTENSIONS.get(kind)
    return (f"install {pkg}" if pkg else "install the vendor's PyTorch extension") + " or pass --device cpu"


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__


def has_accelerator() -> bool:
    """Whether a usable accelerator is present (host buffers are then worth pinning)."""
    import torch

    try:
        return bool(torch.accelerator.is_available())
    except (RuntimeError, AttributeError):
        return False


def current_device():
    """The current accelerator's current device (CPU without one)."""
    import torch

    if not has_accelerator():
        return torch.device("cpu")
    acc = torch.accelerator.current_accelerator()
    return torch.device(acc.type, _call("current_device_index", acc.type))


def bind(acc: Accelerator, local_rank: int = 0):
    """This rank's torch.device (device ``local_rank`` of ``acc``), made current and checked to
    run a kernel, so a backend without kernels is one line here rather than a traceback later."""
    import torch

    if acc.is_cpu:
        return torch.device("cpu")
    device = torch.device(acc.type, local_rank)
    try:
        _call("set_device_index", acc.type, local_rank, fallback="set_device")
        torch.zeros(1, device=device).add_(1)
    except (RuntimeError, AttributeError, ModuleNotFoundError, NotImplementedError) as e:
        raise DayzeroError(f"device {device} cannot run a kernel ({_first_line(e)}); "
                           f"{_install_hint(acc.type)}") from None
    return device


def process_group_device(acc: Accelerator, device) -> Any:
    """The ``device_id`` for ``init_process_group``: the rank's device when the backend is the
    one registered for that device (its communicators bind to one device), else None (CPU, or
    a CPU backend such as gloo chosen with ``--backend`` on an accelerator)."""
    from torch.distributed import Backend

    if acc.is_cpu or Backend.default_device_backend_map.get(acc.type) != acc.backend:
        return None
    return device


# -- the generic calls ---------------------------------------------------------------------------

def _call(name: str, device_type: str, *args, fallback: str | None = None):
    """``torch.accelerator.<name>(*args)`` for the current accelerator of ``device_type``; when
    that is missing or unsupported, the device module's ``<fallback or name>``."""
    import torch

    acc = torch.accelerator.current_accelerator()
    if acc is not None and acc.type == device_type:
        try:
            return getattr(torch.accelerator, name)(*args)
        except (AttributeError, NotImplementedError, RuntimeError):
            pass
    return getattr(torch.get_device_module(device_type), fallback or name)(*args)


def telemetry_source(device_type: str) -> str:
    """The telemetry source for a device type: the vendor's management library where one is
    known, psutil (host counters) on CPU and any other device."""
    return _TELEMETRY.get(device_type, "psutil")


COMPUTE_DTYPES = ("bf16", "fp32", "auto")


def compute_dtype(acc: Accelerator, requested: str = "auto") -> str:
    """``--compute-dtype``: bf16 or fp32 as asked; auto is bf16 on an accelerator, fp32 on CPU
    (where bf16 matmuls are slow)."""
    if requested not in COMPUTE_DTYPES:
        from dayzero.errors import ConfigError

        raise ConfigError("--compute-dtype", None, f"must be {', '.join(COMPUTE_DTYPES)}, got {requested!r}")
    if requested != "auto":
        return requested
    return auto_compute_dtype(acc.type)


def auto_compute_dtype(device_type: str) -> str:
    """``--compute-dtype auto`` on a device type: bf16 on an accelerator, fp32 on CPU."""
    return "fp32" if device_type == "cpu" else "bf16"


def device_name(device) -> str:
    """The device's own name (what the catalog resolves), or the CPU's."""
    if device.type == "cpu":
        import platform

        return platform.processor() or platform.machine()
    import torch

    mod = torch.get_device_module(device.type)
    try:
        return str(mod.get_device_properties(device.index or 0).name)
    except (AttributeError, RuntimeError):
        return str(mod.get_device_name(device.index or 0))


def has_grouped_gemm(device) -> bool:
    """Whether the device runs PyTorch's grouped GEMM kernel (``torch.nn.functional.grouped_mm``):
    CUDA devices of compute capability 8.0 or newer (the kernel's own check, SM80+); no other device
    type has it yet."""
    if device.type != "cuda":
        return False
    import torch

    return torch.cuda.get_device_capability(device) >= (8, 0)


def device_total_bytes(device) -> int | None:
    """The device's memory capacity, bytes (None on CPU or where the backend does not say)."""
    return None if device.type == "cpu" else memory_stats(device).total


def synchronize(device) -> None:
    """Wait for the device's queued work (nothing to wait for on CPU)."""
    if device.type != "cpu":
        _call("synchronize", device.type, device)


def memory_stats(device) -> MemoryStats:
    """Allocator and device memory of ``device``; on CPU only the host's peak resident set."""
    if device.type == "cpu":
        return MemoryStats(None, host_peak_rss(), None, None, None, None)
    i = device.index or 0

    def get(name):
        try:
            return int(_call(name, device.type, i))
        except (AttributeError, RuntimeError, NotImplementedError):
            return None

    try:
        free, total = (int(x) for x in _call("get_memory_info", device.type, i, fallback="mem_get_info"))
    except (AttributeError, RuntimeError, NotImplementedError):
        free = total = None
    return MemoryStats(get("memory_allocated"), get("max_memory_allocated"), get("memory_reserved"),
                       get("max_memory_reserved"), free, total)


def peak_allocated_bytes(device) -> int:
    """Peak bytes PyTorch allocated on the device (CPU: the process's peak resident set)."""
    peak = memory_stats(device).peak_allocated
    return int(peak if peak is not None else host_peak_rss())


def reset_peak(device) -> None:
    if device.type != "cpu":
        _call("reset_peak_memory_stats", device.type, device.index or 0)


def host_peak_rss() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # bytes on macOS, KiB on Linux


def alloc_conf(device_type: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The caching-allocator settings in effect for ``device_type`` (e.g. ``expandable_segments:True``):
    PyTorch's device-generic variable, else the vendor's ``PYTORCH_<TYPE>_ALLOC_CONF``."""
    environ = os.environ if environ is None else environ
    if device_type == "cpu":
        return None
    return environ.get(ALLOC_CONF_ENV) or environ.get(f"PYTORCH_{device_type.upper()}_ALLOC_CONF")


# -- timing and random state ---------------------------------------------------------------------

class Timer:
    """Seconds between ``start()`` and ``stop()`` of the work queued on ``device``: device events
    where the backend has them (no host-side wait inside the window), else a synchronised wall clock."""

    def __init__(self, device):
        self.device = device
        self._events = None
        self._t0 = 0.0

    def start(self) -> None:
        import torch

        if self.device.type != "cpu":
            try:
                self._events = (torch.Event(self.device, enable_timing=True), torch.Event(self.device,
                                                                                          enable_timing=True))
                self._events[0].record()
                return
            except (AttributeError, RuntimeError, TypeError, NotImplementedError):
                self._events = None
                synchronize(self.device)
        self._t0 = time.perf_counter()

    def stop(self) -> float:
        if self._events is not None:
            a, b = self._events
            b.record()
            b.synchronize()
            return max(a.elapsed_time(b) / 1e3, 1e-9)
        synchronize(self.device)
        return max(time.perf_counter() - self._t0, 1e-9)


def rng_state(device) -> dict:
    """The random state of torch's CPU generator and, on an accelerator, of its generator;
    keyed by device type, so a checkpoint restores only on the device type that wrote it."""
    import torch

    s = {"torch": torch.get_rng_state()}
    if device.type != "cpu":
        s[device.type] = torch.get_device_module(device.type).get_rng_state(device)
    return s


def set_rng_state(s: dict, device) -> None:
    import torch

    torch.set_rng_state(s["torch"])
    if device.type != "cpu" and device.type in s:
        torch.get_device_module(device.type).set_rng_state(s[device.type], device)


def current_rng_state() -> dict:
    """:func:`rng_state` of the current accelerator when it has been initialised (CPU only otherwise)."""
    import torch

    acc = torch.accelerator.current_accelerator()
    if acc is not None:
        try:
            mod = torch.get_device_module(acc.type)
            if mod.is_available() and getattr(mod, "is_initialized", lambda: True)():
                return rng_state(torch.device(acc.type, _call("current_device_index", acc.type)))
        except (AttributeError, RuntimeError, ModuleNotFoundError):
            pass
    return rng_state(torch.device("cpu"))


def restore_current_rng_state(s: dict) -> None:
    """Restore :func:`current_rng_state`'s dict; an accelerator's entry only on that device type."""
    import torch

    acc = torch.accelerator.current_accelerator()
    device = torch.device("cpu")
    if acc is not None and acc.type in s:
        device = torch.device(acc.type, _call("current_device_index", acc.type))
    set_rng_state(s, device)


# -- profiling -----------------------------------------------------------------------------------

def profiler_activities(device) -> list:
    """Profiler activities that see this device's kernels (CPU alone on CPU)."""
    from torch.profiler import ProfilerActivity

    acts = [ProfilerActivity.CPU]
    if device.type != "cpu":
        # kineto names the activity after the device type (CUDA, XPU, MTIA); PrivateUse1 otherwise
        act = getattr(ProfilerActivity, device.type.upper(), None) or getattr(ProfilerActivity, "PrivateUse1", None)
        if act is not None:
            acts.append(act)
    return acts


def is_comm_event(device, name: str, event_device_type: str, backend: str) -> bool:
    """Whether a profiler event is a collective or transfer: a gloo work item on CPU, else a
    kernel of the backend's library (its name carries the backend's, e.g. ``ncclDevKernel_*``)
    that ran on the device."""
    if device.type == "cpu":
        return name.startswith("gloo:")
    return backend.lower() in name.lower() and event_device_type.lower() != "cpu"
