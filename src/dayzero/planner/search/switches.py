"""The memory switches the search tries per layout, one :class:`Switch` entry each.

A switch is a 0 / 1 ParallelConfig field (a grid column, :data:`dayzero.specs.grid.SWITCHES`)
that the memory and step-time models read per row. The search never enumerates both states: an
expert's rule says which state can be the fastest, and the pruning stays exact under the models.

* ``saves``: the switch keeps no more memory and takes no more time wherever an engine runs it,
  so it is on in every row where the layout rules allow it and an engine runs it (the pinned
  ``--engine``, else some engine), off elsewhere. FP8 parameter storage (Megatron-LM
  ``--fp8-param-gather``): the decoder layers' weights as FP8 copies, the FP8 weight cache keeps
  only the transpose, and the ZeRO parameter all-gathers send 1 B per element instead of 2
  (planner.memory.memory_options.MemoryOptions.fp8_params, planner.perf.comm.CommOptions.param_gather_bytes);
  the models add no term it makes larger.
* ``last_resort``: the switch lowers memory but only adds time, so it is tried only where the
  layout does not fit without it: a (base, ZeRO stage, recompute level) takes it only where no
  level at or below that one fits without it, as ZeRO-2 is tried only where ZeRO-1 does not fit.
  Optimizer CPU offload (Megatron-Core ``--optimizer-cpu-offload``; DeepSpeed ZeRO-Offload): the
  optimizer states and FP32 master leave the device (MemoryOptions.optimizer_offload) and the step
  pays the host Adam and the PCIe transfers instead of the device update (planner.memory.offload), which
  :func:`adds_time` checks on the cluster's own rates. The last-resort switches form a ladder in
  the order of :data:`SWITCHES`: pass k of the search turns on the first k of them.

A user flag (``--fp8-param-gather``, ``--optimizer-offload``) forces its switch on in every row the
layout rules allow (:attr:`Switch.forced`); ``--no-fp8-param-gather`` / ``--no-optimizer-offload``
(SearchSpace.no_switches) keep it off. A third switch plugs in as one more entry: its field, its
kind, how a user forces it and the memory terms it only removes (``drops``: its peaks then come
from the earlier pass's memory calls). The ladder sets a switch to 1; a count-valued one (say,
the activations of N layers offloaded) would take its largest value in its pass and the least N
that fits afterwards, by the bisection :func:`dayzero.planner.search.search_fit.fewest_recomputed_layers`
runs for full recompute. Activation offload is such a count (ParallelConfig.activation_offload_layers,
the first N layers of each chunk): it is searched apart from this registry, by
:func:`dayzero.planner.search.search_fit.offloaded_variants` (the fewest N that fits by
:func:`dayzero.planner.memory.activation_offload.fewest_offloaded_layers`, where no recompute does not
fit, at every pass of this ladder), and :func:`why_words` names it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np

Kind = Literal["saves", "last_resort"]


@dataclass(frozen=True)
class Switch:
    name: str  # the ParallelConfig field and grid column
    flag: str  # the plan/predict/memory flag that forces it on
    kind: Kind
    # (MemoryOptions, PerfOptions) -> whether the user forced it on for every row
    forced: Callable[[object, object], bool]
    words: str  # what it is, for the plan's "why" line
    # memory terms (planner.memory.memory_terms names) the switch removes and nothing else it changes in
    # memory: the search reads its peak from the same memory call (peak_memory_batch ``without``)
    drops: tuple[str, ...] = ()
    # for a last-resort switch, (cluster, PerfOptions) -> whether it really adds time there; where it
    # does not, it is a ``saves`` switch on that cluster
    slower: Callable[[object, object], bool] | None = None


SWITCHES: tuple[Switch, ...] = (
    Switch("fp8_param_gather", "--fp8-param-gather", "saves",
           lambda mo, po: bool(getattr(mo, "fp8_params", False) or po.comm.fp8_param_gather),
           "FP8 parameter storage and FP8 ZeRO all-gathers"),
    Switch("optimizer_offload", "--optimizer-offload", "last_resort",
           lambda mo, po: bool(getattr(mo, "optimizer_offload", False) or po.optimizer_offload),
           "the optimizer states and FP32 master in host memory, Adam on the CPU",
           drops=("optimizer:master", "optimizer:moments"),  # memory_terms._model_state_terms
           slower=lambda cluster, options: adds_time(cluster, options)),
)
BY_NAME = {s.name: s for s in SWITCHES}


def adds_time(cluster, options) -> bool:
    """Whether optimizer offload takes longer per optimizer-shard parameter than the device update
    on ``cluster``: host Adam + the copies over the cluster's host (:attr:`Cluster.host
    <dayzero.specs.cluster.Cluster.host>`; :func:`dayzero.planner.memory.offload.offloaded_optimizer_s`) against
    the device's bytes per parameter over its HBM bandwidth (planner.perf.perf's ``optimizer_s``). Both
    are linear in the shard, so one parameter decides for every row; where it is not slower (never
    with the shipped rates: 0.46 ns per parameter on a DGX H100's host against 0.009 ns on an H100;
    0.46 ns on an Atlas 800T A2's against 0.019 ns on a 910B) offload would save time too and the
    search treats it as a ``saves`` switch."""
    from dayzero.planner.memory.offload import offloaded_optimizer_s
    from dayzero.planner.perf.calibration import constants_for, rates

    consts = options.constants or constants_for(cluster)
    device = consts.optimizer_bytes_per_param / rates(cluster, consts).hbm_bw
    host = cluster.host
    return float(offloaded_optimizer_s(1.0, options.comm.grad_reduce_bytes, host.link_bw, host.memory_bw)) >= device


def kinds(cluster, options) -> dict[str, Kind]:
    """Each switch's kind on ``cluster`` under ``options`` (a last-resort one that is not
    :attr:`Switch.slower` there saves)."""
    return {s.name: s.kind if s.slower is None or s.slower(cluster, options) else "saves" for s in SWITCHES}


def why_words(p) -> list[str]:
    """Why each switch a layout (a ParallelConfig or its ``to_dict()``) has on is on, for the plan's
    output (empty when none is)."""
    why = {"saves": "on wherever the engine runs it: it only saves memory and time",
           "last_resort": "on because nothing fits without it at this recompute or less: it adds time to every "
                          "step"}
    get = p.get if isinstance(p, dict) else lambda k, d=None: getattr(p, k, d)
    out = [f"{s.words} ({s.flag}; {why[s.kind]})" for s in SWITCHES if get(s.name, False)]
    n = get("activation_offload_layers", 0)
    if n:  # a count, searched apart from these (planner.search.search_fit.offloaded_variants)
        out.append(f"the saved activations of the first {n} layers of each model chunk in host memory "
                   f"(--activation-offload {n}; the fewest that fit without recompute: it adds the PCIe copies "
                   "compute does not hide)")
    return out


def rule_mask(spec, devices):
    """``grid -> rows`` the layout rules that read a switch column allow (:mod:`dayzero.specs.layout_rules`)."""
    from dayzero.specs.grid import SWITCHES as COLUMNS
    from dayzero.specs.layout_rules import RULES, mask

    rules = tuple(r for r in RULES if any(c in r.reads for c in COLUMNS))

    def ok(grid: dict) -> np.ndarray:
        return mask(grid, spec, devices, rules)
    return ok
