"""The planner: pure functions over specs (numpy, never torch at import time).

Memory: :mod:`memory` (per-device, per-stage bytes for a parallel layout), :mod:`activations`
(per-layer saved tensors), :mod:`schedule` (pipeline orders and in-flight micro-batches),
:mod:`params` (what each rank holds of each layer), :mod:`allocator` and :mod:`replay` (a caching
block allocator replaying one training step), :mod:`memory_breakdown` (all of it for one layout,
as ``dayzero memory`` reports it).

Performance: :mod:`topology` (rank layout, process groups and the tiers they span),
:mod:`collectives` (alpha-beta collective costs on switches and full meshes), :mod:`comm` (every
collective of a step and what hides it), :mod:`compute` (per-layer FLOPs and bytes -> time),
:mod:`perf` (step time, MFU), :mod:`predict` (the contract object with checks against
:mod:`targets`), :mod:`search` (vectorised search over the whole layout space), :mod:`published`
and :mod:`backtest` (predicting published training runs), :mod:`calibration` (efficiency
constants), :mod:`minimize` (Nelder-Mead for the fits).

Many layouts at once are the grid of :mod:`dayzero.specs.grid`; which layouts are valid is
:mod:`dayzero.specs.layout_rules`.
"""
