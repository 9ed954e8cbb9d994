"""Pipeline schedules: the order of forward/backward passes on a rank, and how many micro-batches'
activations a rank holds at its peak.

- GPipe (Huang et al. 2019): all m forwards, then all backwards: every rank holds m micro-batches.
- 1F1B (PipeDream-Flush, Narayanan et al. 2021): rank r runs min(pp - r - 1, m) warm-up forwards,
  then alternates one forward and one backward: it holds min(pp - r, m) micro-batches at its peak.
- Interleaved 1F1B (Megatron, vpp model chunks per rank): rank r warms up with
  2 (pp - r - 1) + (vpp - 1) pp chunk-forwards, so it holds up to that + 1 chunks of L/(pp vpp)
  layers. For rank 0 that is pp (1 + (pp - 1)/(pp vpp)) micro-batches' worth of its layers:
  Korthikanti et al. 2022's interleaving factor 1 + (p - 1)/(p v).
- DualPipe (DeepSeek-V3, arXiv 2412.19437 sec. 3.2.1): rank r holds stage r and its mirror
  pp - 1 - r; half the micro-batches enter at each end, each direction a 1F1B over pp stages, so
  rank r holds pp - r micro-batches of its first chunk and r + 1 of its second: pp + 1 chunks on
  every rank (the DualPipe README's "Activation PP+1"), half a rank's layers each.
- DualPipeV (deepseek-ai/DualPipe dualpipev.py): 2 pp stages in a V, rank r holds stage r
  (2 pp - r micro-batches in flight, as 1F1B over 2 pp stages) and stage 2 pp - 1 - r (r + 1):
  2 pp + 1 chunks of half a rank's layers.

``inflight_*`` are numpy-compatible (arrays of candidates x ranks broadcast); schedules are the
grid's codes (:mod:`dayzero.specs.grid`: 0 1f1b, 1 interleaved, 2 gpipe, 3 dualpipe, 4 dualpipev).

:func:`bubble_microbatches` is each schedule's pipeline bubble in micro-batch times;
:func:`gradient_windows` how often per step a model chunk's gradient must be reduce-scattered
when it is kept sharded (ZeRO-2).
"""

from __future__ import annotations

import numpy as np

from dayzero.errors import LayoutError
from dayzero.specs.grid import DUALPIPE, DUALPIPEV, GPIPE, INTERLEAVED, ONE_F_ONE_B
from dayzero.specs.grid import code as code_of

# the schedules whose stages sit on the ranks differently (parallel.stage_ranks): the others, DualPipe, DualPipeV
PLACEMENTS = ("1f1b", "dualpipe", "dualpipev")


def placement_code(schedule):
    """Index in :data:`PLACEMENTS` of each schedule code's stage placement."""
    schedule = np.asarray(schedule)
    return np.where(schedule == DUALPIPE, 1, np.where(schedule == DUALPIPEV, 2, 0))


def pipeline_groups(pp, vpp, nfull, place) -> tuple[np.ndarray, np.ndarray]:
    """Rows that share which layers each pipeline rank holds and replays: the same (pp, vpp, full(N)
    count ``nfull``, stage placement ``place``: :func:`placement_code`). Returns (one row of each
    group, the group of each row), groups in increasing (pp, vpp, nfull, place) order."""
    pp, vpp, nfull, place = (np.asarray(a, dtype=np.int64).ravel() for a in (pp, vpp, nfull, place))
    if not len(pp):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    vspan, nspan = int(vpp.max()) + 1, int(nfull.max()) + 1
    key = ((pp * vspan + vpp) * nspan + nfull) * len(PLACEMENTS) + place
    _, first, group = np.unique(key, return_index=True, return_inverse=True)
    return first, group.ravel()


def effective_schedule(code, vpp):
    """The schedule that really runs: interleaved 1F1B with one model chunk per rank is 1F1B."""
    code = np.asarray(code)
    return np.where((code == INTERLEAVED) & (np.asarray(vpp) == 1), ONE_F_ONE_B, code)


def warmup_chunks(code, pp, vpp, m, rank):
    """Chunk-forwards a rank runs before its first backward (Megatron's num_warmup_microbatches)."""
    total = np.asarray(m) * vpp
    interleaved = effective_schedule(code, vpp) == INTERLEAVED
    w = np.where(interleaved, 2 * (np.asarray(pp) - rank - 1) + (np.asarray(vpp) - 1) * pp, np.asarray(pp) - rank - 1)
    w = np.where(np.asarray(code) == GPIPE, total, w)
    return np.minimum(w, total)


def inflight_chunks(code, pp, vpp, m, rank):
    """Model chunks whose activations a rank holds at its peak (one more than the warm-up when a
    steady state exists: its next forward runs before the first backward frees anything)."""
    total = np.asarray(m) * vpp
    return np.minimum(warmup_chunks(code, pp, vpp, m, rank) + 1, total)


def dual_inflight_chunks(code, pp, m, rank):
    """DualPipe / DualPipeV: chunks held at the peak, the sum over the rank's two chunks of a
    1F1B over the schedule's stages (pp for DualPipe, 2 pp for DualPipeV), each capped by the
    micro-batches that pass it (DualPipe: half of them enter from each end)."""
    pp, m, rank = np.asarray(pp), np.asarray(m), np.asarray(rank)
    dual = np.asarray(code) == DUALPIPE
    stages = np.where(dual, pp, 2 * pp)
    per_chunk = np.where(dual, m // 2, m)
    return np.minimum(stages - rank, per_chunk) + np.minimum(rank + 1, per_chunk)


def inflight_microbatches(code, pp, vpp, m, rank):
    """Micro-batches' worth of this rank's layers held at its peak (chunks / chunks per rank; may
    be fractional). DualPipe / DualPipeV ranks hold two chunks each."""
    code = np.asarray(code)
    dual = (code == DUALPIPE) | (code == DUALPIPEV)
    plain = inflight_chunks(np.where(dual, ONE_F_ONE_B, code), pp, vpp, m, rank) / np.asarray(vpp)
    return np.where(dual, dual_inflight_chunks(code, pp, m, rank) / 2, plain)


def bubble_microbatches(code, pp, vpp, fwd, bwd, wgrad):
    """The pipeline bubble of one step, in seconds, from one micro-batch's forward ``fwd``,
    backward ``bwd`` and weight-gradient share ``wgrad`` of the backward on the slowest rank
    (all the rank's layers a micro-batch passes; any exposed per-layer communication counted in
    ``fwd`` + ``bwd``).

    - 1F1B and GPipe: (pp - 1)(F + B); interleaved 1F1B: (pp - 1)(F + B) / vpp (Narayanan et
      al. 2021, eq. 1 and 2).
    - DualPipe: (pp/2 - 1)(F&B + B - 3W) with F, B, W one chunk's (the deepseek-ai/DualPipe
      README's table, as DeepSeek-V3 Table 2; ZB1P's is (pp - 1)(F + B - 2W)); a micro-batch passes one
      chunk per rank, so a chunk is the rank's micro-batch, and F&B, the overlapped forward and
      backward of two micro-batches, takes F + B (the overlap hides communication, not compute).
    - DualPipeV: the same on its 2 pp stages, (pp - 1)(F&B + B - 3W) with half a rank's layers
      per chunk (the schedule is DualPipe on 2 pp ranks cut in half, dualpipev.py)."""
    code = np.asarray(code)
    plain = (np.asarray(pp) - 1) / np.asarray(vpp) * (fwd + bwd)
    dual_chunk = fwd + 2 * bwd - 3 * wgrad
    return np.where(code == DUALPIPE, (np.asarray(pp) / 2 - 1) * dual_chunk,
                    np.where(code == DUALPIPEV, (np.asarray(pp) - 1) * dual_chunk / 2, plain))


def gradient_windows(code, pp, vpp, m):
    """Reduce-scatters of each model chunk's gradient per step when gradients stay sharded
    between micro-batches (ZeRO-2, FSDP with ``reshard_after_forward=False``): a chunk's gradient
    is unsharded only while its backward passes run back to back, and is reduce-scattered (FP32,
    accumulated into its shard) when they stop. Returns the number of such windows per step.

    - vpp 1 (1F1B, GPipe, DualPipe): one chunk holds all the rank's layers and each micro-batch's
      backward passes through all of them, so a layer's gradient is complete once per micro-batch:
      m reduce-scatters (FSDP's default with gradient sync on every backward).
    - Interleaved 1F1B: micro-batches run in groups of ``pp`` per model chunk (Megatron-Core
      ``microbatch_group_size_per_vp_stage``, "Default ... to pipeline_parallel_size",
      model_parallel_config.py; Llama 3's schedule makes it a tunable N >= pp, arXiv 2407.21783
      sec. 3.3.2, Fig. 6), and a chunk's backward passes of one group run contiguously:
      m / min(m, pp) windows (one when m <= pp, as Llama 3.1 405B's 16 micro-batches on pp 16).
    - GPipe with vpp > 1: all m backward passes of a chunk run together: one window.
    - DualPipeV: its two chunks alternate micro-batch by micro-batch: m windows.

    Under these windows the gradient held unsharded is one chunk's (memory_terms, temporary
    ``grad_reduce``). torch.distributed.pipelining instead defers FSDP's gradient sync to the
    last backward of the step (``PipelineStage.backward_maybe_with_nosync``: ``set_requires_
    gradient_sync(False)`` until ``last_backward``), holding every unsharded gradient: ZeRO-1's
    memory (:func:`held_zero`)."""
    code, m, pp, vpp = np.asarray(code), np.asarray(m), np.asarray(pp), np.asarray(vpp)
    eff = effective_schedule(code, vpp)
    groups = -(-m // np.maximum(np.minimum(m, pp), 1))
    return np.where((eff == INTERLEAVED) & (vpp > 1), groups, np.where((eff == GPIPE) & (vpp > 1), 1, m))


def held_zero(zero, pp, pipelined_fsdp):
    """The ZeRO stage whose weights and gradients a pipeline rank holds at its peak: ``zero``, or,
    for FSDP under torch.distributed.pipelining with pp > 1 (``pipelined_fsdp``: the ZeRO stages
    it runs so, MemoryOptions.pipelined_fsdp), ZeRO-1's.

    torch 2.13 torch/distributed/pipelining/stage.py: ``PipelineStage.backward_maybe_with_nosync``
    runs every backward with ``set_reshard_after_backward(False)`` and
    ``set_requires_gradient_sync(False)``; ``perform_reduce_grad`` (the REDUCE_GRAD action after the
    step's last backward, schedules.py ``_add_reduce_grad``; Schedule1F1B / ScheduleGPipe call it
    at the end of ``_step_microbatches``) reduce-scatters and reshards. So from a layer's first
    backward to the step's end its parameters stay gathered (param_dtype) and its gradient
    unsharded, accumulated in reduce_dtype (fsdp/_fully_shard/_fsdp_param_group.py
    ``FSDPParamGroup.post_backward`` without ``reduce_grads``: ``to_accumulated_grad_if_needed``,
    _fsdp_param.py: ``unsharded_grad.to(self.reduce_dtype)``). torchtitan also keeps them gathered
    after forward under PP (models/llama3/infra/parallelize.py ``apply_fsdp``:
    ``reshard_after_forward_policy`` "default" is False when ``pp_enabled``). The optimizer states
    stay sharded as ``zero`` shards them; the sharded fp32 parameters are the master weights."""
    zero, pp = np.asarray(zero), np.asarray(pp)
    held = np.isin(zero, [z for z in pipelined_fsdp if z >= 1]) & (pp > 1)
    return np.where(held, np.minimum(zero, 1), zero)


def head_inflight(code, m):
    """Micro-batches whose logits the last stage holds: its loss backward follows each forward
    immediately except under GPipe, where all m forwards run first."""
    return np.where(np.asarray(code) == GPIPE, m, 1)


def step_order(schedule: str, pp: int, vpp: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """The passes of one training step on ``rank``: ("F" | "B", micro-batch, model chunk)."""
    sched = int(effective_schedule(code_of("schedule", schedule), vpp))
    if sched in (DUALPIPE, DUALPIPEV):
        raise LayoutError(f"the {schedule} schedule's pass order is not replayed; replay a 1f1b or interleaved layout")
    total = m * vpp
    if sched == GPIPE:
        return [("F", i, c) for c in range(vpp) for i in range(m)] + \
               [("B", i, c) for c in reversed(range(vpp)) for i in range(m)]

    def chunk(k: int, forward: bool) -> tuple[int, int]:
        if sched == ONE_F_ONE_B:
            return k, 0
        group, pos = divmod(k, pp * vpp)
        c = pos // pp
        return group * pp + pos % pp, (c if forward else vpp - 1 - c)

    warm = int(warmup_chunks(sched, pp, vpp, m, rank))
    order = [("F", *chunk(k, True)) for k in range(warm)]
    for i in range(total - warm):
        order.append(("F", *chunk(warm + i, True)))
        order.append(("B", *chunk(i, False)))
    order += [("B", *chunk(k, False)) for k in range(total - warm, total)]
    return order
