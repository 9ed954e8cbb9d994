"""Device health while a job runs: temperature, power, utilisation and memory, from the vendor's
own source, chosen at run time by :func:`dayzero.runtime.device.telemetry_source`:

* ``nvml``: NVIDIA's management library (``pip install nvidia-ml-py``, module ``pynvml``);
* ``npu-smi``: Ascend's driver tool (``npu-smi info -t common -i N`` and ``-t usages``), with
  memory from PyTorch's allocator through the device module; untested (no Ascend host in CI);
* ``psutil``: host counters on CPU (utilisation, memory, the hottest sensor; no power).

A missing source (library not installed, tool not on PATH, a call that fails) is reported once
per :class:`TelemetryReader` on stderr and leaves its fields None: never an exception.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Callable

from dayzero.runtime import device as devices

FIELDS = ("temperature_c", "power_w", "utilization_pct", "memory_used_bytes", "memory_total_bytes")


@dataclass
class TelemetryReader:
    """Reads one device's counters; ``note`` receives each distinct problem once."""

    device: object  # torch.device
    note: Callable[[str], None] = lambda msg: print(f"dayzero: note: {msg}", file=sys.stderr)
    _reported: set = field(default_factory=set)

    @property
    def source(self) -> str:
        return devices.telemetry_source(self.device.type)

    def read(self) -> dict:
        """``{"source", *FIELDS}``, None where the source does not report a field."""
        out: dict = {"source": self.source, **dict.fromkeys(FIELDS)}
        read = {"nvml": _nvml, "npu-smi": _npu_smi, "psutil": _psutil}[self.source]
        try:
            out.update(read(self.device))
        except _Missing as e:
            out.update(e.partial)
            self._report(str(e))
        return out

    def _report(self, msg: str) -> None:
        if msg not in self._reported:
            self._reported.add(msg)
            self.note(f"telemetry: {msg}")


def telemetry(device=None, note: Callable[[str], None] | None = None) -> dict:
    """One reading of ``device`` (default: the current device); see :class:`TelemetryReader`."""
    device = device if device is not None else devices.current_device()
    reader = TelemetryReader(device) if note is None else TelemetryReader(device, note)
    return reader.read()


class _Missing(Exception):
    """The source is not available here (the message says what to install); ``partial``: the
    fields read another way."""

    def __init__(self, msg: str, partial: dict | None = None):
        super().__init__(msg)
        self.partial = partial or {}


def _nvml(device) -> dict:
    try:
        import pynvml
    except ImportError:
        raise _Missing("NVML is not installed (pip install nvidia-ml-py); no temperature, power or utilisation") \
            from None
    try:
        pynvml.nvmlInit()
        # NVML counts every GPU on the node; the index is torch's (matches without CUDA_VISIBLE_DEVICES)
        h = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        return {"temperature_c": float(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)),
                "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1e3,
                "utilization_pct": float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu),
                "memory_used_bytes": int(mem.used), "memory_total_bytes": int(mem.total)}
    except pynvml.NVMLError as e:
        raise _Missing(f"NVML failed ({e})") from None


def _npu_smi(device) -> dict:
    tool = shutil.which("npu-smi")
    out: dict = {}
    stats = devices.memory_stats(device)
    if stats.total is not None and stats.free is not None:
        out.update(memory_used_bytes=stats.total - stats.free, memory_total_bytes=stats.total)
    if tool is None:
        raise _Missing("npu-smi is not on PATH (it ships with the Ascend driver); no temperature, power or utilisation",
                       out)
    text = ""
    for kind in ("common", "usages"):
        try:
            text += subprocess.run([tool, "info", "-t", kind, "-i", str(device.index or 0)], capture_output=True,
                                   text=True, timeout=10, check=True).stdout
        except (OSError, subprocess.SubprocessError) as e:
            raise _Missing(f"npu-smi failed ({type(e).__name__})", out) from None
    return {**out, **parse_npu_smi(text)}


def parse_npu_smi(text: str) -> dict:
    """Fields of ``npu-smi info -t common/usages`` output (``Name : value`` lines)."""
    out: dict = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        m = re.match(r"\s*(-?\d+(?:\.\d+)?)", value)
        if not sep or not m:
            continue
        key, v = key.strip().lower(), float(m.group(1))
        if key.startswith("temperature"):
            out["temperature_c"] = v
        elif key.startswith("power"):
            out["power_w"] = v
        elif key.startswith("aicore usage"):
            out["utilization_pct"] = v
    return out


def _psutil(device) -> dict:
    try:
        import psutil
    except ImportError:
        raise _Missing("psutil is not installed (pip install psutil); no host utilisation, memory or temperature") \
            from None
    vm = psutil.virtual_memory()
    out = {"utilization_pct": float(psutil.cpu_percent(interval=0.1)),
           "memory_used_bytes": int(vm.total - vm.available),
           "memory_total_bytes": int(vm.total)}
    sensors = getattr(psutil, "sensors_temperatures", lambda: {})() or {}
    temps = [t.current for entries in sensors.values() for t in entries if t.current is not None]
    if temps:
        out["temperature_c"] = float(max(temps))
    return out
