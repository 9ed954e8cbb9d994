"""Helpers shared by the CLI verbs: output, formatting and the option types every verb uses."""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from dayzero.jsonable import dumps
from dayzero.specs.accelerator_variant import power_capped
from dayzero.specs.cluster import Cluster, resolve_cluster
from dayzero.specs.layout_fields import BOOL, BY_NAME, INT, INT_OR_NULL, layout_fields, searched

console = Console()
err_console = Console(stderr=True)


def emit_json(obj: Any) -> None:
    """Print one JSON document on stdout (no rich markup, no wrapping). A document holding a
    non-finite number is refused (one line naming the field) rather than printed with ``null``
    in its place: an output that cannot be trusted is not written."""
    from dayzero.errors import DayzeroError
    from dayzero.jsonable import finite, plain

    found: list[str] = []
    clean = finite(plain(obj), found=found)
    if found:
        raise DayzeroError(f"the result's {found[0]} is not a finite number"
                           + (f" (and {len(found) - 1} more)" if len(found) > 1 else "")
                           + "; an input is out of range: check the sizes, rates and counts given")
    sys.stdout.write(dumps(clean) + "\n")


def human(n: float, unit: str = "") -> str:
    """1234567 -> '1.23 M'; keeps three significant digits."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "—"
    for div, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.3g} {suffix}{unit}"
    return f"{n:.3g} {unit}".rstrip()


def commas(n: int) -> str:
    return f"{n:,}"


# -- shared options ----------------------------------------------------------------------------

DeviceOpt = Annotated[Optional[str], typer.Option("--device", help="Device type to run on, e.g. cpu or npu (default: "
                                                                   "the current accelerator, else cpu).")]
BackendOpt = Annotated[Optional[str], typer.Option("--backend", help="Process-group backend, e.g. gloo (default: "
                                                                     "PyTorch's for the device: gloo on cpu, the "
                                                                     "vendor's on an accelerator).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]
ClusterOpt = Annotated[Optional[str], typer.Option("--cluster", "-c", help="Cluster preset (dayzero hardware) or YAML "
                                                                           "file.")]
AcceleratorOpt = Annotated[Optional[str], typer.Option("--accelerator", "-a", help="Accelerator name, e.g. h100, "
                                                                                   "910b, mi300x.")]
DevicesOpt = Annotated[Optional[int], typer.Option("--devices", "-n", help="Device count with --accelerator.")]
DevicesPerNodeOpt = Annotated[Optional[int], typer.Option("--devices-per-node", help="Devices per node with "
                                                                                     "--accelerator.")]
InterNodeOpt = Annotated[Optional[float], typer.Option("--inter-node-gbps", help="Scale-out Gbit/s per device with "
                                                                                 "--accelerator.")]


PowerLimitOpt = Annotated[Optional[float], typer.Option(
    "--power-limit", help="Watts each device is capped at (nvidia-smi -pl): peak FLOP/s scale as (W/TDP)^(1/3) "
    "(docs/performance.md, accelerator variants).")]


DocLenOpt = Annotated[Optional[int], typer.Option(
    "--doc-len", min=1, help="Packed sequences with per-document causal masks (reset attention mask): the mean "
    "document length in tokens; attention is priced over documents, not the window.")]


def with_documents(spec, doc_len: int | None):
    """``spec`` trained on packed documents of mean length ``doc_len`` (None: unchanged)."""
    return spec if doc_len is None else dataclasses.replace(spec, document_length=doc_len)


def cluster_from_options(cluster: str | None, accelerator: str | None, devices: int | None,
                         devices_per_node: int | None = None, inter_node_gbps: float | None = None,
                         default: str | None = None, power_limit: float | None = None) -> Cluster:
    if not cluster and not accelerator and default:
        cluster = default
    cl = resolve_cluster(cluster, accelerator, devices, devices_per_node, inter_node_gbps)
    if power_limit is None:
        return cl
    capped, note = power_capped(cl.accelerator, power_limit)
    return dataclasses.replace(cl, accelerator=capped, description=f"{cl.description} {note}".strip())


# -- parallel layout options (memory, predict, train, validate) -------------------------------

def field_option(name: str, help: str | None = None):
    """The typer option of a layout field's flag, as declared (dayzero.specs.layout_fields.FIELDS):
    its names and aliases, help, bounds; ``help`` replaces the declared help."""
    f = BY_NAME[name]
    kind = bool if f.json == BOOL else int if f.json in (INT, INT_OR_NULL) else str
    bounds = {k: v for k, v in (("min", f.flag.min), ("max", f.flag.max), ("metavar", f.flag.metavar)) if v is not None}
    option = typer.Option(*f.flag.names, help=help or f.flag.help, **bounds)
    return Annotated[kind if f.flag.default is not None else Optional[kind], option]


PrecisionOpt = field_option("precision")
AttentionKernelOpt = Annotated[str, typer.Option("--attention-kernel", help="fused (cuDNN / FlashAttention-3 class: "
                                                                            "saves log-sum-exp) | flash2 | unfused "
                                                                            "(saves the s x s scores).")]
OverlapSmOpt = Annotated[bool, typer.Option("--overlap-sm/--no-overlap-sm",
                                            help="Every overlapped collective (TP userbuffers, CP ring, "
                                                 "ZeRO-3 prefetch, DP reduce, PP sends) takes its "
                                                 "library's SM share from the compute it hides under "
                                                 "(default: only the EP all-to-all's); see "
                                                 "docs/performance.md.")]
KernelLevelOpt = Annotated[str, typer.Option("--kernel-level", help="The engine's fusion level of norms, RoPE, "
                                                                  "activations: fused (Megatron-Core + Transformer "
                                                                  "Engine, MindSpeed) | compile (torch.compile) | "
                                                                  "eager (PyTorch eager: torchtitan, HF, dayzero's "
                                                                  "runtime); see docs/performance.md.")]


def expands(param: str, flags: list[tuple[str, Any, Any]], pack):
    """Decorator: the verb's parameter ``param`` becomes the keyword options ``flags`` ((name,
    annotation, default), in that order, where ``param`` stood), given back to the verb packed into
    one value by ``pack`` (a callable of the options' keywords)."""
    import functools
    import inspect

    names = [n for n, _, _ in flags]

    def wrap(fn):
        sig = inspect.signature(fn, eval_str=True)
        if param not in sig.parameters:
            raise TypeError(f"{fn.__name__} has no `{param}` parameter")
        params, keyword = [], False
        for p in sig.parameters.values():
            keyword = keyword or p.default is not p.empty or p.name == param
            if p.name == param:
                params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, annotation=a, default=d)
                           for n, a, d in flags]
            else:
                params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if keyword else p)

        @functools.wraps(fn)
        def verb(*args, **kwargs):
            return fn(*args, **{param: pack(**{n: kwargs.pop(n) for n in names if n in kwargs})}, **kwargs)

        verb.__signature__ = sig.replace(parameters=params)
        verb.__annotations__ = {p.name: p.annotation for p in params}
        return verb

    return wrap


def takes_layout(seq_default: int = 4096, seq_help: str | None = None):
    """Decorator for a verb that takes a layout: its ``layout`` parameter becomes the layout flags
    (``--tp`` ... ``--layer-split``, the same names, help and defaults on every verb, as
    dayzero.specs.layout_fields declares them) and reaches the verb as one
    :class:`~dayzero.specs.layout_options.LayoutOptions`."""
    from dayzero.specs.layout_options import LayoutOptions

    return expands("layout", [(f.name, field_option(f.name, seq_help if f.name == "seq" else None),
                               seq_default if f.name == "seq" else f.flag.default) for f in layout_fields()],
                   LayoutOptions)


def takes_pins():
    """Decorator for ``dayzero plan``: its ``pins`` parameter becomes a comma-separated option per
    searched field (layout_fields.searched), under the flag and aliases the other verbs give that
    field's single value, and reaches the verb as {field: text or None}
    (layout_fields.search_pins reads them)."""
    def pin(f):
        help = f.search.help or f"Only these {f.search.what} (comma-separated)."
        return Annotated[Optional[str], typer.Option(*(n.split("/")[0] for n in f.flag.names), help=help)]

    return expands("pins", [(f.name, pin(f), None) for f in searched() if f.search.what or f.search.help], dict)


# -- the memory recipe (memory, predict, plan) --------------------------------------------------

MomentsOpt = Annotated[str, typer.Option("--moments", help="Dtype of AdamW's two moments: fp32 (8 B/param) | bf16 "
                                                           "(4 B/param, as DeepSeek-V3; Megatron --exp-avg-dtype "
                                                           "bf16 --exp-avg-sq-dtype bf16).")]
ActFp8Opt = Annotated[bool, typer.Option("--activation-func-fp8-input-store/--no-activation-func-fp8-input-store",
                                         help="Under --precision fp8, cache the SwiGLU inputs in FP8 too (Megatron's "
                                              "flag; DeepSeek-V3 sec. 3.3.3).")]
Fp8ParamOpt = field_option("fp8_param_gather")
OptimizerOffloadOpt = field_option("optimizer_offload")
ActivationOffloadOpt = field_option("activation_offload_layers")


AllocatorOpt = Annotated[str, typer.Option("--allocator", help="PyTorch's allocator: caching (the default) | "
                                                                "expandable (PYTORCH_CUDA_ALLOC_CONF="
                                                                "expandable_segments:True, as Llama 3 ran): the "
                                                                "fragmentation budget each leaves.")]
MoeProbsOpt = Annotated[str, typer.Option("--moe-probs", help="Where the routing weights are applied: combine (every "
                                                              "expert output kept for the weighted sum) | activation "
                                                              "(folded into the SwiGLU, Megatron-Core "
                                                              "--moe-apply-probs-on-input / DeepSeek-V3).")]


def memory_recipe(moments: str = "fp32", act_fp8: bool = False, fp8_params: bool = False,
                  optimizer_offload: bool = False, activation_offload: int = 0, allocator: str = "caching",
                  moe_probs: str = "combine") -> dict:
    """MemoryOptions keywords of ``--moments``, ``--activation-func-fp8-input-store``,
    ``--fp8-param-gather``, ``--optimizer-offload``, ``--activation-offload``, ``--allocator`` and
    ``--moe-probs`` (the defaults give none, so each verb's own defaults stay)."""
    from dayzero.errors import ConfigError
    from dayzero.planner.memory.memory_options import MOMENT_BYTES

    if moments not in MOMENT_BYTES:
        from dayzero.names import did_you_mean

        raise ConfigError("--moments", None, f"must be {' or '.join(MOMENT_BYTES)}, got {moments!r}"
                          f"{did_you_mean(moments, MOMENT_BYTES)}")
    out: dict = {}
    if moments != "fp32":
        out["optim_bytes"] = MOMENT_BYTES[moments]
    if act_fp8:
        out["act_func_fp8_input"] = True
    if fp8_params:
        out["fp8_params"] = True
    if optimizer_offload:
        out["optimizer_offload"] = True
    if activation_offload:
        from dayzero.planner.memory.activation_offload import check_activation_offload

        check_activation_offload(activation_offload)
        out["activation_offload_layers"] = activation_offload
    for flag, value, allowed, key in (("--allocator", allocator, ("caching", "expandable"), "allocator"),
                                      ("--moe-probs", moe_probs, ("combine", "activation"), "moe_probs")):
        if value not in allowed:
            raise ConfigError(flag, None, f"must be {' or '.join(allowed)}, got {value!r}")
        if value != allowed[0]:
            out[key] = value
    return out


# -- time, energy and cost of training (predict, plan, day0, compare) -------------------------

TokensOpt = Annotated[str, typer.Option("--tokens", help="Tokens to train on: 15T, 300B, 1e12, 2.5e11 (K, M, B, T "
                                                         "suffixes).")]
PriceOpt = Annotated[Optional[float], typer.Option("--price-per-device-hour", help="Price of one device-hour (any "
                                                                                   "currency); adds the cost.")]
PueOpt = Annotated[Optional[float], typer.Option("--pue", help="Data-centre power usage effectiveness (>= 1; default: "
                                                               "the Uptime Institute 2024 survey average, 1.56).")]
HostOverheadOpt = Annotated[Optional[float], typer.Option("--host-overhead", help="Host power (CPUs, memory, NICs) per "
                                                          "device as a fraction of device power (default: the "
                                                          "system's documented power less its devices').")]
ElectricityOpt = Annotated[Optional[float], typer.Option("--electricity-price", help="Price of one facility kWh "
                                                         "(same currency as the device-hour); adds the energy cost.")]
FailuresOpt = Annotated[Optional[str], typer.Option("--failures", help="Your incident log (CSV: timestamp,component,"
                                                    "devices) refits the interruption rates (default: Llama 3's "
                                                    "by component).")]
DEFAULT_TOKENS = "1T"

_SCALE = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parse_tokens(text: str, flag: str = "--tokens") -> float:
    """'15T' -> 1.5e13, '300B' -> 3e11, '1e12' -> 1e12 (suffixes K, M, B or G, T, any case; a
    positive finite count)."""
    from dayzero.errors import ConfigError

    s = str(text).strip().replace(",", "").replace("_", "")
    suffix = s[-1:].upper() if s[-1:].isalpha() and s[-1:].upper() in _SCALE else ""
    try:
        value = float(s[:-1] if suffix else s) * _SCALE[suffix]
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 1):
        raise ConfigError(flag, None, f"expected a token count such as 15T, 300B or 1e12, got {text!r}")
    return value


def cost_options(tokens: str = DEFAULT_TOKENS, price_per_device_hour: float | None = None, pue: float | None = None,
                 host_overhead: float | None = None, electricity_price: float | None = None,
                 failures: str | None = None):
    """CostOptions from the CLI's training-cost flags (each checked there, one line on bad input)."""
    from dayzero.planner.failures import load_incidents
    from dayzero.planner.training_cost import CostOptions

    return CostOptions(tokens=parse_tokens(tokens), price_per_device_hour=price_per_device_hour, pue=pue,
                       host_overhead=host_overhead, electricity_per_kwh=electricity_price,
                       failure_rates=load_incidents(failures) if failures else None)


# -- what a verb did with the model's config (inspect, memory, predict, plan) ------------------

from dayzero.report.model_notes import model_notes  # noqa: E402  (re-exported for the verbs)

TrustRemoteCodeOpt = Annotated[bool, typer.Option(
    "--trust-remote-code", help="Run the modeling_*.py a model directory ships (derive the model from its code).")]


def print_model_notes(spec) -> None:
    """The same, as lines on stderr (stdout keeps the verb's own output), each wrapped to the
    console at spaces under a hanging indent (a path or a key is never broken)."""
    from dayzero.cli.render import hanging

    notes = model_notes(spec)
    width = err_console.width
    if notes["derived_from_modeling_code"]:
        err_console.print(hanging("", f"{spec.name}: model_type '{spec.model_type}' derived from its own modeling "
                                  f"code (transformers, meta device): {notes['params_module_tree']:,} parameters",
                                  width, "dim"), highlight=False)
    for n in notes["config_notes"]:  # how the config was read (what was assumed, a multimodal config's language model)
        err_console.print(hanging("config: ", n, width), highlight=False)
    if notes["derived_from_modeling_code"]:
        for a in notes["approximations"]:
            err_console.print(hanging("approximation: ", a, width), highlight=False)
    keys = notes["unused_config_keys"]
    if keys:
        err_console.print(hanging("config keys not used: ", ", ".join(keys), width), highlight=False)
