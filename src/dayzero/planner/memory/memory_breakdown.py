"""What ``dayzero memory`` reports for one layout: the layout it reads the stages of, then every
stage's memory, the model states before sharding, ZeRO 0-3 on this layout and an allocator replay
of the busiest stage (:class:`MemoryBreakdown`, whose :meth:`~MemoryBreakdown.to_dict` is the
verb's ``--json``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dayzero.planner.memory.memory import MemoryReport, ModelStates, estimate_memory, model_states, zero_comparison
from dayzero.planner.memory.memory_options import MemoryOptions
from dayzero.planner.memory.replay import StepSimulation, simulate_step
from dayzero.planner.targets import MEMORY_TARGET
from dayzero.specs import layout_rules
from dayzero.specs.cluster import Cluster
from dayzero.specs.counting import params_total
from dayzero.specs.model import ModelSpec
from dayzero.specs.parallel import ParallelConfig, with_even_split


def memory_layout(spec: ModelSpec, parallel: ParallelConfig, devices: int, capacity_bytes: int,
                  options: MemoryOptions, balance: bool = False) -> ParallelConfig:
    """The layout whose stages are reported, validated: the near-even split predict applies too
    (:func:`dayzero.specs.parallel.with_even_split`), or with ``balance`` the split that minimises
    the peak (:func:`dayzero.planner.memory.balance.balance_layers`)."""
    if not balance:
        par = with_even_split(spec, parallel)
        layout_rules.validate(par, spec, devices)
        return par
    from dayzero.planner.memory.balance import balance_layers

    layout_rules.validate(parallel.with_(layer_split=None), None, devices)
    return parallel.with_(layer_split=balance_layers(spec, parallel, capacity_bytes, options))


@dataclass(frozen=True)
class MemoryBreakdown:
    spec: ModelSpec
    cluster: Cluster
    parallel: ParallelConfig
    options: MemoryOptions
    report: MemoryReport
    states: ModelStates
    zero_rows: list[dict]  # planner.memory.memory.zero_comparison
    allocator: StepSimulation | None  # the busiest stage's replay, when asked for

    @property
    def within_target(self) -> bool:
        return self.report.utilization <= MEMORY_TARGET

    def to_dict(self) -> dict:
        """``dayzero memory --json`` (less the model notes every config-reading verb adds)."""
        obj = self.report.to_dict(terms=True)
        obj.update(model=self.spec.name, cluster=self.cluster.name, devices=self.cluster.devices,
                   parallel=self.parallel.to_dict(), target_utilization=MEMORY_TARGET,
                   within_target=self.within_target, busiest_stage=self.report.busiest_stage,
                   model_states=self.states.to_dict(), zero_comparison=self.zero_rows,
                   allocator=self.allocator.to_dict() if self.allocator else None, options=asdict(self.options))
        return obj


def memory_breakdown(spec: ModelSpec, cluster: Cluster, parallel: ParallelConfig, options: MemoryOptions,
                     simulate: bool = True, record_timeline: bool = False) -> MemoryBreakdown:
    """Every stage of ``parallel`` (a :func:`memory_layout`) on ``cluster``'s devices; with
    ``simulate`` (or ``record_timeline``) one step of the busiest stage through the caching allocator."""
    cap = cluster.memory_bytes
    report = estimate_memory(spec, parallel, cap, options)
    sim = None
    if simulate or record_timeline:
        sim = simulate_step(spec, parallel, cap, options, rank=report.busiest_stage, record_timeline=record_timeline)
    return MemoryBreakdown(spec, cluster, parallel, options, report, model_states(params_total(spec), options),
                           zero_comparison(spec, parallel, cap, options), sim)
