"""The device module (dayzero.runtime.device) and per-vendor telemetry, on CPU.

The rule ``test_no_device_names_outside_device_module`` enforces: in the Python code of
``dayzero/runtime``, ``dayzero/validate``, ``dayzero/ops`` and ``dayzero/cli`` (the code that runs
or drives a device; the planner and specs are a hardware catalog and may name vendors), no module
other than ``runtime/device.py`` contains, outside comments and docstrings,
  * an identifier or attribute named ``cuda``, ``npu``, ``nccl`` or ``hccl`` (any case:
    ``torch.cuda``, ``ProfilerActivity.CUDA``), nor an import of a third-party module whose dotted
    name has such a part or ``_``-separated word (``torch.cuda``, ``torch_npu``);
  * a string literal that is such a name, alone or as a device string (``"cuda"``, ``"nccl"``,
    ``"npu:0"``): what ``torch.device``, ``init_process_group`` and ``device.type ==`` take.
Prose that mentions a vendor (help text, error messages, the nccl-tests importer's tool name) is
not device code and passes.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import types

import pytest
import torch

from dayzero.errors import DayzeroError
from dayzero.runtime import device as devices
from dayzero.runtime.telemetry import FIELDS, TelemetryReader, parse_npu_smi
from helpers.paths import REPO

SRC = REPO / "src" / "dayzero"
SCANNED = ("runtime", "validate", "ops", "cli")
WORDS = {"cuda", "npu", "nccl", "hccl"}
DEVICE_STRING = re.compile(r"(cuda|npu|nccl|hccl)(:\d+)?", re.IGNORECASE)


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def device_names(source: str) -> list[tuple[int, str]]:
    """(line, what) for every use of a device or backend name, by the rule in this module's docstring."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id.lower() in WORDS:
            hits.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute) and node.attr.lower() in WORDS:
            hits.append((node.lineno, f".{node.attr}"))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] != "dayzero":
                mods += [f"{node.module}.{a.name}" for a in node.names]
            for m in mods:
                words = {w.lower() for part in m.split(".") for w in part.split("_")}
                if m.split(".")[0] != "dayzero" and WORDS & words:
                    hits.append((node.lineno, f"import {m}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if DEVICE_STRING.fullmatch(node.value.strip()):
                hits.append((node.lineno, repr(node.value)))
    return hits


def test_rule_catches_device_code():
    code = ('import torch_npu\nimport torch\nfrom torch import cuda\nx = torch.cuda.is_available()\n'
            'b = "nccl"\nd = torch.device("npu:0")\na = ProfilerActivity.CUDA\n'
            'def f():\n    """Runs on CUDA with NCCL."""\n    return "see nccl-tests"  # cuda\n')
    whats = [w for _, w in device_names(code)]
    assert whats == sorted(whats, key=whats.index)  # deterministic order is not required, content is
    assert {"import torch_npu", "import torch.cuda", ".cuda", "'nccl'", "'npu:0'", ".CUDA"} <= set(whats)
    assert not any("tests" in w or "NCCL" in w for w in whats)


def test_no_device_names_outside_device_module():
    found = []
    for sub in SCANNED:
        for path in sorted((SRC / sub).rglob("*.py")):
            if path == SRC / "runtime" / "device.py":
                continue
            for line, what in device_names(path.read_text()):
                found.append(f"{path.relative_to(SRC)}:{line}: {what}")
    assert not found, "device or backend named outside dayzero.runtime.device:\n" + "\n".join(found)


def test_device_module_imports_without_torch():
    code = "import sys, dayzero.runtime.device; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
    assert out.stdout.strip() == "False", out.stderr


# -- choosing ------------------------------------------------------------------------------------

def test_resolve_on_cpu_host():
    assert devices.resolve(environ={}) == devices.Accelerator("cpu", "gloo")
    assert devices.resolve("cpu", environ={}).backend == torch.distributed.Backend.default_device_backend_map["cpu"]
    assert devices.resolve(environ={devices.BACKEND_ENV: "fake"}).backend == "fake"
    assert devices.resolve(backend="mpi", environ={devices.BACKEND_ENV: "fake"}).backend == "mpi"
    assert devices.resolve(environ={devices.DEVICE_ENV: "cpu"}).is_cpu


def test_default_backend_comes_from_pytorch_map():
    for dev, backend in torch.distributed.Backend.default_device_backend_map.items():
        assert devices.default_backend(dev) == backend
    with pytest.raises(DayzeroError, match="--backend"):
        devices.default_backend("no-such-device")


@pytest.mark.parametrize("name, match", [("bogus", "no such device type"), ("cpu:1", "device type only"),
                                         ("meta", "cannot run here")])
def test_resolve_rejects_unusable_devices(name, match):
    with pytest.raises(DayzeroError, match=match) as e:
        devices.resolve(name, environ={})
    assert "\n" not in str(e.value)


def test_exported_sets_and_restores_environment(monkeypatch):
    monkeypatch.setenv(devices.BACKEND_ENV, "before")
    monkeypatch.delenv(devices.DEVICE_ENV, raising=False)
    with devices.Accelerator("cpu", "gloo").exported():
        assert devices.resolve() == devices.Accelerator("cpu", "gloo")
        assert os.environ[devices.DEVICE_ENV] == "cpu"
    assert os.environ[devices.BACKEND_ENV] == "before" and devices.DEVICE_ENV not in os.environ


def test_process_group_device_only_for_the_devices_own_backend():
    cpu = torch.device("cpu")
    assert devices.process_group_device(devices.Accelerator("cpu", "gloo"), cpu) is None
    acc = next(iter((d, b) for d, b in torch.distributed.Backend.default_device_backend_map.items() if d != "cpu"))
    dev = torch.device(acc[0], 0)
    assert devices.process_group_device(devices.Accelerator(*acc), dev) == dev
    assert devices.process_group_device(devices.Accelerator(acc[0], "gloo"), dev) is None


# -- memory, timing, random state on CPU ---------------------------------------------------------

def test_cpu_memory_sync_timer_rng():
    cpu = devices.bind(devices.Accelerator("cpu", "gloo"))
    st = devices.memory_stats(cpu)
    assert st.peak_allocated == devices.host_peak_rss() > 0 and st.free is None and st.context is None
    assert devices.peak_allocated_bytes(cpu) >= st.peak_allocated
    devices.synchronize(cpu)
    devices.reset_peak(cpu)
    t = devices.Timer(cpu)
    t.start()
    torch.ones(1000).sum()
    assert 0 < t.stop() < 10
    s = devices.rng_state(cpu)
    a = torch.rand(3)
    devices.set_rng_state(s, cpu)
    assert torch.equal(a, torch.rand(3))
    s2 = devices.current_rng_state()
    b = torch.rand(3)
    devices.restore_current_rng_state(s2)
    assert torch.equal(b, torch.rand(3))
    assert devices.compute_dtype(devices.Accelerator("cpu", "gloo")) == "fp32"
    assert devices.alloc_conf("cpu") is None
    conf = {"PYTORCH_XYZ_ALLOC_CONF": "expandable_segments:True"}
    assert devices.alloc_conf("xyz", conf) == "expandable_segments:True"
    assert devices.alloc_conf("xyz", {devices.ALLOC_CONF_ENV: "a", "PYTORCH_XYZ_ALLOC_CONF": "b"}) == "a"


def test_context_is_device_memory_outside_the_allocator():
    st = devices.MemoryStats(allocated=1, peak_allocated=2, reserved=30, peak_reserved=40, free=50, total=100)
    assert st.context == 20


# -- telemetry -----------------------------------------------------------------------------------

def test_missing_source_reported_once(monkeypatch):
    monkeypatch.setitem(sys.modules, "psutil", None)  # import fails as when not installed
    notes = []
    reader = TelemetryReader(torch.device("cpu"), notes.append)
    first, second = reader.read(), reader.read()
    assert first == second == {"source": "psutil", **dict.fromkeys(FIELDS)}
    assert len(notes) == 1 and "psutil" in notes[0]


def test_psutil_source(monkeypatch):
    vm = types.SimpleNamespace(total=100, available=40)
    temp = types.SimpleNamespace(current=51.0)
    fake = types.SimpleNamespace(virtual_memory=lambda: vm, cpu_percent=lambda interval: 12.5,
                                 sensors_temperatures=lambda: {"k10temp": [temp]})
    monkeypatch.setitem(sys.modules, "psutil", fake)
    got = TelemetryReader(torch.device("cpu"), lambda m: pytest.fail(m)).read()
    assert got == {"source": "psutil", "temperature_c": 51.0, "power_w": None, "utilization_pct": 12.5,
                   "memory_used_bytes": 60, "memory_total_bytes": 100}


def test_nvml_source_and_its_failure(monkeypatch):
    class NVMLError(Exception):
        pass

    fake = types.SimpleNamespace(
        NVMLError=NVMLError, NVML_TEMPERATURE_GPU=0, nvmlInit=lambda: None, nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=3, total=8),
        nvmlDeviceGetTemperature=lambda h, k: 60, nvmlDeviceGetPowerUsage=lambda h: 250_000,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=97))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpu = torch.device(next(d for d, s in devices._TELEMETRY.items() if s == "nvml"), 1)
    assert TelemetryReader(gpu).read() == {"source": "nvml", "temperature_c": 60.0, "power_w": 250.0,
                                           "utilization_pct": 97.0, "memory_used_bytes": 3, "memory_total_bytes": 8}

    def broken():
        raise NVMLError("Driver Not Loaded")

    fake.nvmlInit = broken
    notes = []
    reader = TelemetryReader(gpu, notes.append)
    assert reader.read()["power_w"] is None and reader.read()["temperature_c"] is None
    assert notes == ["telemetry: NVML failed (Driver Not Loaded)"]


def test_parse_npu_smi():
    text = ("        NPU ID                         : 0\n        Temperature(C)                 : 45\n"
            "        Power Dissipation(W)           : 91.3\n        Aicore Usage Rate(%)           : 37\n"
            "        Health Status                  : OK\n")
    assert parse_npu_smi(text) == {"temperature_c": 45.0, "power_w": 91.3, "utilization_pct": 37.0}


# -- an out-of-tree accelerator without kernels ---------------------------------------------------

def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=str(SRC.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in (devices.DEVICE_ENV, devices.BACKEND_ENV):
        env.pop(k, None)
    return env


RENAMED = """
import sys, types, torch
torch.utils.rename_privateuse1_backend("fakeaccel")
if {module}:  # a device module that sees one device, but no kernels behind it
    mod = types.ModuleType("torch.fakeaccel")
    mod.is_available = lambda: True
    mod.device_count = lambda: 1
    mod.current_device = lambda: 0
    mod.set_device = lambda i: None
    mod.is_initialized = lambda: True
    torch._register_device_module("fakeaccel", mod)
from dayzero.cli.app import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("module, verb, extra, says", [
    (False, "train", [], "cannot run here"),  # no device module: stopped in the CLI
    (True, "train", [], "no process-group backend"),  # a device module but no backend registered
    (True, "train", ["--backend", "gloo"], "cannot run a kernel"),  # reaches the rank: no kernels
    (False, "calibrate", [], "cannot run here"),
])
def test_privateuse1_backend_without_kernels_is_one_line(module, verb, extra, says, tmp_path):
    args = (["train", "tiny-llama", "--steps", "1", "--seq", "16", "--layers", "1", "--hidden", "64",
             "--vocab", "257", "--quiet", "--skip-memory-check"] if verb == "train" else ["calibrate", "--quick"])
    args += ["--device", "fakeaccel", *extra]
    out = subprocess.run([sys.executable, "-c", RENAMED.format(module=module), *args], capture_output=True,
                         text=True, env=_env(), cwd=tmp_path, timeout=300)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert len(lines) == 1 and lines[0].startswith("dayzero: error: ") and "fakeaccel" in lines[0], out.stderr
    assert says in lines[0], lines[0]
