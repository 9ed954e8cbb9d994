"""Reading measured expert loads from a metrics JSONL (the telemetry interface) or a JSON matrix."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dayzero.errors import DayzeroError
from dayzero.planner.perf.moe_imbalance import measured_imbalance
from dayzero.specs.expert_loads import read_expert_loads, read_telemetry
from dayzero.specs.placement import Placement


def jsonl(tmp_path, records) -> str:
    p = tmp_path / "metrics.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return str(p)


def rec(step, loads=None, layers=(3, 5)):
    r = {"step": step, "loss": 1.0, "moe": {"layers": list(layers), "max_mean": [1.0] * len(layers),
                                             "cv": [0.0] * len(layers), "dropped": [0.0] * len(layers),
                                             "rank_max_mean": [1.0] * len(layers)}}
    if loads is not None:
        r["expert_loads"] = loads
    return r


def test_redone_step_counts_once_and_events_are_skipped(tmp_path):
    """A step redone after a resume appears twice; the later record counts (as the runtime's reader)."""
    path = jsonl(tmp_path, [rec(1, [[1, 0], [0, 1]]), rec(2, [[5, 5], [5, 5]]), {"event": "checkpoint", "step": 2},
                            rec(2, [[2, 0], [0, 2]]), {"event": "end"}])
    loads = read_expert_loads(path)
    assert loads.layers == (3, 5) and loads.matrix == ((3.0, 0.0), (0.0, 3.0)) and loads.snapshots == 2
    assert [s.step for s in read_telemetry(path).steps] == [1, 2]


def test_dense_records_are_normal_and_matrix_forms(tmp_path):
    path = jsonl(tmp_path, [{"step": 1, "loss": 2.0}, rec(2, [[1, 2], [3, 4]])])
    assert read_expert_loads(path).matrix == ((1.0, 2.0), (3.0, 4.0))
    rows = tmp_path / "m.json"
    rows.write_text("[[1, 2], [3, 4]]")
    assert read_expert_loads(rows).layers == (0, 1)
    named = tmp_path / "n.json"
    named.write_text('{"layers": {"10": [1, 2], "2": [3, 4]}}')
    assert read_expert_loads(named).layers == (2, 10) and read_expert_loads(named).matrix[0] == (3.0, 4.0)


@pytest.mark.parametrize("records, match", [
    ([rec(1, [[1, 2]])], "has 1 layer rows but moe.layers names 2 layers"),
    ([rec(1, [[1, 2], [3, 4]]), rec(2, [[1, 2, 3], [3, 4, 5]])], "ragged|differ from step 1"),
    ([{"step": 1, "moe": {"layers": "all"}}], "'layers' must be a list"),
])
def test_bad_metrics_one_line(tmp_path, records, match):
    with pytest.raises(DayzeroError, match=match) as e:
        read_expert_loads(jsonl(tmp_path, records))
    assert "\n" not in str(e.value)


def test_measured_imbalance_mean_and_worst():
    """Two layers on ep=2, contiguous: [4, 0 | 2, 2] -> ranks 4, 4 -> 1.0; [3, 3 | 1, 1] -> 6, 2
    -> 1.5; the factor is their mean 1.25, the worst 1.5."""
    from dayzero.specs.expert_loads import ExpertLoads

    loads = ExpertLoads((0, 1), ((4.0, 0.0, 2.0, 2.0), (3.0, 3.0, 1.0, 1.0)), "x")
    m = measured_imbalance(4, loads, eps=(2,))
    assert m.at(2).mean == 1.25 and m.at(2).worst == 1.5 and m.values(np.array([2, 2])).tolist() == [1.25, 1.25]
    uniform = measured_imbalance(4, None, Placement(4, 2, default=((0, 1, 2), (0, 3, 1))), "p.json")
    # uniform loads, experts 0 and 1 on both ranks: rank loads 0.5+0.5+1 = 2 and 0.5+1+0.5 = 2
    assert uniform.at(2).mean == 1.0 and uniform.loads == "uniform (assumed)" and uniform.placement == "p.json"
