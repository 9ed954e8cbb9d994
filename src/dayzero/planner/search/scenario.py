"""``dayzero plan`` as one library call: the search space its flags pin, the memory switches it
searches or keeps off, the search (:func:`dayzero.planner.search.search.plan`), and the time, energy
and cost of training each plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from dayzero.errors import ConfigError, FitError
from dayzero.planner.engines import default_engine, get_engine
from dayzero.planner.memory.activation_offload import COLUMN as OFFLOAD
from dayzero.planner.memory.activation_offload import check_activation_offload
from dayzero.planner.memory.memory_options import MemoryOptions
from dayzero.planner.perf.perf import PerfOptions
from dayzero.planner.search.error_band import band_for
from dayzero.planner.search.search import plan
from dayzero.planner.search.search_space import SearchSpace
from dayzero.planner.training_cost import CostOptions, with_training
from dayzero.specs.cluster import Cluster
from dayzero.specs.layout_fields import search_pins
from dayzero.specs.model import ModelSpec


@dataclass(frozen=True)
class Switches:
    """The memory switches as ``dayzero plan``'s flags give them (planner.search.switches): None
    searched, True forced on, False kept off; ``activation_offload`` N > 0 pins the offloaded layers
    per chunk, ``no_activation_offload`` keeps the searched offload off."""

    fp8_param_gather: bool | None = None
    optimizer_offload: bool | None = None
    activation_offload: int = 0
    no_activation_offload: bool = False

    def kept_off(self) -> tuple[str, ...]:
        """SearchSpace.no_switches: the switches given as --no-X."""
        off = tuple(n for n in ("fp8_param_gather", "optimizer_offload") if getattr(self, n) is False)
        if not self.no_activation_offload:
            return off
        if self.activation_offload:
            raise ConfigError("--no-activation-offload", None,
                              f"contradicts --activation-offload {self.activation_offload}; give one of them")
        return off + (OFFLOAD,)


@dataclass(frozen=True)
class Scenario:
    """What ``dayzero plan`` searches: the model on the cluster at a batch and precision, with the
    flags' pins (field name -> comma-separated text, layout_fields.search_pins), rank order, engine
    (None: every one), memory switches and recipe (MemoryOptions keywords, cli.common.memory_recipe)."""

    spec: ModelSpec
    cluster: Cluster
    gbs: int
    seq: int
    precision: str
    pins: Mapping[str, str | None]
    switches: Switches = Switches()
    engine: str | None = None
    recipe: Mapping | None = None
    attention_kernel: str = "fused"
    placement: str | None = None


def scenario_engine(engine: str | None, cluster: Cluster) -> str | None:
    """The engine a plan is searched for: the one given, else the vendor's own (Huawei: MindSpeed)."""
    engine = engine or default_engine(cluster.accelerator.vendor)
    return get_engine(engine).name if engine else None


def search_space(sc: Scenario, opts: PerfOptions) -> SearchSpace:
    """The pins as a SearchSpace; a placement is for one EP size, so only that one is searched."""
    kw = search_pins(sc.pins)
    if sc.placement:
        placed = opts.comm.moe_measured.by_ep[0].ep
        if kw.get("ep") not in (None, (placed,)):
            raise ConfigError("--placement", None, f"is for ep {placed}, but --ep asks for {list(kw['ep'])}; "
                              f"drop --ep or pass --ep {placed}")
        kw["ep"] = (placed,)
    return SearchSpace(engine=sc.engine, no_switches=sc.switches.kept_off(), **kw)


def plan_scenario(sc: Scenario, opts: PerfOptions, top_k: int, max_memory: float, cost: CostOptions,
                  expert_loads: str | None = None, calibration: str | None = None) -> dict:
    """The ``dayzero plan --json`` object of ``sc`` (planner.search.search.plan, uncertainty
    included) with each plan's training time, energy and cost; a calibrated plan's error band is
    its runs' residuals. Nothing fitting is a FitError that also says to raise ``--max-memory``."""
    opts = opts.with_expert_loads(sc.spec, expert_loads, sc.placement)
    space = search_space(sc, opts)
    if sc.switches.activation_offload:  # per layout the search caps it at a chunk's layers - 1
        check_activation_offload(sc.switches.activation_offload, sc.spec.layers)
    mopts = MemoryOptions.for_run(sc.cluster.accelerator, sc.attention_kernel, **sc.recipe) if sc.recipe else None
    try:
        obj = plan(sc.spec, sc.cluster, sc.gbs, sc.seq, sc.precision, opts, top_k, max_memory, space,
                   memory_options=mopts, uncertainty=True)
    except FitError as e:  # the plan verb alone has the memory limit as a flag
        raise FitError(f"{e}; or raise --max-memory (now {max_memory:.0%})") from None
    obj = with_training(obj, sc.cluster, cost)
    if calibration and obj.get("error_band"):  # a calibrated plan's band: its runs' residuals (calibrate --runs)
        obj["error_band"] = band_for(sc.spec, sc.cluster, sc.precision, obj["error_band"]["mfu"], sc.engine,
                                     calibration).to_dict()
    return obj
