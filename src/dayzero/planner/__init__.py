"""The planner: pure functions over specs (numpy, never torch at import time).

Modules: :mod:`memory` (per-device, per-stage bytes for a parallel layout), :mod:`activations`
(per-layer saved tensors), :mod:`schedule` (pipeline orders and in-flight micro-batches),
:mod:`params` (what each rank holds of each layer), :mod:`allocator` and :mod:`replay` (a caching
block allocator replaying one training step).
"""
