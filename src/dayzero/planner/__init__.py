"""The planner: pure functions over specs (numpy, never torch at import time).

Four rooms, each a package whose ``__init__`` gives its reading order and exports the names its
callers use (lazily: importing one module of a room costs that module alone):

- :mod:`~dayzero.planner.memory`: per-device, per-stage bytes of a training step (parameters,
  activations, offload, the allocator replay, ``dayzero memory``'s breakdown);
- :mod:`~dayzero.planner.perf`: step time (topology, collectives, compute, communication, the
  efficiency constants and their fits);
- :mod:`~dayzero.planner.search`: the fastest layouts that fit, over the whole layout space;
- :mod:`~dayzero.planner.backtest`: published training runs read, predicted and scored.

At the top, the modules every room uses: :mod:`engines` (who runs a layout, with sources),
:mod:`schedule` (pipeline orders and in-flight micro-batches), :mod:`targets` (the Day-0 targets),
:mod:`predict` (one layout's prediction: memory, time, checks) and :mod:`training_cost` (time,
energy and cost to train N tokens with a plan). :mod:`exports` makes the rooms' lazy exports.

Many layouts at once are the grid of :mod:`dayzero.specs.grid`; which layouts are valid is
:mod:`dayzero.specs.layout_rules`.
"""
