"""The training loop: a state object and a step function.

``build_state(config)`` returns a :class:`TrainState` (model parts, optimizer, LR scheduler, data
position, RNG, step); ``train_step(state)`` advances it by one optimizer step and returns the
step's :class:`StepRecord` (``compute_step`` + ``apply_step``: the loss guard judges in between);
``train(config, hooks)`` runs the loop, calling each hook with ``(state, record)`` after every
step, with checkpoints, resume and fault handling from :mod:`dayzero.runtime.resilience.loop`.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dayzero.errors import LayoutError
from dayzero.runtime import device as devices
from dayzero.runtime.checks import check_runtime, document_problems
from dayzero.runtime.config import TrainConfig
from dayzero.runtime.data import EOS, DataError, TokenStream, resolve_data
from dayzero.runtime.distributed import init_distributed, restart_attempt
from dayzero.runtime.metrics import CommTimer, MetricsWriter, StepRecord, peak_memory_bytes
from dayzero.runtime.models.model import build_model
from dayzero.runtime.models.moe import MoE, Routing
from dayzero.runtime.optim import build_optimizer, build_scheduler, clip_grad_norm_
from dayzero.runtime.parallel.mesh import Meshes, build_meshes
from dayzero.runtime.parallel.parallelize import ParallelModel, parallelize, seeded_weights
from dayzero.runtime.parallel.pipeline import Pipeline, build_pipeline
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import zero_shards
from dayzero.torch_version import require_torch


@dataclass
class TrainState:
    config: TrainConfig
    spec: ModelSpec
    meshes: Meshes
    device: torch.device
    model: ParallelModel
    pipeline: Pipeline | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    data: TokenStream
    step: int = 0  # optimizer steps taken
    history: list = field(default_factory=list)  # StepRecords of this process's run
    # this rank's own share of the last step (the record holds the max over ranks): for the monitor
    local_comm_s: float = 0.0
    local_peak_bytes: int = 0
    alerts: list = field(default_factory=list)  # monitor Alerts firing after the last step (--alerts), for hooks

    @property
    def rank(self) -> int:
        return dist.get_rank()

    def rng_state(self) -> dict:
        return devices.rng_state(self.device)

    def set_rng_state(self, s: dict) -> None:
        devices.set_rng_state(s, self.device)


# -- building --------------------------------------------------------------------------------

def loss_fn(micro_batches: int):
    """Mean next-token cross-entropy of one micro-batch, divided by the micro-batch count so
    accumulated gradients are those of the global-batch mean."""

    def f(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # logits: (B, S, V), sharded over V under tensor parallelism (vocab-parallel loss)
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten()) / micro_batches

    return f


def loss_context(tp: int):
    """Vocab-parallel cross-entropy under tensor parallelism (the head's logits stay sharded)."""
    if tp > 1:
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()
    return contextlib.nullcontext()


def build_state(config: TrainConfig, device: torch.device | None = None) -> TrainState:
    """Everything a run needs, on every rank. Raises DayzeroError (identically on all ranks)
    before any collective if the request cannot run."""
    require_torch("the runtime")
    device = device or init_distributed()
    spec, parallel = config.spec(), config.parallel
    check_runtime(spec, parallel, dist.get_world_size())
    if config.reset_attention_mask and (problems := document_problems(spec, parallel)):
        raise LayoutError("; ".join(problems))
    files = resolve_data(config.data)
    data = TokenStream(files, parallel.seq, config.seed, spec.vocab)
    torch.manual_seed(config.seed)

    meshes = build_meshes(parallel, device.type)
    param_dtype = torch.bfloat16 if config.compute_dtype == "bf16" else torch.float32
    if spec.extra.get("derived"):  # transformers' own module, shrunk (runtime.models.hf_model)
        from dayzero.runtime.parallel.hf_plan import parallelize_derived

        pm = parallelize_derived(config, meshes, device, param_dtype)
    else:
        pm = _parallelize_zoo(config, spec, meshes, device, param_dtype)
    routing = routing_of(config, spec)
    for part in pm.parts:
        for m in part.modules():
            if isinstance(m, MoE):
                m.aux_loss_scale = 1.0 / parallel.microbatches
                m.routing = routing
                m.batch_group = meshes.stage_group if meshes.shape.stage > 1 else None
                m.grad_divisor = parallel.dp * parallel.cp  # what FSDP divides the router's gradients by
    pm.train()
    pipeline = None
    if parallel.pp > 1:
        pipeline = build_pipeline(list(zip(pm.stage_indices, pm.parts)), parallel, meshes.pp_group, device,
                                  loss_fn(parallel.microbatches))
    optimizer = build_optimizer(pm.named_parameters(), config.optimizer.lr, config.optimizer.weight_decay)
    scheduler = build_scheduler(optimizer, config.warmup_steps, config.steps, config.optimizer.min_lr_ratio)
    return TrainState(config, spec, meshes, device, pm, pipeline, optimizer, scheduler, data)


def _parallelize_zoo(config: TrainConfig, spec: ModelSpec, meshes: Meshes, device: torch.device,
                     param_dtype: torch.dtype) -> ParallelModel:
    """The runtime's own model of ``spec``, parallelized and materialized (seeded or HF weights)."""
    parallel = config.parallel
    model = build_model(spec, parallel.seq, EOS if config.reset_attention_mask else None)
    weights, buffers = seeded_weights(config.seed, device), None
    if config.model.hf_weights:
        from dayzero.runtime.checkpoint.hf_weights import HFCheckpoint

        ckpt = HFCheckpoint(config.model.hf_weights, spec)
        weights = buffers = ckpt.tensor
        scaling = rope_scaling_type(config.model.hf_weights)
        if scaling and dist.get_rank() == 0:
            print(f"dayzero: note: config.json asks for {scaling!r} RoPE scaling, which the zoo does not apply "
                  f"(plain RoPE, theta {spec.rope_theta:g}); logits will differ from transformers'", file=sys.stderr)
    placement = None
    if config.moe.placement and spec.is_moe:
        from dayzero.specs.placement import load_placement

        placement = load_placement(config.moe.placement, spec.moe.experts, parallel.ep)
    return parallelize(model, meshes, device, param_dtype, weights, buffers, placement)


def routing_of(config: TrainConfig, spec: ModelSpec) -> Routing:
    """The run's :class:`Routing`: the model's own balance loss (``aux_loss`` "model"), or the one
    asked for, with DeepSeek-V3's alpha 1e-4 (arXiv 2412.19437, sec. 4.2) unless a coefficient is given."""
    o = config.moe
    if spec.moe is None:
        return Routing()
    base = Routing.of_spec(spec.moe)
    if o.aux_loss == "model":
        aux, coef = base.aux_loss, base.aux_coef if o.aux_coef is None else o.aux_coef
    else:
        aux, coef = o.aux_loss, 1e-4 if o.aux_coef is None else o.aux_coef
    return Routing(aux, coef if aux != "none" else 0.0, o.z_loss, o.capacity_factor)


def rope_scaling_type(checkpoint: str) -> str | None:
    """The RoPE scaling a HF checkpoint's config.json asks for (llama3, yarn, ...), if any."""
    from dayzero.runtime.checkpoint.hf_weights import checkpoint_config

    cfg = checkpoint_config(checkpoint)
    for key in ("rope_scaling", "rope_parameters"):
        rs = cfg.get(key)
        if isinstance(rs, dict):
            kind = rs.get("rope_type") or rs.get("type")
            if kind and kind != "default":
                return str(kind)
    return None


# -- one step --------------------------------------------------------------------------------

def forward_backward(state: TrainState, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """All micro-batches of this rank's share of the global batch; returns the summed loss
    (the local mean) on the rank(s) that compute it, else 0."""
    p = state.config.parallel
    with loss_context(p.tp):
        if state.pipeline is not None:
            losses = state.pipeline.step(inputs, labels)
            total = sum((_local(x).detach() for x in losses), torch.zeros((), device=state.device))
            return total
        part, total = state.model.parts[0], torch.zeros((), device=state.device)
        f = loss_fn(p.microbatches)
        xs, ys = inputs.split(p.mbs), labels.split(p.mbs)
        for i, (x, y) in enumerate(zip(xs, ys)):
            if state.model.fsdp_units:
                # ZeRO-0/1 reduce gradients once per step; ZeRO-2/3 keep them sharded: every micro-batch
                part.set_requires_gradient_sync(i == len(xs) - 1 or zero_shards(p.zero, "gradients"))
            loss = f(part(x), y)
            loss.backward()
            total = total + _local(loss).detach()
        return total


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


@dataclass
class Gradients:
    """A step computed (gradients in place, loss reduced) but not yet applied."""

    loss: float  # the global mean loss, identical on every rank
    norm: torch.Tensor
    lr: float
    t0: float
    wall0: int  # time.time_ns() at the step's start: the window for communication timing


def compute_step(state: TrainState, timer: CommTimer) -> Gradients:
    """Forward and backward of the next global batch, gradient clipping, the global loss."""
    cfg, p, meshes = state.config, state.config.parallel, state.meshes
    timer.start()
    t0, wall0 = time.perf_counter(), time.time_ns()
    x, y = state.data.batch(p.gbs, meshes.dp_rank, p.dp, meshes.cp_rank, p.cp)
    inputs = torch.from_numpy(x).to(state.device)
    labels = torch.from_numpy(y).to(state.device)
    local_loss = forward_backward(state, inputs, labels)
    params = list(state.model.parameters())
    uncounted = ()
    if state.model.tied:  # one matrix, a copy per pipeline stage: one gradient, counted once in the norm
        from dayzero.runtime.parallel.hf_stages import reduce_tied

        reduce_tied(state.model.tied, meshes.pp_group)
        uncounted = {id(t) for i, t in enumerate(state.model.tied) if i or meshes.pp_rank}
    norm = clip_grad_norm_(params, cfg.optimizer.grad_clip, meshes.shape.stage, uncounted=uncounted)
    lr = state.scheduler.get_last_lr()[0]
    # the loss is replicated over tp and lives on the last stage: each dp replica's and each cp
    # rank's (the mean over its slice of the sequences; every slice holds as many tokens) once
    on_last = state.pipeline is None or state.pipeline.has_last
    owner = on_last and meshes.tp_rank == 0
    loss = (local_loss if owner else torch.zeros_like(local_loss)).float().reshape(1)
    if dist.get_world_size() > 1:
        dist.all_reduce(loss)
    return Gradients(float(loss / (p.dp * p.cp)), norm, float(lr), t0, wall0)


def apply_step(state: TrainState, g: Gradients, timer: CommTimer, update: bool = True) -> StepRecord:
    """Take the optimizer step (or, ``update=False``, drop the gradients: a skipped step) and
    measure it."""
    p = state.config.parallel
    if update:
        state.optimizer.step()
        state.scheduler.step()
    state.optimizer.zero_grad(set_to_none=True)
    loads = expert_loads(state)
    if update and loads is not None:
        update_expert_bias(state, loads)
    _reset_expert_counts(state)
    devices.synchronize(state.device)
    elapsed = time.perf_counter() - g.t0
    comm = timer.stop((g.wall0, g.wall0 + int(elapsed * 1e9)))
    state.local_comm_s, state.local_peak_bytes = comm, peak_memory_bytes(state.device)
    stats = torch.tensor([float(state.local_peak_bytes), comm], dtype=torch.float64, device=state.device)
    if dist.get_world_size() > 1:
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    state.step += 1
    tokens = p.gbs * p.seq
    full = loads is not None and (state.step % state.config.moe.loads_every == 0 or state.step >= state.config.steps)
    rec = StepRecord(step=state.step, loss=g.loss, grad_norm=float(g.norm), lr=g.lr, tokens=tokens,
                     step_time_s=elapsed, tokens_per_s=tokens / elapsed, peak_mem_bytes=int(stats[0]),
                     comm_time_s=float(stats[1]), moe=loads.summary() if loads is not None else None,
                     expert_loads=loads.expert_lists() if full else None)
    state.history.append(rec)
    return rec


def discard_step(state: TrainState, timer: CommTimer) -> None:
    """Drop a computed step entirely (before a rollback)."""
    state.optimizer.zero_grad(set_to_none=True)
    _reset_expert_counts(state)
    timer.stop()


def train_step(state: TrainState, timer: CommTimer | None = None) -> StepRecord:
    timer = timer or CommTimer(False, state.device)
    return apply_step(state, compute_step(state, timer), timer)


def _reset_expert_counts(state: TrainState) -> None:
    for part in state.model.parts:
        for m in part.modules():
            if isinstance(m, MoE):
                m.reset_counts()


def _moe_layers(state: TrainState) -> list[tuple[int, MoE]]:
    """(global layer index, layer) of this rank's MoE layers."""
    return [(int(key), block.moe) for part in state.model.parts for key, block in part.layers.items()
            if block.moe is not None]


@dataclass(frozen=True)
class ExpertLoads:
    """One step's routing counts per MoE layer of the whole model, summed over every rank."""

    layers: tuple[int, ...]  # global layer index of each MoE layer
    experts: torch.Tensor  # (layers, E) routed (token, slot) pairs per expert, float64
    dropped: torch.Tensor  # (layers,) slots dropped by the capacity factor
    ranks: torch.Tensor  # (layers, ep) rows sent to each EP rank

    def summary(self) -> dict:
        """The per-step ``moe`` record (metrics.py): max/mean, CV, dropped share, rank max/mean."""
        c, r = self.experts, self.ranks
        mean = c.mean(1).clamp_min(1e-30)
        cv = c.std(1, unbiased=False) / mean
        routed = c.sum(1).clamp_min(1e-30)

        def rnd(t):
            return [round(float(v), 6) for v in t]

        return {"layers": list(self.layers), "max_mean": rnd(c.max(1).values / mean), "cv": rnd(cv),
                "dropped": rnd(self.dropped / routed),
                "rank_max_mean": rnd(r.max(1).values / r.mean(1).clamp_min(1e-30))}

    def expert_lists(self) -> list[list[int]]:
        return [[int(v) for v in row] for row in self.experts.round().long().tolist()]


@torch.no_grad()
def expert_loads(state: TrainState) -> ExpertLoads | None:
    """This step's counts of every MoE layer (all stages), summed over all ranks: one all-reduce
    of a (MoE layers, E + 1 + ep) matrix in which each rank fills the layers it holds. Every rank's
    tokens are different (data parallel ranks hold different sequences, tensor and context
    parallel ranks different shards), so the sums count the global batch of the step, over all its
    micro-batches. None for a dense model."""
    spec = state.spec
    if not spec.is_moe or spec.extra.get("derived"):  # a derived model's own MoE modules are not counted
        return None
    layers = tuple(i for i, kind in enumerate(spec.layer_kinds) if kind == "moe")
    e, ep = spec.moe.experts, state.config.parallel.ep
    m = torch.zeros(len(layers), e + 1 + ep, dtype=torch.float64, device=state.device)
    row = {layer: i for i, layer in enumerate(layers)}
    for layer, moe in _moe_layers(state):
        m[row[layer], :e] = moe.tokens_per_expert.double()
        m[row[layer], e] = moe.dropped_slots.double()
        if moe.rows_per_rank is not None:
            rows = moe.rows_per_rank.double()
            m[row[layer], e + 1:e + 1 + rows.numel()] = rows
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(m)
    return ExpertLoads(layers, m[:, :e], m[:, e], m[:, e + 1:])


@torch.no_grad()
def update_expert_bias(state: TrainState, loads: ExpertLoads) -> None:
    """Auxiliary-loss-free balancing (Wang et al. 2024, arXiv 2408.15664; DeepSeek-V3, arXiv
    2412.19437 sec. 2.1.2): after each step, ``b_i += gamma * sign(mean load - load_i)``, the loads
    counted over the step's global batch (every rank, every micro-batch)."""
    rate = state.config.moe.bias_rate
    if rate <= 0:
        return
    row = {layer: i for i, layer in enumerate(loads.layers)}
    for layer, m in _moe_layers(state):
        if m.router.e_score_correction_bias is not None:
            c = loads.experts[row[layer]]
            m.router.e_score_correction_bias += (torch.sign(c.mean() - c) * rate).float()


# -- the loop --------------------------------------------------------------------------------

Hook = Callable[[TrainState, StepRecord], None]


def _resume(state: TrainState, pos, rank0: bool) -> None:
    """Take the step and data position of the checkpoint the run resumes from (``pos``, none where
    ``pos.path`` is None); a checkpoint without a data position restarts the stream, with a warning."""
    if pos.path is None:
        return
    state.step = pos.step
    if pos.data is not None:
        state.data.restore(saved_stream(pos.data))
    elif rank0:
        print(f"dayzero: warning: {pos.path.name} holds no data position (imported weights, or saved without "
              "one): the data stream starts from its beginning", file=sys.stderr, flush=True)


def _guarded_step(state: TrainState, res, timer: CommTimer, gbs: int) -> tuple[StepRecord | None, bool]:
    """One step under the loss guards (``res``: :mod:`dayzero.runtime.resilience.loop`): the batches a
    rollback skips are passed over, and a step the guards roll back is discarded, the state taken back
    to the checkpoint (returns (None, True)). Returns (the step's record, whether its update was skipped)."""
    res.begin_step(state.step + 1)
    while res.should_skip(state.data.samples // gbs):
        state.data.samples += gbs
    batch = state.data.samples // gbs
    g = compute_step(state, timer)
    verdict = res.judge(state.step + 1, g.loss, [batch])
    if verdict.action == "rollback":
        discard_step(state, timer)
        pos = res.rollback(state.step + 1)
        state.step = pos.step
        state.data.restore(saved_stream(pos.data))
        state.history = [r for r in state.history if r.step <= pos.step]
        return None, True
    return apply_step(state, g, timer, update=verdict.ok), not verdict.ok


def _act_on_alerts(state: TrainState, res, actions) -> None:
    """The alert actions' decision after a step (``--on-alert``): a checkpoint now, and a stop that
    raises the planned restart."""
    decision = actions.after_step(state.step, state.alerts)
    if decision.checkpoint:
        res.save_now(state.step, data_position(state))
    if decision.stop:
        raise actions.planned_restart(decision, state.step)


def train(config: TrainConfig, hooks: tuple[Hook, ...] = (), state: TrainState | None = None) -> TrainState:
    """Run ``config.steps`` steps; rank 0 writes the metrics stream and shows progress.

    With ``config.checkpoint.dir`` the run resumes from the newest good checkpoint and saves every
    ``config.checkpoint.every`` steps; fault drills, the hang watchdog and loss guards come from the
    same config (see :mod:`dayzero.runtime.resilience.loop`), and so do the actions on the
    monitor's in-process alerts (``--on-alert``, :mod:`dayzero.runtime.resilience.actions`)."""
    from dayzero.runtime.progress import Progress
    from dayzero.runtime.resilience.actions import build_alert_actions
    from dayzero.runtime.resilience.loop import build_resilience

    if config.faults.on_alert and not config.monitor.alerts:  # actions act on the monitor's alerts
        config = config.with_(monitor={"alerts": True})
    state = state or build_state(config)
    rank0 = dist.get_rank() == 0
    early: list[dict] = []  # events before the metrics stream is open (resume warnings)
    emit: Callable[[dict], None] = early.append
    monitor = None  # the exporter and in-process alerts (config.monitor), once the stream is open

    def event(ev: dict) -> None:
        if monitor is not None:
            monitor.on_event(ev)
        emit(ev)

    res = build_resilience(config, state, event)
    actions = build_alert_actions(config, state, lambda ev: emit(ev))
    writer, failed = None, True
    if rank0 and config.metrics:  # the resolved run, next to its outputs
        config.save(Path(config.metrics).with_suffix(".config.json"))
    try:
        pos = res.start()
        _resume(state, pos, rank0)
        if rank0 and restart_attempt() > 0:  # the line a restart announced is answered by this one
            print(f"dayzero: resumed at step {state.step}", file=sys.stderr, flush=True)
        # a run that continues (checkpoint, torchrun restart, or a state handed in mid-run) appends
        resumed = pos.path is not None or restart_attempt() > 0 or state.step > 0
        writer = MetricsWriter(config.metrics, rank0, append=resumed)
        emit = writer.write
        for ev in early:
            writer.write(ev)
        if config.monitor.enabled:
            from dayzero.runtime.monitoring import Monitor

            monitor = Monitor(config, state, continuing=resumed, emit=writer.write)
            if pos.path is not None:
                monitor.resumed_at(pos.step)
        timer = CommTimer(config.measure_comm and dist.get_world_size() > 1, state.device)
        t_start = time.perf_counter()
        gbs = config.parallel.gbs
        with Progress(config.steps, enabled=rank0 and not config.quiet, start=state.step) as bar:
            while state.step < config.steps:
                rec, skipped = _guarded_step(state, res, timer, gbs)
                if rec is None:  # rolled back
                    continue
                writer.write(rec.to_dict())
                bar.update(rec)
                if monitor is not None:
                    state.alerts = monitor.after_step(state, rec, skipped=skipped)
                for hook in hooks:
                    hook(state, rec)
                res.end_step(state.step, data_position(state))
                if actions is not None:  # rank 0 decides on the alerts that began firing; every rank acts
                    _act_on_alerts(state, res, actions)
        res.finish(state.step, data_position(state))
        writer.write(end_record(state, time.perf_counter() - t_start))
        failed = False
    finally:
        res.close(wait=not failed)
        if monitor is not None:
            monitor.close(linger=not failed)
        if writer is not None:
            writer.close()
    return state


def saved_stream(data: object) -> dict:
    """The stream position inside a checkpoint's data entry (as :func:`data_position` wrote it)."""
    if not isinstance(data, dict) or "stream" not in data:
        raise DataError(f"the checkpoint's data entry {str(data)[:120]!r} has no stream position; resume from "
                        "another version (--resume STEP)")
    return data["stream"]


def data_position(state: TrainState) -> dict:
    """The data stream's position, as checkpoints store it."""
    return {"stream": state.data.position().to_dict(), "batch": state.data.samples // state.config.parallel.gbs}


def end_record(state: TrainState, wall_s: float) -> dict:
    h = state.history
    steady = h[1:] or h  # the first step pays one-time setup (allocation, pipeline shape inference)
    mean_step = sum(r.step_time_s for r in steady) / max(1, len(steady))
    p = state.config.parallel
    return {"event": "end", "steps": state.step, "final_loss": h[-1].loss if h else None,
            "first_loss": h[0].loss if h else None, "mean_step_time_s": mean_step,
            "tokens_per_s": (p.gbs * p.seq) / mean_step if mean_step else 0.0,
            "peak_mem_bytes": max((r.peak_mem_bytes for r in h), default=0),
            "comm_time_s": sum(r.comm_time_s for r in h), "wall_s": wall_s,
            "world": dist.get_world_size(), "parallel": p.describe(), "model": state.spec.name,
            "compute_dtype": state.config.compute_dtype, "device": state.device.type,
            # what `dayzero calibrate --runs METRICS.jsonl` reads back as a measured run (planner.backtest.own_runs)
            "layout": p.to_dict(), "accelerator": devices.device_name(state.device),
            "architecture": run_architecture(state.spec)}


def run_architecture(spec) -> dict:
    """The model as the published-runs columns state one (planner.backtest.row_arch reads them back)."""
    moe = spec.moe
    return {"layers": spec.layers, "hidden_size": spec.hidden, "attention_heads": spec.attention.heads,
            "kv_heads": spec.attention.kv_heads, "ffn_hidden_size": spec.mlp.intermediate, "vocab_size": spec.vocab,
            "moe_num_experts": moe.experts if moe else None, "moe_top_k": moe.top_k if moe else None,
            "moe_expert_ffn": moe.expert.intermediate if moe else None,
            "moe_shared_experts": moe.shared_experts if moe else None}
