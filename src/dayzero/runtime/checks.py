"""What the runtime can run, checked before any process is spawned (no torch import here), so a
bad request costs one line and exit code 2, never a hung rank."""

from __future__ import annotations

from dayzero.errors import DayzeroError, LayoutError
from dayzero.planner.engines import DAYZERO, engine_problems
from dayzero.specs import layout_rules
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import ParallelConfig

BYTE_VOCAB = 257  # runtime.data: 256 bytes + end of document


def runtime_problems(spec: ModelSpec, parallel: ParallelConfig, world: int | None) -> list[str]:
    """Every reason the runtime cannot train ``spec`` with ``parallel`` on ``world`` ranks."""
    # the runtime has no ring attention to fall back on when a2a cannot split the heads
    p = [m.replace(layout_rules.A2A_HEADS_FIX, "use a smaller cp or tp (the runtime has no ring attention, "
                   "--cp-comm p2p)") for m in layout_rules.problems(parallel, spec, world)]
    a = spec.attention
    p += engine_problems(DAYZERO, parallel)  # the layout limits of the runtime, as the planner labels them
    if a.sinks and a.kind == "mla":
        p.append(f"{spec.name}: attention sinks are in the runtime's grouped-query attention only, not in MLA")
    # a model derived from its own code keeps embedding and head whole under tp (runtime.parallel.hf_plan)
    if spec.tie_embeddings and (parallel.tp > 1 or parallel.pp > 1) and not spec.extra.get("derived"):
        p.append(f"{spec.name} ties its embedding and head: the runtime supports that only with tp 1 and pp 1")
    if spec.is_moe and parallel.tp > 1 and parallel.seq % parallel.tp:
        p.append(f"seq {parallel.seq} must be divisible by tp {parallel.tp}: MoE layers route sequence shards")
    if spec.position == "learned" and parallel.seq > spec.max_positions:
        p.append(f"seq {parallel.seq} exceeds the {spec.max_positions} learned positions of {spec.name}")
    if spec.vocab < BYTE_VOCAB:
        p.append(f"vocab {spec.vocab} < {BYTE_VOCAB}: the byte tokenizer needs 256 bytes + end of document; "
                 f"shrink with --vocab {BYTE_VOCAB} or more")
    if parallel.pp > 1 and parallel.microbatches < parallel.pp:
        p.append(f"{parallel.microbatches} micro-batches for pp {parallel.pp}: a pipeline needs at least pp "
                 f"micro-batches per step; raise --gbs to >= {parallel.pp * parallel.mbs * parallel.dp}")
    return p


def document_problems(spec: ModelSpec, parallel: ParallelConfig) -> list[str]:
    """What per-document attention (``--reset-attention-mask``) cannot run with: the documents are
    read from the token ids, which only the first pipeline stage holds, and a context-parallel rank
    holds a slice of the sequence (the ring would need the documents' boundaries per block)."""
    out = []
    if parallel.pp > 1:
        out.append(f"--reset-attention-mask with pp {parallel.pp}: the documents are read from the token ids, which "
                   "only the first stage holds; use pp 1")
    if parallel.cp > 1:
        out.append(f"--reset-attention-mask with cp {parallel.cp}: context parallelism splits the sequence across "
                   "ranks and its exchange does not follow document boundaries; use cp 1")
    if spec.extra.get("derived"):
        out.append(f"--reset-attention-mask on {spec.name}: a model derived from its own code runs transformers' "
                   "attention, which takes no per-document mask from dayzero")
    return out


def check_layout(parallel: ParallelConfig, world: int | None = None) -> None:
    """The layout's own rules, before any model is sized for it (degrees and batch sizes >= 1,
    their products against ``world``)."""
    problems = layout_rules.problems(parallel, None, world)
    if problems:
        where = f" on {world} rank(s)" if world else ""
        raise LayoutError(f"cannot run {parallel.describe()}{where}: " + "; ".join(problems))


def check_runtime(spec: ModelSpec, parallel: ParallelConfig, world: int | None) -> None:
    problems = runtime_problems(spec, parallel, world)
    if problems:
        raise LayoutError(f"cannot train {spec.name} with {parallel.describe()} on {world} rank(s): "
                          + "; ".join(problems))


def require_runtime_family(spec: ModelSpec, verb: str) -> None:
    """The runtime's model zoo implements the parsed families only; a model derived from its own
    modeling code is planned, never trained as a look-alike of another architecture."""
    if spec.extra.get("derived"):
        raise DayzeroError(f"{spec.name}: model_type '{spec.model_type}' is derived from its own modeling code for "
                           f"planning (inspect, memory, predict, plan); dayzero {verb} runs only the families its "
                           "runtime implements (see 'dayzero models')")
