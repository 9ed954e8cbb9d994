"""Rows of a published-runs file (columns of the shipped ``published_runs_dev.csv``) as planner
inputs: model spec, cluster, parallel layout and options, and the measured tokens/s per device.

Any row is predicted unless it has no throughput, no device count, no architecture (neither a
name dayzero knows nor complete columns: :mod:`row_arch`), a layer type dayzero does not model,
an accelerator outside the catalog, or a layout that cannot run (:data:`SKIP_KINDS`). Every value
the row does not state is a documented default, returned with the case as an
:class:`Assumption` so the report lists it. Reading the sources' conventions (see the data README):

* model: :mod:`row_arch` (names by :mod:`model_names`; else the architecture columns).
* cluster: the accelerator from the catalog, as the row's accelerator text says it ran (a power
  cap "500W", a memory size "96GB", one device per die: :mod:`dayzero.specs.accelerator_variant`);
  ``interconnect`` text read by :mod:`interconnect_text` into the scale-up and scale-out tiers;
  a tier the text leaves open keeps the catalog's rate (a blank column: the catalog's standard node, e.g. a DGX).
* layout: ``tp pp dp cp ep etp vp`` as published; blank means the degree the framework text or
  the model name's annotations state (``TP2``), else 1 (``dp``: devices / (tp pp cp)); a
  blank ``num_accelerators`` is tp x pp x cp x dp. ``fsdp`` (Megatron/NeMo: a shard degree,
  MaxText: the FSDP axis) or an llm-foundry sharding strategy selects ZeRO-3 (FULL_SHARD,
  Megatron FSDP, MaxText) or ZeRO-2 (SHARD_GRAD_OP); a blank ``fsdp`` column defers to
  ``zero_or_dist_optimizer``, then to FSDP/ZeRO words in the text (:mod:`run_features`), then
  ZeRO-1 (Megatron's distributed optimizer). Sequence parallelism is on with tp > 1 unless
  ``sequence_parallel`` says no (the NeMo/Megatron-Bridge recipes' default); TP communication
  overlap is on where Megatron-Core with Transformer Engine ran (NeMo, Megatron-Bridge, Megatron-LM
  from 2024: their performance recipes enable it; not Megatron-DeepSpeed nor 2022 Megatron-LM) or
  where the text says async TP; a blank ``sequence_parallel`` is off outside Megatron; a row that
  names no attention kernel ran Megatron-Core's fused attention, llm-foundry's FlashAttention-2,
  cuDNN's fused attention under JAX, FlashAttention-2 elsewhere from 2023 and the unfused softmax
  before; routing is force-balanced (imbalance 1.0, per the data README).
  Interleaved 1F1B stated without ``vp``: 2 virtual stages per rank (torchtitan's default for
  looped schedules).
* batch: blank ``mbs`` is 1; blank ``gbs`` is total tokens/s x step time / seq when published,
  else mbs x dp x ``grad_accum`` (1 when blank); blank ``seq_len`` is 4096.
* packed documents: notes saying "reset attention mask"/"document masking" with a mean document
  length price attention over documents (``ModelSpec.document_length``); without a length, over
  the window, listed.
* precision: FP8 in any scaling recipe (per-tensor, current, block, MXFP8) or Float8 training
  named in the text runs GEMMs at the FP8 peak, NVFP4 at the FP4 peak, everything else BF16.
* memory: the recompute setting and (Megatron family) the gradient-buffer precision a row leaves
  blank are the cheapest its recipe allows that fit the device (:mod:`row_memory`), listed.
* measured value: ``tokens_per_sec_per_gpu``, else ``tokens_per_sec_total`` / devices, else
  gbs x seq / ``step_time_s`` / devices, else ``tflops_per_gpu`` / model FLOPs per token, counted
  as public formulas count them (Megatron-LM's, PaLM's, torchtitan's: 6 x parameters + full,
  non-causal attention; ``causal`` in ``tflops_definition`` halves the attention term) and
  x 4/3 when the definition counts hardware FLOPs with full recompute (listed: the conversion
  carries the source's FLOP convention).
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, replace
from pathlib import Path

from dayzero.errors import ConfigError, DayzeroError
from dayzero.inputs import read_text
from dayzero.planner.backtest.csv_values import positive, text, whole
from dayzero.planner.backtest.interconnect_text import read_interconnect
from dayzero.planner.backtest.model_names import Candidate, annotations, best_match, parse_name
from dayzero.planner.backtest.row_arch import NoArchitecture, UnsupportedLayers, model_of, table
from dayzero.planner.backtest.row_memory import Engine, settle
from dayzero.planner.backtest.row_metric import has_metric, tokens_from_utilization
from dayzero.planner.backtest.row_text import devices_in, documents_in, tokens_per_batch_in
from dayzero.planner.backtest.run_features import Features, read_features
from dayzero.planner.memory.memory_options import MemoryOptions
from dayzero.planner.perf.comm import CommOptions
from dayzero.planner.perf.kernel_level import engine_kernel_level
from dayzero.planner.perf.perf import PerfOptions
from dayzero.specs import layout_rules
from dayzero.specs.accelerator_variant import apply_variant, read_variant
from dayzero.specs.cluster import Cluster, build_cluster
from dayzero.specs.hardware import Accelerator, resolve_accelerator
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import ParallelConfig, even_split_fills, model_split
from dayzero.specs.presets import reference_data

REQUIRED_COLUMNS = ("id", "model", "accelerator", "num_accelerators", "tp", "pp", "mbs", "gbs", "seq_len", "precision")
SKIP_KINDS = ("no throughput", "no device count", "no architecture", "unsupported layer type",
              "unknown accelerator",  # not in the catalog, or a bandwidth neither the catalog nor the row gives
              "inconsistent layout", "bad value")
DEFAULT_SEQ = 4096
INTERLEAVED_DEFAULT_VP = 2  # torchtitan: looped schedules default to 2 stages per pipeline rank


@dataclass(frozen=True)
class Assumption:
    """A value the row does not state, and what was used instead."""

    # model | interconnect | interconnect not stated | layout | batch | precision | options | memory | throughput
    kind: str
    text: str


@dataclass(frozen=True)
class Case:
    """One predictable row."""

    id: str
    source: str
    spec: ModelSpec
    cluster: Cluster
    parallel: ParallelConfig
    options: PerfOptions
    published: float  # tokens/s per device
    full_layout: bool  # the row states tp and pp (a layout experts picked, not only a sharding strategy)
    model: str = ""  # the architecture as reports name it (preset, table entry, or the row's name)
    recipe: str = ""  # bf16 | fp8 | mxfp8 | fp4: the GEMM precision and its scaling
    assumed: tuple[Assumption, ...] = ()
    source_group: str = ""  # the row's ``source_group`` (one publication series); the source text when blank
    memory: MemoryOptions = MemoryOptions()  # what the run's engine keeps (planner.backtest.row_memory)
    memory_fraction: float = 0.0  # predicted peak / device memory of the layout as settled
    recompute_stated: bool = False  # the row (or its text) states the recompute setting
    engine: str = ""  # the training framework family (:func:`engine_of`): the error band's engine factor

    @property
    def gemm_precision(self) -> str:
        """bf16 | fp8 | fp4: the layout's precision."""
        return self.parallel.precision


@dataclass(frozen=True)
class Skip:
    id: str
    reason: str
    kind: str = "bad value"  # one of SKIP_KINDS


class Unpredictable(DayzeroError):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def default_runs() -> Path:
    """The shipped published-runs file (448 measured training runs; sources in presets/data/README.md)."""
    return reference_data("published_runs_dev.csv")


def read_rows(path: str | Path | None = None) -> list[dict]:
    """The rows of a published-runs CSV (the shipped one when ``path`` is None)."""
    p = default_runs() if path is None else Path(path)
    content = read_text(p, "pass a CSV with the columns of published_runs_dev.csv")
    try:
        rows = list(csv.DictReader(io.StringIO(content, newline="")))
    except csv.Error as e:
        raise ConfigError(str(p), None, f"malformed CSV: {e}") from None
    if not rows:
        raise ConfigError(str(p), None, "no rows; expected a header and one row per published run")
    missing = [c for c in REQUIRED_COLUMNS if c not in rows[0]]
    if missing:
        raise ConfigError(str(p), missing[0], f"column missing; required: {', '.join(REQUIRED_COLUMNS)}")
    return rows


def precision_of(label: str) -> str:
    t = label.lower()
    if "fp4" in t:
        return "fp4"
    if "fp8" in t:
        return "fp8"
    return "bf16"


def recipe_of(label: str, fp8_named: bool = False, mx_named: bool = False) -> str:
    """bf16 | fp8 | mxfp8 | fp4: the GEMM precision and, for FP8, block scaling (MXFP8, 32x32)."""
    prec = precision_of(label)
    if prec == "bf16" and fp8_named:
        prec = "fp8"
    block = re.search(r"mx|block", label, re.I) or (mx_named and precision_of(label) == "bf16")
    return "mxfp8" if prec == "fp8" and block else prec


def published_tokens_per_device(row: dict, devices: int) -> float | None:
    v = positive(row, "tokens_per_sec_per_gpu")
    if v:
        return v
    v = positive(row, "tokens_per_sec_total")
    if v:
        return v / devices
    step, gbs, seq = positive(row, "step_time_s"), whole(row, "gbs"), whole(row, "seq_len")
    if step and gbs and seq:
        return gbs * seq / step / devices
    return None


def _degree(row: dict, key: str, feats: Features, assumed: list[Assumption]) -> int:
    v = whole(row, key)
    if v is not None:
        return v
    stated = feats.degrees.get(key)
    if stated:
        assumed.append(Assumption("layout", f"{key} {stated} from the framework text or the model name"))
        return stated
    return 1


def _zero(row: dict, feats: Features) -> int:
    fsdp = text(row, "fsdp").upper()
    if fsdp in ("FULL_SHARD", "HYBRID_SHARD"):
        return 3
    if fsdp == "SHARD_GRAD_OP":
        return 2
    if fsdp.isdigit():
        return 3 if int(fsdp) > 0 else 1
    z = text(row, "zero_or_dist_optimizer").lower()
    if m := re.search(r"zero[- _]?([0-3])", z):
        return int(m.group(1))
    if re.search(r"\b(?:no|none|false|off)\b", z):
        return 0
    if re.search(r"dist|\b(?:yes|true|on)\b", z):
        return 1
    return 1 if feats.zero is None else feats.zero


def _recompute(row: dict, feats: Features) -> str | None:
    """The stated recompute setting; None when neither the column nor the text states one."""
    r = text(row, "activation_recompute").lower()
    for value in ("full", "selective", "none"):
        if r.startswith(value):
            return value
    return feats.recompute


def _devices(row: dict, assumed: list[Assumption]) -> int:
    """num_accelerators; else tp*pp*cp*dp; else total / per-device figures; else the count the
    row's text states (:func:`row_text.devices_in`)."""
    devices = whole(row, "num_accelerators")
    if devices:
        return devices
    dp = whole(row, "dp")
    if dp:
        devices = whole(row, "tp", 1) * whole(row, "pp", 1) * whole(row, "cp", 1) * dp
        assumed.append(Assumption("layout", f"num_accelerators blank: tp*pp*cp*dp = {devices}"))
        return devices
    for total, per, what in (("tokens_per_sec_total", "tokens_per_sec_per_gpu", "tokens/s"),
                             ("aggregate_pflops", "tflops_per_gpu", "FLOP/s")):
        t, p = positive(row, total), positive(row, per)
        scale = 1e3 if total == "aggregate_pflops" else 1.0
        if t and p and round(t * scale / p) >= 1 and abs(t * scale / p - round(t * scale / p)) < 0.05 * t * scale / p:
            devices = round(t * scale / p)
            assumed.append(Assumption("layout", f"num_accelerators blank: {total} / {per} = {devices} ({what})"))
            return devices
    words = " ; ".join(text(row, k) for k in ("notes", "interconnect", "accelerator", "other_published_metric",
                                               "workload"))
    if found := devices_in(words):
        assumed.append(Assumption("layout", f"num_accelerators blank: {found[0]} from the text {found[1]!r}"))
        return found[0]
    raise Unpredictable("no device count", "num_accelerators blank, and neither dp, total/per-device figures nor "
                                           "the text ('on 1,024 GPUs', '64 nodes x 8') give a count")


def _batch(row: dict, dp: int, assumed: list[Assumption]) -> tuple[int, int, int]:
    mbs, gbs, seq = whole(row, "mbs"), whole(row, "gbs"), whole(row, "seq_len")
    total, step = positive(row, "tokens_per_sec_total"), positive(row, "step_time_s")
    if not seq:
        seq = round(total * step / gbs) if total and step and gbs else DEFAULT_SEQ
        assumed.append(Assumption("batch", f"seq_len blank: {seq}"))
    if not mbs:
        mbs = 1
        assumed.append(Assumption("batch", "mbs blank: 1"))
    stated_tokens = tokens_per_batch_in(f"{text(row, 'notes')} ; {text(row, 'other_published_metric')}")
    if not gbs and stated_tokens and stated_tokens[0] >= seq:
        gbs = max(1, round(stated_tokens[0] / seq))
        assumed.append(Assumption("batch", f"gbs blank: {gbs} from the text {stated_tokens[1]!r} / seq {seq}"))
    if not gbs:
        ga = whole(row, "grad_accum", 1)
        per_step = mbs * dp  # gbs is a whole number of micro-batches per data-parallel rank
        gbs = max(1, round(total * step / seq / per_step)) * per_step if total and step else per_step * ga
        assumed.append(Assumption("batch", f"gbs blank: {gbs}" + (" (total tokens/s x step time / seq)"
                                                                   if total and step else f" (mbs x dp x {ga})")))
    return mbs, gbs, seq


def _layout_default(row: dict, key: str, tp: int, pp: int) -> tuple[int, str] | None:
    """A blank layout column's value from the table's ``layout_defaults`` (with its source)."""
    cands = [Candidate(parse_name(e["name"]), "layout", e["name"], e) for e in table()["layout_defaults"] if key in e]
    match = best_match(text(row, "model"), cands)
    if match is None:
        return None
    e = match.candidate.entry
    when = e.get("when", {})
    src = f"{text(row, 'source')} {text(row, 'source_group')} {text(row, 'framework')}".lower()
    if when.get("tp", tp) != tp or when.get("pp", pp) != pp:
        return None
    if when.get("source_mentions") and not any(w in src for w in when["source_mentions"]):
        return None
    return int(e[key]), e["source"]


def _cluster(row: dict, acc: Accelerator, devices: int, assumed: list[Assumption]) -> Cluster:
    try:
        return _read_cluster(row, acc, devices, assumed)
    except ConfigError as e:  # a bandwidth neither the catalog nor the text gives, or devices vs nodes
        if (e.field or "").endswith("gbytes_per_s"):
            raise Unpredictable("unknown accelerator", f"{e}; or state it in the row's interconnect") from None
        raise Unpredictable("inconsistent layout", str(e)) from None


def _read_cluster(row: dict, acc: Accelerator, devices: int, assumed: list[Assumption]) -> Cluster:
    fabric = text(row, "interconnect")
    intra, inter = acc.intra_node_bw, acc.inter_node_bw
    default = (f"the catalog's {acc.id} tiers ({(intra or 0) / 1e9:g} GB/s scale-up, "
               f"{(inter or 0) / 1e9:g} GB/s per device scale-out)")
    if not fabric:
        assumed.append(Assumption("interconnect not stated", default))
        return build_cluster(acc, devices)
    reading = read_interconnect(fabric, acc.devices_per_node)
    assumed.extend(Assumption("interconnect", a) for a in reading.assumed)
    assumed.extend(Assumption("interconnect", f"{u}; catalog rate kept") for u in reading.unread)
    dpn = reading.devices_per_node
    if reading.inter_gbytes_per_s is None and devices > max(acc.scaleup_domain, dpn or acc.devices_per_node):
        assumed.append(Assumption("interconnect", f"no scale-out figure in {fabric!r}: {default}"))
    return build_cluster(acc, devices, devices_per_node=dpn, inter_node_gbytes_per_s=reading.inter_gbytes_per_s,
                         intra_node_gbytes_per_s=reading.intra_gbytes_per_s, name=f"{acc.id}-{devices} ({fabric})")


def _arch(row: dict):
    try:
        return model_of(row)
    except NoArchitecture as e:
        raise Unpredictable("no architecture", str(e)) from None
    except UnsupportedLayers as e:
        raise Unpredictable("unsupported layer type", str(e)) from None


_WITH_MTP = re.compile(r"\bw/ ?MTP\b|\bwith MTP\b", re.IGNORECASE)


def train_mtp(spec: ModelSpec, notes: str) -> ModelSpec:
    """The model a row trained: its multi-token-prediction modules only where the row says so
    (Megatron-Bridge tags its DeepSeek-V3 rows 'w/ MTP' or 'w/o MTP'); a benchmark row without
    the tag is taken as the main model, as the backtest predicted it before the planner modelled
    MTP."""
    if spec.mtp_layers and not _WITH_MTP.search(notes or ""):
        return replace(spec, mtp_layers=0)
    return spec


def _vpp(row: dict, feats, tp: int, pp: int, assumed: list[Assumption]) -> int:
    """The row's virtual pipeline stages per rank: stated (column or text), else the layout's default
    for the row's source, else torchtitan's default where an interleaved schedule is named; 1
    without a pipeline. Each value not stated is recorded in ``assumed``."""
    vpp = _degree(row, "vp", feats, assumed) if text(row, "vp") or "vp" in feats.degrees else None
    if vpp is None and (found := _layout_default(row, "vp", tp, pp)):
        vpp = found[0]
        assumed.append(Assumption("layout", f"vp blank: {vpp} ({found[1]})"))
    if vpp is None and feats.interleaved and pp > 1:
        vpp = INTERLEAVED_DEFAULT_VP
        assumed.append(Assumption("layout", f"interleaved schedule without vp: {vpp} virtual stages per rank "
                                            "(torchtitan's default)"))
    return (vpp or 1) if pp > 1 else 1


def _dp(row: dict, framework: str, devices: int, model_ranks: int, ep: int) -> int:
    """devices / (tp*pp*cp) (``model_ranks``), refused (Unpredictable) where it does not divide or where
    the stated dp disagrees. MaxText rows give dp x fsdp; both are data-parallel here. DGX Cloud's Grok
    rows count dp without the expert-parallel ranks (tp*pp*cp*dp*ep = devices)."""
    maxtext_fsdp = "maxtext" in framework or "maxtext" in row["model"].lower()
    if devices % model_ranks:
        raise Unpredictable("inconsistent layout", f"{devices} devices not divisible by tp*pp*cp = {model_ranks}")
    dp = devices // model_ranks
    stated_dp = whole(row, "dp")
    sharded = maxtext_fsdp or whole(row, "fsdp", strict=False)
    if stated_dp and stated_dp not in (dp, dp // max(ep, 1)) and not sharded:
        raise Unpredictable("inconsistent layout", f"dp {stated_dp} disagrees with devices / (tp*pp*cp) = {dp}")
    return dp


def _sequence_parallel(row: dict, tp: int, assumed: list[Assumption]) -> bool:
    """Megatron sequence parallelism: on with tp > 1 unless the row says no; a blank column is on only
    for a framework that has it (megatron_sp), recorded in ``assumed`` when taken off."""
    sp_text = text(row, "sequence_parallel").lower()
    sp_blank = not sp_text
    sp = tp > 1 and not re.fullmatch(r"no|false|off|0|n", sp_text) and (not sp_blank or megatron_sp(row))
    if tp > 1 and sp_blank and not sp:
        assumed.append(Assumption("layout", f"sequence parallelism off: {text(row, 'framework') or 'the framework'} "
                                            "has no Megatron sequence parallelism"))
    return sp


def case_of(row: dict) -> Case:
    """Resolve one row; raises DayzeroError (an :class:`Unpredictable` with its kind for the reasons
    of :data:`SKIP_KINDS`) with the reason it cannot be predicted."""
    rid = text(row, "id")
    assumed: list[Assumption] = []
    devices = _devices(row, assumed)
    published = published_tokens_per_device(row, devices)
    if not published and not has_metric(row):
        raise Unpredictable("no throughput", "no tokens/s, total tokens/s, step time, TFLOP/s per GPU, MFU or HFU "
                                             "published")
    acc = resolve_accelerator(row["accelerator"])
    if acc is None:
        raise Unpredictable("unknown accelerator", f"accelerator {row['accelerator']!r} is not in the catalog")
    acc, variant_notes = apply_variant(acc, read_variant(row["accelerator"]))
    assumed.extend(Assumption("accelerator", n) for n in variant_notes)
    arch = _arch(row)
    spec = train_mtp(arch.spec, text(row, "notes"))
    assumed.extend(Assumption("model", n) for n in arch.notes)
    framework = text(row, "framework").lower()
    feats = read_features(text(row, "framework"), annotations(text(row, "model")), text(row, "notes"))
    assumed.extend(Assumption("options", f"{f}: no planner option; predicted without it") for f in feats.not_modelled)
    tp, pp, cp = (_degree(row, k, feats, assumed) for k in ("tp", "pp", "cp"))
    if feats.context_parallel and not text(row, "cp") and "cp" not in feats.degrees:
        assumed.append(Assumption("layout", "context parallelism named without a degree: cp 1"))
    ep, etp = _degree(row, "ep", feats, assumed), _degree(row, "etp", feats, assumed)
    vpp = _vpp(row, feats, tp, pp, assumed)
    dp = _dp(row, framework, devices, tp * pp * cp, ep)
    mbs, gbs, seq = _batch(row, dp, assumed)
    spec = _documents(row, spec, seq, assumed)
    recipe = recipe_of(row["precision"], feats.fp8, feats.mx)
    prec = "fp8" if recipe == "mxfp8" else recipe
    if prec != precision_of(row["precision"]):
        assumed.append(Assumption("precision", f"precision {row['precision']!r} with Float8 training named in the "
                                               f"text: GEMMs in {recipe}"))
    cluster = _cluster(row, acc, devices, assumed)
    # Megatron counts the embedding and the loss as one layer each when splitting
    # (account_for_embedding/loss_in_pipeline_split): 126 layers fill pp*vp = 128 stages.
    if not even_split_fills(spec.layers, pp * vpp):
        raise Unpredictable("inconsistent layout", f"{spec.layers} layers cannot fill pp*vp = {pp * vpp} stages")
    split = None if spec.layers % (pp * vpp) == 0 else model_split(spec.layers, pp * vpp, spec.mtp_layers)
    sp = _sequence_parallel(row, tp, assumed)
    recompute = _recompute(row, feats)
    parallel = ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vpp=vpp, mbs=mbs, gbs=gbs, seq=seq,
                              zero=_zero(row, feats), recompute=recompute or "none", sequence_parallel=sp,
                              precision=prec, layer_split=split)
    problems = layout_rules.problems(parallel, spec, devices)
    if problems:
        raise Unpredictable("inconsistent layout", "layout inconsistent: " + "; ".join(problems))
    options = _options(row, recipe, feats)
    engine = Engine(megatron=megatron_family(row), attention_kernel=options.attention_kernel,
                    fused_loss=fused_loss(row), pipelined_fsdp=pipelined_fsdp_family(row))
    settled = settle(spec, parallel, cluster, engine, recompute_stated=recompute is not None, options=options)
    parallel = settled.parallel
    assumed.extend(Assumption("memory", a) for a in settled.assumed)
    if not published:
        converted = tokens_from_utilization(row, spec, seq, parallel.recompute, acc, prec)
        if converted is None:
            raise Unpredictable("no throughput", "the published utilisation is not a fraction in (0, 100] %")
        published = converted[0]
        assumed.append(Assumption("throughput", converted[1]))
    return Case(id=rid, source=text(row, "source"), spec=spec, cluster=cluster, parallel=parallel,
                options=options, published=published,
                full_layout=bool(text(row, "tp") and text(row, "pp")), model=arch.name, recipe=recipe,
                assumed=tuple(assumed), source_group=text(row, "source_group") or text(row, "source"),
                memory=settled.memory, memory_fraction=settled.fraction, recompute_stated=recompute is not None,
                engine=engine_of(row))


ENGINE_WORDS = (("megatron", ("megatron", "nemo")), ("mindspeed", ("mindspeed",)), ("torchtitan", ("torchtitan",)),
                ("deepspeed", ("deepspeed",)), ("llm-foundry", ("llm-foundry", "llmfoundry", "composer")),
                ("maxtext", ("maxtext",)), ("fsdp", ("fsdp",)))


def engine_of(row: dict) -> str:
    """The framework family a row ran (megatron | mindspeed | torchtitan | deepspeed | llm-foundry |
    maxtext | fsdp), by the first family the ``framework`` text names; the text itself otherwise."""
    framework = text(row, "framework").lower()
    for name, words in ENGINE_WORDS:
        if any(w in framework for w in words):
            return name
    return framework or "unstated"


def _documents(row: dict, spec: ModelSpec, seq: int, assumed: list[Assumption]) -> ModelSpec:
    """``spec`` over the packed documents the row's text states (:func:`row_text.documents_in`)."""
    found = documents_in(f"{text(row, 'notes')} ; {text(row, 'workload')} ; {text(row, 'other_published_metric')}")
    if found is None:
        return spec
    length, phrase = found
    if length is None:
        assumed.append(Assumption("options", f"{phrase!r} without a document length: attention priced over the "
                                             f"whole {seq}-token window (state 'mean document length N' to price "
                                             "documents)"))
        return spec
    assumed.append(Assumption("options", f"packed documents of {length} tokens ({phrase!r}): attention over "
                                         "documents, not the window"))
    return replace(spec, document_length=length)


def megatron_family(row: dict) -> bool:
    """The run used Megatron-Core (NeMo, Megatron-Bridge, Megatron-LM)."""
    framework = text(row, "framework").lower()
    return "megatron" in framework or "nemo" in framework or "nemo" in text(row, "source").lower()


def pipelined_fsdp_family(row: dict) -> bool:
    """The run used torchtitan, whose FSDP2 runs under torch.distributed.pipelining
    (row_memory.Engine.pipelined_fsdp)."""
    return "torchtitan" in text(row, "framework").lower()


def fused_loss(row: dict) -> bool:
    """The run used llm-foundry (Composer), whose default loss is flash-attn's fused cross-entropy
    on BF16 logits with an in-place backward (row_memory.Engine.fused_loss)."""
    framework = text(row, "framework").lower().replace(" ", "").replace("_", "-")
    return "llm-foundry" in framework or "llmfoundry" in framework


def _options(row: dict, recipe: str, feats: Features) -> PerfOptions:
    framework = text(row, "framework").lower()
    # Megatron-Bridge overlaps the EP all-to-all with another micro-batch's compute in its MXFP8 MoE
    # presets (moe_a2a_overlap=True in scripts/performance/configs/*/..._workload_base_configs.py,
    # *_FP8_MX_* for DeepSeek-V3 and GPT-OSS); its BF16, FP8-CS and NVFP4 presets leave it off. A
    # hybrid stack's MoE layers stay exposed regardless (comm._expert_parallel: HybridModel has no
    # 1F1B a2a schedule; the Nemotron 3 presets, nemotron_3_workload_base_configs.py, set none)
    bridge = "megatron-bridge" in framework and recipe == "mxfp8"
    # llm-foundry's MPT benchmarks (2023) ran FlashAttention-2; Megatron uses cuDNN fused attention,
    # learnable softmax sinks (gpt-oss) and sliding windows included: Transformer Engine 2.8 runs them
    # in FusedAttention on cuDNN >= 9.13.1 for the BSHD/SBHD layouts pre-training uses
    # (https://github.com/NVIDIA/TransformerEngine/pull/2148; issue 2318 was a cuDNN 9.10 install);
    # gpt-oss (August 2025) postdates it, and its 8K-sequence rows run nearly as fast per token as the
    # 4K ones, which unfused attention (quadratic work on every layer) cannot
    foundry = "foundry" in framework or "mosaic" in text(row, "source").lower()
    kernel = feats.kernel or ("flash2" if foundry else "fused" if megatron_core(row) else default_kernel(row))
    # the memory-bound kernels as the engine runs them: fused, compiled or eager (planner.perf.kernel_level)
    return PerfOptions(comm=CommOptions(tp_overlap=userbuffers(row) or feats.tp_overlap,
                                        ep_overlap=bridge or feats.ep_overlap),
                       attention_kernel=kernel, kernel_level=engine_kernel_level(text(row, "framework")))


def _year(row: dict) -> int | None:
    m = re.match(r"\s*(\d{4})", text(row, "year"))
    return int(m.group(1)) if m else None


def megatron_core(row: dict) -> bool:
    """The run used Megatron-Core with Transformer Engine as NeMo and Megatron-Bridge ship it (their
    performance recipes), or Megatron-LM from 2024 on (built on Megatron-Core and TE by then)."""
    framework = text(row, "framework").lower()
    if "deepspeed" in framework:
        return False
    if any(w in framework for w in ("megatron-core", "mcore", "nemo", "bridge")):
        return True
    year = _year(row)
    return "megatron" in framework and year is not None and year >= 2024


def userbuffers(row: dict) -> bool:
    """TP communication overlap on by default: only where the engine has it and its recipes turn it
    on. Megatron-Core's ``--tp-comm-overlap`` runs Transformer Engine's userbuffers (NeMo's and
    Megatron-Bridge's performance recipes set tp_comm_overlap); Megatron-DeepSpeed (DeepSpeed's fork
    of 2021 Megatron-LM, no TE) and Megatron-LM before TE have none: 2022 Megatron overlapped only the
    backward's TP all-reduce with the weight-gradient GEMM (Korthikanti et al. 2022, sec. 4.2.3), a
    partial overlap this model does not credit. Other engines: where the row's text says so."""
    return megatron_core(row)


def megatron_sp(row: dict) -> bool:
    """A blank ``sequence_parallel`` column means on for Megatron-LM (it has Megatron sequence
    parallelism since 2022, Korthikanti et al.) and Megatron-Core recipes; off for Megatron-DeepSpeed
    (its Megatron predates it; DeepSpeed's sequence parallelism is Ulysses, stated as such) and
    for other engines."""
    framework = text(row, "framework").lower()
    return "megatron" in framework and "deepspeed" not in framework or megatron_core(row)


def default_kernel(row: dict) -> str:
    """The attention kernel a row that names none ran: under JAX (MaxText, Pax) cuDNN's fused flash
    attention, MaxText's GPU default (``attention: cudnn_flash_te``, MaxText base.yml); elsewhere
    FlashAttention-2 from 2023 on (Megatron-LM's ``--use-flash-attn``, January 2023; PyTorch's SDPA
    flash backend, torch 2.0, March 2023), the unfused softmax that materialises the score matrix
    before (Megatron-LM 2022's fused scale-mask-softmax still writes the s x s scores)."""
    framework = text(row, "framework").lower()
    if any(w in framework for w in ("jax", "maxtext", "pax")):
        return "fused"
    year = _year(row)
    return "unfused" if year is not None and year <= 2022 else "flash2"


def load_cases(path: str | Path | None = None) -> tuple[list[Case], list[Skip]]:
    """The predictable rows of a published-runs CSV (the shipped one when ``path`` is None) and the skipped."""
    return cases_of(read_rows(path))


def cases_of(rows) -> tuple[list[Case], list[Skip]]:
    """The rows (dicts of published-runs columns) read as cases, and the skipped with their reasons."""
    cases, skips = [], []
    for row in rows:
        try:
            cases.append(case_of(row))
        except Unpredictable as e:
            skips.append(Skip(text(row, "id") or "?", str(e), e.kind))
        except DayzeroError as e:
            skips.append(Skip(text(row, "id") or "?", str(e), "bad value"))
    return cases, skips
