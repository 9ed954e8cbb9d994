"""The runtime: trains a ParallelConfig for real on PyTorch's distributed engine.

Four sub-packages hold the architecture: ``models`` (the zoo, built from a ModelSpec),
``parallel`` (one module per parallel dimension, and ``parallelize`` applying them in order),
``checkpoint`` (sharded, versioned, verified saves; Hugging Face weights in and out) and
``resilience`` (stopping, rank logs, fault drills, the hang watchdog, loss guards, alert actions,
the exclusion list and the relaunch on fewer ranks).

The modules here, in reading order: ``config`` (TrainConfig, the run as a document), ``checks``
(what the runtime can run, before any process starts), ``preflight`` (every check of a run, shared
by ``dayzero train`` and its ``--dry-run``), ``planner_view`` (the runtime as the planner sees it:
the ZeRO stage FSDP2 really has, the model it builds, its bytes), ``memory_check`` (will it fit this
machine), ``device`` (the one place that knows device types and backends), ``torch_compat`` (the
private PyTorch APIs, behind a version check), ``distributed`` (joining and leaving the process
group), ``data`` (the token stream), ``optim`` (AdamW, warmup-cosine, global grad-norm clipping),
``metrics`` (per-step records, the JSONL stream), ``telemetry`` (device health), ``monitoring`` (the
per-step rows behind the Prometheus exporter and the in-process alert rules of
:mod:`dayzero.monitor`), ``progress`` (rank 0's progress bar), ``train`` (the state, the step
function and the loop), ``launch`` (starting local ranks under torchrun's agent) and ``train_entry``
(``dayzero train``: here or on spawned ranks). Everything here imports torch; nothing below this layer
imports from it.
"""
