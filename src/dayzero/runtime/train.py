"""The training loop: a state object and a step function.

``build_state(config)`` returns a :class:`TrainState` (model parts, optimizer, LR scheduler, data
position, RNG, step); ``train_step(state)`` advances it by one optimizer step and returns the
step's :class:`StepRecord`; ``train(config, hooks)`` runs the loop, calling each hook with
``(state, record)`` after every step. A checkpoint module saves and restores a TrainState and
hooks into the loop; nothing else holds training state.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dayzero.runtime.checks import check_runtime
from dayzero.runtime.config import TrainConfig
from dayzero.runtime.data import TokenStream, resolve_data
from dayzero.runtime.mesh import Meshes, build_meshes
from dayzero.runtime.metrics import CommTimer, MetricsWriter, StepRecord, peak_memory_bytes
from dayzero.runtime.model import build_model
from dayzero.runtime.moe import MoE
from dayzero.runtime.optim import build_optimizer, build_scheduler, clip_grad_norm_
from dayzero.runtime.parallelize import ParallelModel, parallelize, seeded_weights
from dayzero.runtime.pipeline import Pipeline, build_pipeline
from dayzero.runtime.torch_compat import require_torch
from dayzero.specs.model import ModelSpec


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

    @property
    def rank(self) -> int:
        return dist.get_rank()

    def rng_state(self) -> dict:
        s = {"torch": torch.get_rng_state()}
        if self.device.type == "cuda":
            s["cuda"] = torch.cuda.get_rng_state(self.device)
        return s

    def set_rng_state(self, s: dict) -> None:
        torch.set_rng_state(s["torch"])
        if "cuda" in s and self.device.type == "cuda":
            torch.cuda.set_rng_state(s["cuda"], self.device)


# -- process group ---------------------------------------------------------------------------

def init_distributed() -> torch.device:
    """Join torchrun's process group (or make a one-process group) and pick this rank's device."""
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return device


# -- building --------------------------------------------------------------------------------

def loss_fn(micro_batches: int):
    """Mean next-token cross-entropy of one micro-batch, divided by the micro-batch count so
    accumulated gradients are those of the global-batch mean."""

    def f(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # logits: (B, S, V), sharded over V under tensor parallelism (vocab-parallel loss)
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten()) / micro_batches

    return f


def loss_context(state_or_tp):
    """Vocab-parallel cross-entropy under tensor parallelism (the head's logits stay sharded)."""
    tp = state_or_tp if isinstance(state_or_tp, int) else state_or_tp.config.parallel.tp
    if tp > 1:
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()
    import contextlib

    return contextlib.nullcontext()


def build_state(config: TrainConfig, device: torch.device | None = None) -> TrainState:
    """Everything a run needs, on every rank. Raises DayzeroError (identically on all ranks)
    before any collective if the request cannot run."""
    require_torch()
    device = device or init_distributed()
    spec, parallel = config.spec(), config.parallel
    check_runtime(spec, parallel, dist.get_world_size())
    files = resolve_data(config.data)
    data = TokenStream(files, parallel.seq, config.seed, spec.vocab)
    torch.manual_seed(config.seed)

    meshes = build_meshes(parallel, device.type)
    param_dtype = torch.bfloat16 if config.compute_dtype == "bf16" else torch.float32
    model = build_model(spec, parallel.seq)
    weights, buffers = seeded_weights(config.seed, device), None
    if config.hf_weights:
        from dayzero.runtime.hf_weights import HFCheckpoint

        ckpt = HFCheckpoint(config.hf_weights, spec)
        weights = buffers = ckpt.tensor
    pm = parallelize(model, meshes, device, param_dtype, weights, buffers)
    for part in pm.parts:
        for m in part.modules():
            if isinstance(m, MoE):
                m.aux_loss_scale = 1.0 / parallel.microbatches
    pm.train()
    pipeline = None
    if parallel.pp > 1:
        pipeline = build_pipeline(list(zip(pm.stage_indices, pm.parts)), parallel, meshes.pp_group, device,
                                  loss_fn(parallel.microbatches))
    optimizer = build_optimizer(pm.parameters(), config.lr, config.weight_decay)
    scheduler = build_scheduler(optimizer, config.warmup_steps, config.steps, config.min_lr_ratio)
    return TrainState(config, spec, meshes, device, pm, pipeline, optimizer, scheduler, data)


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
            # ZeRO-0/1 reduce gradients once per step; ZeRO-2/3 keep them sharded, so every micro-batch
            part.set_requires_gradient_sync(i == len(xs) - 1 or p.zero >= 2)
            loss = f(part(x), y)
            loss.backward()
            total = total + _local(loss).detach()
        return total


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def train_step(state: TrainState, timer: CommTimer | None = None) -> StepRecord:
    cfg, p, meshes = state.config, state.config.parallel, state.meshes
    timer = timer or CommTimer(False, state.device)
    timer.start()
    t0 = time.perf_counter()
    x, y = state.data.batch(p.gbs, meshes.dp_rank, p.dp)
    inputs = torch.from_numpy(x).to(state.device)
    labels = torch.from_numpy(y).to(state.device)
    local_loss = forward_backward(state, inputs, labels)
    params = list(state.model.parameters())
    norm = clip_grad_norm_(params, cfg.grad_clip, meshes.shape.stage)
    lr = state.scheduler.get_last_lr()[0]
    state.optimizer.step()
    state.scheduler.step()
    state.optimizer.zero_grad(set_to_none=True)
    update_expert_bias(state)
    # the loss is replicated over tp and lives on the last stage: count each dp replica once
    on_last = state.pipeline is None or state.pipeline.has_last
    owner = on_last and meshes.tp_rank == 0
    loss = (local_loss if owner else torch.zeros_like(local_loss)).float().reshape(1)
    if dist.get_world_size() > 1:
        dist.all_reduce(loss)
    loss = loss / p.dp
    if state.device.type == "cuda":
        torch.cuda.synchronize(state.device)
    elapsed = time.perf_counter() - t0
    comm = timer.stop()
    stats = torch.tensor([float(peak_memory_bytes(state.device)), comm], dtype=torch.float64,
                         device=state.device)
    if dist.get_world_size() > 1:
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    state.step += 1
    tokens = p.gbs * p.seq
    rec = StepRecord(step=state.step, loss=float(loss), grad_norm=float(norm), lr=float(lr), tokens=tokens,
                     step_time_s=elapsed, tokens_per_s=tokens / elapsed, peak_mem_bytes=int(stats[0]),
                     comm_time_s=float(stats[1]))
    state.history.append(rec)
    return rec


@torch.no_grad()
def update_expert_bias(state: TrainState) -> None:
    """Auxiliary-loss-free balancing (Wang et al. 2024; DeepSeek-V3): after each step, raise the
    selection bias of under-loaded experts and lower it for over-loaded ones by ``rate``, with
    loads counted over every token of the step on this stage."""
    moes = [m for part in state.model.parts for m in part.modules() if isinstance(m, MoE)]
    biased = [m for m in moes if m.router.e_score_correction_bias is not None]
    if biased and state.config.expert_bias_rate > 0:
        loads = torch.stack([m.tokens_per_expert for m in biased])  # (moe layers, experts)
        if state.meshes.shape.stage > 1:
            dist.all_reduce(loads, group=state.meshes.stage_group)
        delta = torch.sign(loads.mean(dim=1, keepdim=True) - loads) * state.config.expert_bias_rate
        for m, d in zip(biased, delta):
            m.router.e_score_correction_bias += d
    for m in moes:
        m.tokens_per_expert.zero_()


# -- the loop --------------------------------------------------------------------------------

Hook = Callable[[TrainState, StepRecord], None]


def train(config: TrainConfig, hooks: tuple[Hook, ...] = (), state: TrainState | None = None) -> TrainState:
    """Run ``config.steps`` steps (from ``state.step`` when resuming); rank 0 writes the metrics
    stream and shows progress."""
    from dayzero.runtime.progress import Progress

    state = state or build_state(config)
    rank0 = dist.get_rank() == 0
    writer = MetricsWriter(config.metrics, rank0)
    timer = CommTimer(config.measure_comm and dist.get_world_size() > 1, state.device)
    t_start = time.perf_counter()
    try:
        with Progress(config.steps, enabled=rank0 and not config.quiet, start=state.step) as bar:
            while state.step < config.steps:
                rec = train_step(state, timer)
                writer.write(rec.to_dict())
                bar.update(rec)
                for hook in hooks:
                    hook(state, rec)
        writer.write(end_record(state, time.perf_counter() - t_start))
    finally:
        writer.close()
    return state


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
            "compute_dtype": state.config.compute_dtype, "device": state.device.type}
