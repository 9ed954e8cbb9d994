"""Backend manifests: which ATen operators (and fused kernels) a backend's library provides.

Schema (YAML; see docs/ops.md)::

    name: my-npu                      # required
    description: ...                  # optional, free text
    source: ...                       # optional, where the list comes from
    ops: [aten.mm.default, ...]       # required: operator overloads, as str(torch.ops.aten.mm.default)
    dtypes:                           # optional: per-op dtypes its kernel accepts (all, if absent)
      aten.mm.default: [bfloat16, float16, float32]
    fused: [attention, rms_norm]      # optional: fused kernels, from FUSED_KERNELS

A call is supported when its overload is listed and, if the op has a ``dtypes`` entry, every
dtype of its tensor inputs is listed there. Shipped manifests: ``cuda`` and ``cpu`` (generated
from the installed PyTorch's kernels by :func:`emit_manifest`) and ``example-npu``.
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError, field_validator, model_validator

from dayzero.errors import ConfigError, DayzeroError
from dayzero.inputs import parse_yaml, read_text
from dayzero.runtime.device import REFERENCE_DEVICE_TYPE

# fused kernels a manifest may name, and what each replaces (the patterns ops/fusion.py detects)
FUSED_KERNELS = {
    "attention": "scores GEMM + scale + mask + softmax (+ dropout) + context GEMM in one kernel (FlashAttention)",
    "rms_norm": "RMSNorm (square, mean, rsqrt, scale; optionally the residual add before it)",
    "layer_norm": "LayerNorm (mean, variance, normalize, affine)",
    "swiglu": "SiLU(gate) * up (SwiGLU activation)",
    "rotary_embedding": "rotary position embedding on q and k (rotate-half, cos/sin multiply-add)",
    "elementwise_chain": "any chain of elementwise ops between GEMMs (a fusing compiler, e.g. Inductor/Triton)",
}
# ATen operators that are themselves fused kernels: their presence provides the fused kernel
FUSED_ATEN = {
    "attention": ("aten._scaled_dot_product_flash_attention.default",
                  "aten._scaled_dot_product_flash_attention_for_cpu.default",
                  "aten._scaled_dot_product_efficient_attention.default",
                  "aten._scaled_dot_product_cudnn_attention.default"),
    "rms_norm": ("aten._fused_rms_norm.default",),
    "layer_norm": ("aten.native_layer_norm.default",),
}
DTYPE_NAMES = ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "complex64",
               "complex128", "int64", "int32", "int16", "int8", "uint8", "bool")
# the manifests under ops/manifests, the reference device type's first (the default)
DEFAULT_MANIFEST = REFERENCE_DEVICE_TYPE
SHIPPED = (DEFAULT_MANIFEST,
           *sorted(p.name.removesuffix(".yaml") for p in (resources.files("dayzero.ops") / "manifests").iterdir()
                                     if p.name.endswith(".yaml") and p.name != f"{DEFAULT_MANIFEST}.yaml"))
_OP_RE = re.compile(r"^[A-Za-z_]\w*\.[A-Za-z_]\w*\.[A-Za-z_]\w*$")


class BackendManifest(BaseModel):
    """One backend's operator library."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    source: str = ""
    ops: list[str]
    dtypes: dict[str, list[str]] = {}
    fused: list[str] = []
    _opset: frozenset = PrivateAttr(default_factory=frozenset)

    def model_post_init(self, context) -> None:
        self._opset = frozenset(self.ops)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        return v

    @field_validator("ops")
    @classmethod
    def _ops(cls, v: list[str]) -> list[str]:
        bad = [o for o in v if not _OP_RE.match(o)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not an operator overload name like 'aten.mm.default'")
        return v

    @field_validator("fused")
    @classmethod
    def _fused(cls, v: list[str]) -> list[str]:
        bad = [f for f in v if f not in FUSED_KERNELS]
        if bad:
            raise ValueError(f"unknown fused kernel {bad[0]!r}; known: {', '.join(FUSED_KERNELS)}")
        return v

    @model_validator(mode="after")
    def _dtypes(self) -> "BackendManifest":
        ops = set(self.ops)
        for op, names in self.dtypes.items():
            if op not in ops:
                raise ValueError(f"dtypes names {op!r}, which is not in ops")
            bad = [d for d in names if d not in DTYPE_NAMES]
            if bad:
                raise ValueError(f"dtypes[{op}]: unknown dtype {bad[0]!r}; known: {', '.join(DTYPE_NAMES)}")
        return self

    def supports(self, op: str, dtypes: tuple[str, ...] = ()) -> bool:
        if op not in self._opset:
            return False
        allowed = self.dtypes.get(op)
        return allowed is None or all(d in allowed for d in dtypes)

    def why_not(self, op: str, dtypes: tuple[str, ...] = ()) -> str:
        if op not in self._opset:
            return "not in manifest"
        missing = [d for d in dtypes if d not in self.dtypes.get(op, dtypes)]
        return f"dtype {', '.join(missing)} not supported" if missing else ""

    def without(self, *ops: str) -> "BackendManifest":
        """A copy with ``ops`` removed (what-if analysis, tests)."""
        drop = set(ops)
        return BackendManifest(name=f"{self.name}-minus-{len(drop)}", description=self.description, source=self.source,
                        ops=[o for o in self.ops if o not in drop],
                        dtypes={k: v for k, v in self.dtypes.items() if k not in drop}, fused=list(self.fused))

    def to_yaml(self, header: str = "") -> str:
        body = {"name": self.name, "description": self.description, "source": self.source,
                "fused": list(self.fused), "dtypes": dict(self.dtypes), "ops": list(self.ops)}
        body = {k: v for k, v in body.items() if v not in ("", [], {})}
        text = yaml.safe_dump(body, sort_keys=False, width=110, default_flow_style=False)
        return "".join(f"# {line}\n" for line in header.splitlines()) + text


def load_manifest(ref: str | BackendManifest) -> BackendManifest:
    """A shipped manifest name (cuda, cpu, example-npu) or a path to a YAML file."""
    if isinstance(ref, BackendManifest):
        return ref
    path = Path(ref)
    if ref in SHIPPED and not path.exists():
        text, source = (resources.files("dayzero.ops") / "manifests" / f"{ref}.yaml").read_text(), f"manifest {ref}"
    elif path.exists():
        source = str(path)
        text = read_text(path, "a backend manifest YAML (dayzero ops --emit-manifest KEY writes one)")
    else:
        from dayzero.names import did_you_mean

        raise ConfigError(ref, None, f"no such manifest{did_you_mean(ref, SHIPPED)}; use one of {', '.join(SHIPPED)} "
                          "or a YAML file "
                          "(dayzero ops --emit-manifest KEY writes one)")
    return parse_manifest(text, source)


def parse_manifest(text: str, source: str = "manifest") -> BackendManifest:
    raw = parse_yaml(text, source)
    if not isinstance(raw, dict):
        raise ConfigError(source, None, f"expected a mapping with 'name' and 'ops', got {type(raw).__name__}")
    try:
        return BackendManifest(**raw)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or None
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            msg = "is missing (a manifest needs 'name' and 'ops')"
        elif err["type"] == "extra_forbidden":
            msg = "is not a manifest field; fields: name, description, source, ops, dtypes, fused"
        raise ConfigError(source, field, msg) from None
    except TypeError as e:
        raise ConfigError(source, None, f"malformed manifest: {e}") from None


# -- generating manifests from PyTorch ---------------------------------------------------------

_COMPOSITE = ("CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")


def emit_manifest(dispatch_key: str, source: str = "auto", name: str | None = None) -> tuple[BackendManifest, str]:
    """Operators with a kernel for ``dispatch_key`` (plus PyTorch's backend-agnostic composite
    kernels, which run on every backend). ``dispatch_key`` is a key (``CUDA``, ``PrivateUse1``) or
    a device type (``cuda``; ``npu`` once torch_npu has renamed PrivateUse1). ``source``:
    ``dispatcher`` (kernels registered in this process: CPU, or an out-of-tree backend whose
    extension PyTorch autoloads or the caller imported), ``native_functions`` (the declarations of
    the installed PyTorch, e.g. CUDA on a CPU-only build), or ``auto``: the dispatcher when it holds
    >= 100 ATen kernels for the key, and always for a key native_functions.yaml does not know
    (PrivateUse1: only the extension can say what it implements). Returns (manifest, header text)."""
    import torch

    from dayzero.ops._torch_compat import (
        backend_extensions,
        native_functions_path,
        privateuse1_name,
        registrations,
    )
    from dayzero.ops._torch_compat import dispatch_key as resolve_key

    if source not in ("auto", "dispatcher", "native_functions"):
        raise DayzeroError(f"--manifest-source {source!r}: expected auto, dispatcher or native_functions")
    if dispatch_key.lower() == "core":
        return _core_aten_manifest(name)
    key = resolve_key(dispatch_key)
    out_of_tree = key == "PrivateUse1"
    # the device type the key runs as, for the manifest's name and the messages (npu, not PrivateUse1)
    device_name = privateuse1_name() if out_of_tree else key.lower()
    live = [o for o in registrations(key) if o.startswith("aten.")]
    declared = bool(_native_functions_ops(native_functions_path(), key, composite=False))
    if source == "auto":
        source = "dispatcher" if len(live) >= 100 or not declared else "native_functions"
    extensions = backend_extensions()
    loaded = f"; extensions loaded: {', '.join(extensions)}" if extensions else ""
    if source == "dispatcher":
        if not live:
            hint = ("install the backend's PyTorch extension (PyTorch loads those that declare a 'torch.backends' "
                    "entry point at import, unless TORCH_DEVICE_BACKEND_AUTOLOAD=0) or import it before dayzero")
            raise DayzeroError(f"no ATen kernels are registered for dispatch key {key!r} (device type "
                               f"{device_name!r}) in this process{loaded or '; no backend extension is loaded'}: "
                               + hint + ("" if out_of_tree else ", or use --manifest-source native_functions"))
        ops = set(live)
        for composite in _COMPOSITE:
            ops |= {o for o in registrations(composite) if o.startswith("aten.")}
        origin = f"kernels registered for {key} ({device_name}) in the dispatcher of torch {torch.__version__}{loaded}"
    else:
        if not declared:
            raise DayzeroError(f"dispatch key {key!r} has no kernels in native_functions.yaml of torch "
                               f"{torch.__version__}; keys there include CPU, CUDA, MPS, XPU, Meta"
                               + ("; an out-of-tree backend's kernels are in the dispatcher: use "
                                  "--manifest-source dispatcher with its extension installed" if out_of_tree else ""))
        ops = _native_functions_ops(native_functions_path(), key)
        origin = f"native_functions.yaml of torch {torch.__version__} (kernels declared for {key})"
    fused = sorted(k for k, names in FUSED_ATEN.items() if any(n in ops for n in names))
    manifest = BackendManifest(name=name or device_name, source=origin, ops=sorted(ops), fused=fused,
                               description=f"ATen operators with a {key} kernel, plus PyTorch's "
                                           "backend-agnostic CompositeExplicitAutograd kernels")
    header = (f"Generated by `dayzero ops --emit-manifest {dispatch_key}` from {origin}.\n"
              "Regenerate after upgrading torch or the backend's extension. Schema: docs/ops.md.")
    return manifest, header


def _core_aten_manifest(name: str | None) -> tuple[BackendManifest, str]:
    """The Core ATen opset (operators tagged ``core`` in native_functions.yaml: what PyTorch asks a
    new backend to implement; https://docs.pytorch.org/docs/stable/torch.compiler_ir.html) plus the
    backend-agnostic composite kernels. A starting point for a new accelerator's manifest."""
    import torch

    from dayzero.ops._torch_compat import native_functions_path

    entries = _native_entries(native_functions_path())
    core = {_manifest_name(e["func"].split("(", 1)[0]) for e in entries if "core" in _tags(e)}
    ops = core | _native_functions_ops(native_functions_path(), "CompositeExplicitAutograd")
    origin = f"native_functions.yaml of torch {torch.__version__}: Core ATen opset + composite kernels"
    manifest = BackendManifest(name=name or "core-aten", source=origin, ops=sorted(ops),
                        description="PyTorch's Core ATen opset plus backend-agnostic CompositeExplicitAutograd kernels")
    header = (f"Generated by `dayzero ops --emit-manifest core` from {origin}.\n"
              "Edit to match your backend: remove what its library lacks, add dtypes and fused kernels.")
    return manifest, header


def _tags(entry: dict) -> set[str]:
    tags = entry.get("tags") or []
    return {t.strip() for t in (tags.split(",") if isinstance(tags, str) else tags)}


@lru_cache(maxsize=2)
def _native_entries(path: str) -> list[dict]:
    return yaml.load(Path(path).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _native_functions_ops(path: str, key: str, composite: bool = True) -> set[str]:
    """Operators native_functions.yaml gives a ``key`` kernel (and, with ``composite``, the
    backend-agnostic CompositeExplicitAutograd ones, including autogen'd out= variants)."""
    entries = _native_entries(path)
    keys_of: dict[str, set[str]] = {}
    delegate: dict[str, str] = {}
    autogen: dict[str, list[str]] = {}
    for e in entries:
        fname = e["func"].split("(", 1)[0]
        keys: set[str] = set()
        for k in (e.get("dispatch") or {}):
            keys |= {s.strip() for s in k.split(",")}
        if e.get("ufunc_inner_loop"):  # torchgen generates CPU and CUDA kernels from the ufunc loop
            keys |= {"CPU", REFERENCE_DEVICE_TYPE.upper()}  # the reference device's dispatch key
        keys_of[fname] = keys
        if e.get("structured_delegate"):
            delegate[fname] = e["structured_delegate"]
        if e.get("autogen"):
            autogen[fname] = [s.strip() for s in str(e["autogen"]).split(",")]
    wanted = {key, *_COMPOSITE} if composite else {key}

    def has(fname: str) -> bool:
        if keys_of.get(fname, set()) & wanted:
            return True
        return fname in delegate and bool(keys_of.get(delegate[fname], set()) & wanted)

    out = set()
    for fname in keys_of:
        if has(fname):
            out.add(_manifest_name(fname))
        if composite:  # autogen'd out= variants get generated CompositeExplicitAutogradNonFunctional kernels
            out |= {_manifest_name(a) for a in autogen.get(fname, [])}
    return out


def _manifest_name(fname: str) -> str:
    base, _, overload = fname.partition(".")
    return f"aten.{base}.{overload or 'default'}"
