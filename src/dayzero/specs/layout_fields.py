"""The layout vocabulary, declared once: every :class:`ParallelConfig` field with its flags, help,
value kind, flag default, plan-file type check, next-step spelling, search pin and whether
``dayzero train`` / ``validate`` carry it.

Everything that speaks a layout reads :data:`FIELDS`: the fields of
:class:`~dayzero.specs.layout_options.LayoutOptions` and the typer options of the verbs that take a
layout (``cli.common.takes_layout``), ``dayzero plan``'s comma-separated pins and the fields of
:class:`~dayzero.planner.search.search_space.SearchSpace` (:func:`search_pins`), the next-step flags
(:func:`dayzero.specs.layout_flags.layout_flags`), the plan-file type checks and the fitted layout
of ``train --plan`` / ``validate --plan`` (:mod:`dayzero.specs.plan_layout`). A new field is one
row here plus its physics (``ParallelConfig``, ``layout_rules``, the grid column, the planner's
memory and time terms); ``tests/specs/test_layout_fields.py`` walks every row through each reader.

No typer here: the CLI layer turns a :class:`Flag` into a typer option.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass
from dataclasses import fields as dataclass_fields
from typing import Any, Callable, Mapping

from dayzero.errors import ConfigError
from dayzero.specs.parallel import (
    DEFAULT_MODULES,
    DENSE_ORDER,
    RECOMPUTE_MODULES,
    RECOMPUTES,
    ParallelConfig,
)

# the JSON value kinds of a plan file's ``parallel`` object (plan_layout.checked_fields); the values a
# string field takes are specs.parallel's tables (RECOMPUTES, SCHEDULES, ...), which layout_rules checks
INT, INT_OR_NULL, STR, BOOL, INTS, STRS = "int", "int or null", "str", "bool", "ints", "strs"
# how layout_flags writes a field back: always, when away from its default (and from what the
# other fields imply), or never (no verb it writes for takes the flag)
ALWAYS, WHEN_SET, NEVER = "always", "when set", "never"
# how ``dayzero plan`` reads a comma-separated pin of a searched field
PIN_INTS, PIN_WORDS, PIN_LOWER_WORDS, PIN_BOOLS = "ints", "words", "lower words", "bools"
PIN_MODULE_SETS = "module sets"
# what ParallelConfig.to_dict adds to a plan file beside the fields (integers, checked as such)
DERIVED_INTS = ("microbatches", "world", "edp")


@dataclass(frozen=True)
class Flag:
    """The field as one value on the command line. ``names``: the flag, then its aliases (Megatron's
    spellings); a switch is ``--x/--no-x``. ``default``: the flag's default (None: derived, e.g. dp
    from the devices). ``layout``: one of the layout flags every layout verb takes (LayoutOptions,
    ``cli.common.takes_layout``); else a flag some verbs declare themselves (``--precision``,
    ``--rank-order``, the memory switches). ``train``: ``dayzero train`` takes the flag (the layout
    flags and ``--precision``). A tuple field is given as comma-separated text."""

    names: tuple[str, ...]
    help: str
    default: Any = None
    min: int | None = None
    max: int | None = None
    metavar: str | None = None
    layout: bool = True
    train: bool = True

    @property
    def long(self) -> str:
        """The flag's own name (``--sequence-parallel`` of ``--sequence-parallel/--no-sequence-parallel``)."""
        return self.names[0].split("/")[0]


@dataclass(frozen=True)
class Search:
    """How ``dayzero plan`` searches the field: ``default`` is SearchSpace's option list (None: derived
    from the model and the cluster in ``SearchSpace.resolve``); ``parse`` how a comma-separated pin is
    read; ``what`` names the options in the pin's help ("Only these {what} (comma-separated)."), or
    ``help`` is the whole help; neither: the pin comes from a flag of its own (``--rank-order``)."""

    default: Any
    parse: str
    what: str | None = None
    help: str | None = None


@dataclass(frozen=True)
class Field:
    """One ParallelConfig field. ``json``: its value kind in a plan file; ``json_min``: the least
    value a plan file may hold where the layout rules do not say; ``writes``: how the next-step
    commands write it (``implied``: values the other fields already imply, left out); ``search``:
    None where ``dayzero plan`` does not pin it; ``runtime``: what a value away from the default
    asks that dayzero's runtime (``dayzero train`` / ``validate``) does not run, and ``keep_off``
    the ``dayzero plan`` flag that plans without it; empty: the runtime runs the field (the values
    it refuses within such a field, cp > 1 or etp > 1, are planner.engines.DAYZERO's limits,
    checked before any rank starts)."""

    name: str
    json: str
    flag: Flag
    writes: str = WHEN_SET
    search: Search | None = None
    runtime: str = ""
    keep_off: str = ""
    json_min: int | None = None
    implied: Callable[[Mapping[str, Any]], tuple] | None = None

    @property
    def default(self) -> Any:
        """ParallelConfig's default of the field."""
        return ParallelConfig.__dataclass_fields__[self.name].default


def _pipeline_default(p: Mapping[str, Any]) -> tuple:
    return ("interleaved" if p.get("vpp", 1) > 1 else "1f1b",)


def _one_exchange(p: Mapping[str, Any]) -> tuple:
    return (p.get("cp_comm"),) if p.get("cp", 1) == 1 else ()  # cp 1 exchanges nothing


def _core_attn(p: Mapping[str, Any]) -> tuple:
    return ((), DEFAULT_MODULES)  # selective recompute without modules is the attention core


def _deg(name: str, aliases: tuple[str, ...], help: str, what: str, writes: str = WHEN_SET) -> Field:
    return Field(name, INT, Flag((f"--{name}", *aliases), help, 1, min=1), writes, Search(None, PIN_INTS, what))


_RECOMPUTE_MODULES_HELP = (
    "With selective recompute, the modules recomputed, comma-separated (Megatron --recompute-modules): "
    f"{', '.join(RECOMPUTE_MODULES)}. Default core_attn; giving modules implies --recompute selective.")
_RECOMPUTE_MODULES_PIN = (
    "Module sets selective recompute is tried with, comma between sets, + inside one (e.g. "
    f"core_attn,core_attn+moe_act+layernorm); modules: {', '.join(RECOMPUTE_MODULES)}. Default: core_attn; "
    "core_attn+moe_act+layernorm; + mla_up_proj, those that apply to the model.")

# In the order the layout verbs list their flags (and the next-step commands write them).
FIELDS: tuple[Field, ...] = (
    _deg("tp", ("--tensor-model-parallel-size",), "Tensor-parallel degree.", "tensor-parallel degrees", ALWAYS),
    _deg("pp", ("--pipeline-model-parallel-size",), "Pipeline-parallel degree.", "pipeline degrees", ALWAYS),
    Field("dp", INT, Flag(("--dp",), "Data-parallel degree (default: devices / (tp*pp*cp))."), ALWAYS,
          Search(None, PIN_INTS, "data-parallel degrees (dp = devices / (tp*pp*cp))")),
    _deg("cp", ("--context-parallel-size",), "Context-parallel degree.", "context-parallel degrees"),
    Field("cp_comm", STR, Flag(("--cp-comm", "--cp-comm-type"), "How context parallelism exchanges the sequence "
                               "(Megatron --cp-comm-type): p2p (ring attention, overlapped) | a2a (DeepSpeed-Ulysses "
                               "all-to-all of Q/K/V/O, heads split over cp).", "p2p"),
          search=Search(None, PIN_WORDS, "context-parallel exchanges (p2p: ring attention, a2a: Ulysses all-to-all; "
                        "default: every one the engine runs, the faster per layout)"), implied=_one_exchange),
    _deg("ep", ("--expert-model-parallel-size",), "Expert-parallel degree (folded over dp x cp).",
         "expert-parallel degrees"),
    _deg("etp", ("--expert-tensor-parallel-size",), "Tensor-parallel degree inside experts.",
         "expert tensor-parallel degrees"),
    _deg("vpp", ("--virtual-pipeline-model-parallel-size",), "Virtual pipeline stages per rank (interleaved 1F1B).",
         "virtual stages per rank"),
    Field("mbs", INT, Flag(("--mbs", "--micro-batch-size"), "Micro-batch size (sequences).", 1, min=1), ALWAYS,
          Search((1, 2, 4, 8), PIN_INTS, "micro-batch sizes")),
    Field("gbs", INT, Flag(("--gbs", "--global-batch-size"), "Global batch size (sequences; default mbs*dp).",
                           min=1), ALWAYS),
    Field("seq", INT, Flag(("--seq", "--seq-length"), "Sequence length (tokens).", 4096, min=1), ALWAYS),
    Field("zero", INT, Flag(("--zero",), "ZeRO stage: 0 none, 1 optimizer, 2 +gradients, 3 +parameters.", 1, min=0,
                            max=3), ALWAYS, Search((0, 1, 2, 3), PIN_INTS, "ZeRO stages")),
    Field("recompute", STR, Flag(("--recompute",), "Activation recompute: none | selective | full.", "none"),
          search=Search(RECOMPUTES, PIN_WORDS, "recompute modes (none, selective, full)")),
    Field("recompute_modules", STRS, Flag(("--recompute-modules",), _RECOMPUTE_MODULES_HELP),
          search=Search(None, PIN_MODULE_SETS, help=_RECOMPUTE_MODULES_PIN), implied=_core_attn),
    Field("recompute_layers", INT_OR_NULL, Flag(("--recompute-layers",), "With --recompute full: only the first N "
                                                "layers of each model chunk (Megatron --recompute-method block "
                                                "--recompute-num-layers N).", min=1)),
    Field("sequence_parallel", BOOL, Flag(("--sequence-parallel/--no-sequence-parallel",),
                                          "Megatron sequence parallelism with TP.", False),
          search=Search((True,), PIN_BOOLS, "sequence-parallel settings (on, off)")),
    Field("fp8_param_gather", BOOL, Flag(
        ("--fp8-param-gather/--no-fp8-param-gather",), "Under --precision fp8/fp4, keep the decoder layers' weights "
        "in FP8 (1 B/param, no separate FP8 copy; FP32 master as before) and all-gather them in FP8 (Megatron's flag, "
        "TE fp8_model_init).", False, layout=False, train=False),
          runtime="FP8 parameter storage and gathers (it trains bf16)", keep_off="--no-fp8-param-gather"),
    Field("optimizer_offload", BOOL, Flag(
        ("--optimizer-offload/--no-optimizer-offload",), "FP32 master weights and AdamW moments in host memory, Adam "
        "on the CPU (Megatron --optimizer-cpu-offload, ZeRO-Offload); the step pays the host Adam and PCIe.", False,
        layout=False, train=False),
          runtime="the optimizer on the host (it keeps it on the device)", keep_off="--no-optimizer-offload"),
    Field("activation_offload_layers", INT, Flag(
        ("--activation-offload",), "Keep the saved activations of the first N layers of each model chunk in host "
        "memory between forward and backward (Megatron --cpu-offloading --cpu-offloading-num-layers N); each "
        "micro-batch pays the PCIe copies compute does not hide. 0: off.", 0, metavar="N", layout=False,
        train=False),
          runtime="saved activations on the host (it keeps them on the device)", keep_off="--no-activation-offload",
          json_min=0),
    Field("precision", STR, Flag(("--precision",), "Compute precision: bf16 | fp8.", "bf16", layout=False),
          runtime="an FP8 or FP4 recipe (it computes in bf16 or fp32)", keep_off="--precision bf16"),
    Field("schedule", STR, Flag(("--schedule",), "Pipeline schedule: 1f1b | interleaved | gpipe."),
          search=Search(None, PIN_LOWER_WORDS, "pipeline schedules (1f1b: vpp 1, interleaved: vpp > 1, gpipe)"),
          implied=_pipeline_default),
    Field("layer_split", INTS, Flag(("--layer-split",), "Layers per (virtual) stage, comma-separated, e.g. "
                                    "5,6,6,5.")),
    # only predict, plan and export take --rank-order (so the next steps leave it out)
    Field("rank_order", STR, Flag(("--rank-order",), "Rank layout, fastest dim first.", DENSE_ORDER, layout=False,
                                  train=False),
          NEVER, Search((DENSE_ORDER,), PIN_WORDS), keep_off=f"--rank-order {DENSE_ORDER}",
          runtime=f"ranks numbered other than {DENSE_ORDER} (its device mesh)"),
)
BY_NAME: dict[str, Field] = {f.name: f for f in FIELDS}


def layout_fields() -> tuple[Field, ...]:
    """The fields every layout verb takes as flags, in their order (LayoutOptions' fields)."""
    return tuple(f for f in FIELDS if f.flag.layout)


def searched() -> tuple[Field, ...]:
    """The fields ``dayzero plan`` searches (SearchSpace's option lists), in declaration order."""
    return tuple(f for f in FIELDS if f.search is not None)


def runtime_refused() -> tuple[Field, ...]:
    """The fields dayzero's runtime (``dayzero train`` / ``validate``) runs only at their defaults."""
    return tuple(f for f in FIELDS if f.runtime)


def not_train_flags() -> tuple[Field, ...]:
    """The fields ``dayzero train`` has no flag for (the memory switches, activation offload, rank order)."""
    return tuple(f for f in FIELDS if not f.flag.train)


def with_fields(decls: Mapping[str, tuple[str, Any]]):
    """Class decorator, applied under ``@dataclass``: the dataclass fields ``decls`` (name ->
    (annotation, default)) come first, before the class's own annotated fields."""

    def add(cls):
        own = dict(cls.__dict__.get("__annotations__", {}))
        cls.__annotations__ = {**{n: t for n, (t, _) in decls.items()}, **own}
        for n, (_, default) in decls.items():
            setattr(cls, n, default)
        return cls

    return add


def option_fields() -> dict[str, tuple[str, Any]]:
    """LayoutOptions' fields: each layout flag's Python type and default (a tuple field as text)."""
    out = {}
    for f in layout_fields():
        kind = "bool" if f.json == BOOL else "int" if f.json in (INT, INT_OR_NULL) else "str"
        out[f.name] = (kind if f.flag.default is not None else f"{kind} | None", f.flag.default)
    return out


def search_fields() -> dict[str, tuple[str, Any]]:
    """SearchSpace's option lists: each searched field's default list (None: derived)."""
    return {f.name: ("tuple | None", f.search.default) for f in searched()}


def is_default(obj, name: str) -> bool:
    """Whether dataclass ``obj``'s field ``name`` holds its default."""
    f = next(x for x in dataclass_fields(obj) if x.name == name)
    return f.default is not MISSING and getattr(obj, name) == f.default


# -- dayzero plan's pins ---------------------------------------------------------------------------

def _words(text: str) -> tuple[str, ...]:
    return tuple(w.strip() for w in text.split(",") if w.strip())


def parse_pin(field: Field, text: str | None) -> tuple | None:
    """The option list a comma-separated pin of ``field`` gives (None: not pinned); a malformed one
    is a one-line ConfigError naming the flag."""
    if not text:
        return None
    name, how = field.flag.long, field.search.parse
    if how == PIN_INTS:
        try:
            vals = tuple(int(x) for x in text.split(","))
        except ValueError:
            raise ConfigError(name, None, f"expected comma-separated integers, got {text!r}") from None
        if any(v < 0 for v in vals):
            raise ConfigError(name, None, f"values must be >= 0, got {text!r}")
        return vals
    if how == PIN_BOOLS:
        table = {"on": True, "off": False, "true": True, "false": False, "1": True, "0": False}
        words = _words(text)
        if any(w.lower() not in table for w in words):
            raise ConfigError(name, None, f"expected on, off or both (on,off), got {text!r}")
        return tuple(table[w.lower()] for w in words)
    if how == PIN_MODULE_SETS:  # comma between sets, + inside one
        sets = tuple(tuple(m.strip() for m in w.split("+") if m.strip()) for w in _words(text))
        bad = sorted({m for ms in sets for m in ms if m not in RECOMPUTE_MODULES})
        if bad:
            raise ConfigError(name, None, f"{', '.join(bad)} not among {', '.join(RECOMPUTE_MODULES)}")
        return sets
    return _words(text.lower() if how == PIN_LOWER_WORDS else text)


def search_pins(texts: Mapping[str, str | None]) -> dict[str, tuple]:
    """SearchSpace keywords of ``dayzero plan``'s pins (field name -> the flag's text; unset: None)."""
    out = {}
    for name, text in texts.items():
        value = parse_pin(BY_NAME[name], text)
        if value is not None:
            out[name] = value
    return out


# -- next-step commands ----------------------------------------------------------------------------

def written(f: Field, p: Mapping[str, Any]) -> list[str]:
    """``f`` of the layout ``p`` as flags (empty where the next step leaves it to its default)."""
    if f.writes == NEVER:
        return []
    value = p.get(f.name, f.default)
    if f.json in (INTS, STRS):
        value = tuple(value or ())
    if f.writes == WHEN_SET and (value == f.default or value in (f.implied(p) if f.implied else ())
                                 or (f.json in (INTS, STRS) and not value)):
        return []
    if f.json == BOOL:
        return [f.flag.long] if value else []
    text = ",".join(str(x) for x in value) if isinstance(value, tuple) else str(value)
    return [f.flag.long, text]
