"""planner.memory.memory_breakdown: the layout dayzero memory reads and everything it reports of it, as one
library call."""

from __future__ import annotations

import pytest

from dayzero.errors import LayoutError
from dayzero.planner.memory.memory import MemoryOptions, estimate_memory, zero_comparison
from dayzero.planner.memory.memory_breakdown import memory_breakdown, memory_layout
from dayzero.planner.predict import with_even_split
from dayzero.planner.targets import MEMORY_TARGET
from dayzero.specs.cluster import build_cluster
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model


def test_the_breakdown_is_the_memory_model_on_the_even_split():
    spec, cl = load_model("llama-3.1-8b"), build_cluster("h100", 16)
    opts = MemoryOptions.for_run(cl.accelerator, "fused")
    par = memory_layout(spec, ParallelConfig(tp=2, pp=2, dp=4, gbs=16, seq=4096), cl.devices, cl.memory_bytes, opts)
    assert par == with_even_split(spec, ParallelConfig(tp=2, pp=2, dp=4, gbs=16, seq=4096))
    mb = memory_breakdown(spec, cl, par, opts)
    assert mb.report == estimate_memory(spec, par, cl.memory_bytes, opts)
    assert mb.zero_rows == zero_comparison(spec, par, cl.memory_bytes, opts)
    assert mb.allocator is not None and mb.allocator.rank == mb.report.busiest_stage
    d = mb.to_dict()
    assert d["target_utilization"] == MEMORY_TARGET and d["within_target"] == (mb.report.utilization <= MEMORY_TARGET)
    assert d["devices"] == 16 and d["parallel"] == par.to_dict() and d["options"]["grad_bytes"] == opts.grad_bytes
    assert d["stages"] == [s.to_dict(terms=True) for s in mb.report.stages]
    assert memory_breakdown(spec, cl, par, opts, simulate=False).to_dict()["allocator"] is None


def test_balance_splits_layers_to_lower_the_peak_and_bad_layouts_are_refused():
    spec, cl = load_model("llama-3.1-8b"), build_cluster("h100", 8)
    opts = MemoryOptions.for_run(cl.accelerator, "fused")
    base = ParallelConfig(pp=4, dp=2, gbs=16, seq=4096)
    even = memory_layout(spec, base, cl.devices, cl.memory_bytes, opts)
    bal = memory_layout(spec, base, cl.devices, cl.memory_bytes, opts, balance=True)
    assert sum(bal.layer_split) == spec.layers
    peak = {p: estimate_memory(spec, p, cl.memory_bytes, opts).peak_bytes for p in (even, bal)}
    assert peak[bal] <= peak[even]
    with pytest.raises(LayoutError):
        memory_layout(spec, ParallelConfig(tp=3, dp=2, gbs=16), cl.devices, cl.memory_bytes, opts)
