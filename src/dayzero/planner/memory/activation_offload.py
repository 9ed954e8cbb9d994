"""Activation CPU offload: the saved activations of the first N layers of each model chunk go to
host memory in the forward and come back for the backward (Megatron-Core ``--cpu-offloading
--cpu-offloading-num-layers N``, which runs Transformer Engine's ``get_cpu_offload_context``;
torch's ``torch.autograd.graph.save_on_cpu`` is the same idea without the scheduling).

What the engine keeps on the device (Transformer Engine docs/features/cpu_offloading, "Default
Offloading Scheduling"): "First ``num_layers`` layers are offloaded to CPU"; "At most
``(model_layers - num_layers)`` sets of activations are on GPU at any time"; ``num_layers`` is at
most ``model_layers - 1``, and at ``model_layers - 1`` "compute and transfers cannot overlap"
(one resident set). So per micro-batch in flight the device holds the saved tensors of the
chunk's other ``L - N`` layers: the memory falls by N layers' saved activations, and the
transfers overlap compute as long as two sets fit (``L - N >= 2``).

Time, per offloaded layer and micro-batch: the D2H copy of its saved bytes in the forward, which
runs while the next layer's forward computes, and the H2D copy in the backward, while the layer
above it runs its backward; what the compute does not cover is exposed:

    exposed = max(0, bytes / link - t_fwd) + max(0, bytes / link - t_bwd)     (L - N >= 2)
    exposed = 2 * bytes / link                                                (L - N == 1)

over the device's host link (the cluster's :attr:`dayzero.specs.host.HostSpec.link_bw` per direction:
a DGX H100's PCIe Gen5 x16, 63 GB/s, an Atlas 800T A2's PCIe 4.0 x16, a GB200's NVLink-C2C share).
Not modelled: the HBM bandwidth the copies take from memory-bound kernels (TE's docs note it), and
D2H/H2D contention where a pipeline schedule runs one micro-batch's forward next to another's backward.

Both sides price the offloaded layers as the rank's average layer (its saved bytes per micro-batch
over its layer count, the compute per layer of each class weighted by its count): exact for a
model whose layers are alike, an approximation where the first layers of a chunk differ (dense
layers before MoE ones). Under full recompute an offloaded layer sends its checkpoint (the layer
input, :attr:`dayzero.planner.memory.activations.LayerActivation.full`); Megatron-Core does not combine
the two (engines.py), so that case only answers "what if".
"""

from __future__ import annotations

import numpy as np

from dayzero.errors import ConfigError
from dayzero.specs.host import PCIE_GEN5_X16_BW

FLAG = "--activation-offload"
# the layout field and grid column (ParallelConfig.activation_offload_layers) a search sets per row;
# planner.engines.RUN_SWITCHES names the same column for the run-wide option the engine limits read
COLUMN = "activation_offload_layers"


def offload_layers_of(grid: dict, default: int):
    """The rows' offloaded layers per chunk: the grid's :data:`COLUMN` (the layout's own N) where it
    has one, at least ``default`` (the run's ``--activation-offload N``,
    MemoryOptions / PerfOptions.activation_offload_layers: it pins every layout to N or more)."""
    return np.maximum(np.asarray(grid[COLUMN]), default) if COLUMN in grid else default


def offloaded_layers(n, layers, chunks):
    """Layers whose saved activations live on the host, per rank: ``n`` of each of the rank's
    ``chunks`` model chunks (``layers`` on the rank in all), at most ``L - 1`` of a chunk of ``L``
    layers (TE keeps one set resident). Arrays broadcast (``n`` too: a per-row grid column)."""
    layers = np.asarray(layers, dtype=float)
    chunks = np.maximum(np.asarray(chunks, dtype=float), 1)
    per_chunk = np.floor(layers / chunks)
    return np.clip(np.minimum(np.asarray(n, dtype=float), per_chunk - 1), 0, None) * chunks


def offload_fraction(n, layers, chunks):
    """The share of the rank's saved layer activations offloaded (0 where it holds no layer)."""
    layers = np.asarray(layers, dtype=float)
    off = offloaded_layers(n, layers, chunks)
    return np.where(layers > 0, off / np.where(layers > 0, layers, 1), 0.0)


def resident_sets(n, layers, chunks):
    """Sets of layer activations a chunk keeps on the device while offloading: ``L - N``."""
    layers = np.asarray(layers, dtype=float)
    chunks = np.maximum(np.asarray(chunks, dtype=float), 1)
    per_chunk = np.floor(layers / chunks)
    return per_chunk - np.clip(np.asarray(n, dtype=float), 0, np.maximum(per_chunk - 1, 0))


def exposed_transfer_s(saved_bytes, fwd_s, bwd_s, resident, host_link_bw: float = PCIE_GEN5_X16_BW):
    """Seconds one offloaded layer adds to one micro-batch: its D2H copy beyond the next layer's
    forward plus its H2D copy beyond the backward it overlaps; the whole of both copies where only
    one set stays resident (``resident`` < 2: nothing to compute meanwhile)."""
    x = np.asarray(saved_bytes, dtype=float) / host_link_bw
    hidden = np.maximum(0.0, x - fwd_s) + np.maximum(0.0, x - bwd_s)
    return np.where(np.asarray(resident) >= 2, hidden, 2 * x)


def offload_exposed_mb(n, counts, saved_bytes, fwd_s, bwd_s, chunks,
                       host_link_bw: float = PCIE_GEN5_X16_BW):
    """(N,) exposed seconds per micro-batch on a rank with ``counts`` (K, N) layers of each class
    (``saved_bytes``, ``fwd_s``, ``bwd_s``: (K, N) per layer of each class; ``n``: an int or (N,)
    per row): the rank's :func:`offloaded_layers` priced as its average layer."""
    counts = np.asarray(counts, dtype=float)
    layers = counts.sum(axis=0)
    off = offloaded_layers(n, layers, chunks)
    per_layer = exposed_transfer_s(saved_bytes, fwd_s, bwd_s, resident_sets(n, layers, chunks), host_link_bw)
    mean = np.sum(counts * per_layer, axis=0) / np.where(layers > 0, layers, 1)
    return off * mean


def check_activation_offload(n: int, chunk_layers: int | None = None) -> None:
    """``n`` offloaded layers per chunk: >= 0, and fewer than the smallest model chunk's
    ``chunk_layers`` (TE keeps at least one set on the device; Megatron-Core:
    ``cpu_offloading_num_layers < num_layers``)."""
    if n < 0:
        raise ConfigError(FLAG, None, f"must be >= 0 layers per model chunk (0: off), got {n}")
    if chunk_layers is not None and n > 0 and n >= chunk_layers:
        raise ConfigError(FLAG, None, f"{n} layers per model chunk leaves none on the device: the smallest chunk "
                                      f"has {chunk_layers}, so offload at most {chunk_layers - 1}")


def layer_saved_bytes(spec, kinds, opts, g: dict, replayed=None):
    """(K, N) bytes one layer of each of ``kinds`` saves per micro-batch for the grid rows ``g``, as
    the memory model counts them (planner.memory.activations.layer_activation under the row's recompute:
    the layer input under full recompute, the module set's remainder under selective, every saved
    tensor otherwise). ``replayed`` (K,) bools: False for a class full recompute does not replay
    (perf.partial_recompute's second copy), which saves everything a plain layer does."""
    from dayzero.planner.memory.activations import Dims, layer_activation
    from dayzero.specs.grid import BF16, FULL, SELECTIVE, recompute_modules

    d = Dims(seq=g["seq"], mbs=g["mbs"], tp=g["tp"], cp=g["cp"], etp=g["etp"],
             sp=np.asarray(g["sequence_parallel"]) > 0, fp8=np.asarray(g["precision"]) != BF16)
    rc, modules = np.asarray(g["recompute"]), recompute_modules(g)
    replayed = [True] * len(kinds) if replayed is None else replayed
    rows = []
    for kind, rep in zip(kinds, replayed):
        a = layer_activation(spec, kind, opts, d)
        plain = np.where(rc == SELECTIVE, a.saved(modules), a.none)
        rows.append(np.broadcast_to(np.where((rc == FULL) & rep, a.full, plain), rc.shape).astype(float))
    return np.stack(rows)


def fewest_offloaded_layers(memory, grid: dict, limit: float, chunk_layers) -> np.ndarray:
    """(N,) per row of ``grid``: the fewest layers per model chunk whose offload brings the row's
    peak to at most ``limit`` bytes, 0 where even ``chunk_layers - 1`` does not (or the chunk has
    one layer); meant for rows that do not fit without it (one that does gets 1). ``memory``:
    grid -> (N,) peak bytes (a search's memory function, e.g.
    :func:`dayzero.planner.memory.memory.peak_memory_batch` bound to a spec and options);
    ``chunk_layers``: (N,) the smallest chunk's layers of each row. The peak never grows with N
    (each rank's term falls linearly and the peak is their maximum), so a bisection over all rows
    at once needs about log2(layers) memory calls, with the grid's :data:`COLUMN` set to the
    layers tried."""
    n = len(np.ravel(grid["tp"]))
    top = np.maximum(np.asarray(chunk_layers, dtype=np.int64) - 1, 0)
    out = np.zeros(n, dtype=np.int64)
    open_ = np.flatnonzero(top > 0)
    if len(open_):
        at_top = memory({**{k: np.asarray(v)[open_] for k, v in grid.items()}, COLUMN: top[open_]})
        open_ = open_[at_top <= limit]
    lo, hi = np.ones(len(open_), dtype=np.int64), top[open_]
    while len(open_) and (lo < hi).any():
        mid = (lo + hi) // 2
        fits = memory({**{k: np.asarray(v)[open_] for k, v in grid.items()}, COLUMN: mid}) <= limit
        lo, hi = np.where(fits, lo, mid + 1), np.where(fits, mid, hi)
    out[open_] = hi
    return out
