"""The expert-placement file: loading, the rules it enforces, and one-line errors."""

from __future__ import annotations

import json

import pytest

from dayzero.errors import DayzeroError
from dayzero.specs.placement import (
    FORMAT,
    Placement,
    PlacementError,
    check_slots,
    contiguous_slots,
    load_placement,
    placement_from_json,
)

GOOD = {"format": FORMAT, "experts": 8, "ep": 4,
        "layers": {"3": [[0, 5, 7], [1, 2, 7], [3, 4, 0], [6, 5, 1]]},
        "default": [[0, 1, 2], [3, 4, 5], [6, 7, 0], [1, 2, 3]]}


def write(tmp_path, obj) -> str:
    p = tmp_path / "placement.json"
    p.write_text(json.dumps(obj))
    return str(p)


def test_load_round_trip(tmp_path):
    pl = load_placement(write(tmp_path, GOOD), experts=8, ep=4)
    assert pl.slots(3) == ((0, 5, 7), (1, 2, 7), (3, 4, 0), (6, 5, 1))
    assert pl.slots(9) == ((0, 1, 2), (3, 4, 5), (6, 7, 0), (1, 2, 3))  # not listed -> default
    assert pl.slots_per_rank == 3 and pl.redundant == 4 and pl.layer_indices == (3,)
    assert pl.replicas(3)[7] == (0, 1) and pl.replicas(3)[2] == (1,) and pl.replicas(3)[0] == (0, 2)
    assert placement_from_json(pl.to_json()) == pl


def test_contiguous_default_and_no_default():
    assert contiguous_slots(8, 4) == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert Placement(8, 4).slots(5) == contiguous_slots(8, 4)
    only = Placement(8, 4, ((2, contiguous_slots(8, 4)),))
    with pytest.raises(PlacementError, match="no slots for layer 5"):
        only.slots(5)


@pytest.mark.parametrize("slots, match", [
    ([[0, 1], [2, 3], [4, 5], [6]], "unequal slot counts"),
    ([[0, 1], [2, 3], [4, 5], [6, 5]], "expert 7 placed on no rank"),
    ([[0, 1], [2, 3], [4, 5], [6, 7], [0, 1]], "names rank 4"),
    ([[0, 1], [2, 3], [4, 5]], "has 3 rank lists but ep=4"),
    ([[0, 1], [2, 3], [4, 5], [6, 8]], "names expert 8"),
    ([[0, 1], [2, 3], [4, 5], [6, True]], "names expert True"),
    ([[0, 0, 1], [2, 3, 4], [5, 6, 7], [1, 2, 3]], "holds expert 0 twice"),
    ("0,1,2", "one list of expert ids per EP rank"),
])
def test_bad_slots_one_line(tmp_path, slots, match):
    obj = dict(GOOD, layers={"1": slots})
    obj.pop("default")
    with pytest.raises(DayzeroError, match=match) as e:
        load_placement(write(tmp_path, obj), experts=8, ep=4)
    assert "\n" not in str(e.value) and str(tmp_path) in str(e.value) and e.value.exit_code == 2


@pytest.mark.parametrize("change, match", [
    ({"format": "other/1"}, "expected 'dayzero-expert-placement/1'"),
    ({"experts": 16}, "'experts': is 16 but this run has experts=8"),
    ({"ep": 2}, "'ep': is 2 but this run has ep=4"),
    ({"layers": {"x": GOOD["default"]}}, "not a layer index"),
    ({"layers": {"1": [[0, 1], [2, 3], [4, 5], [6, 7]]}}, "different slot counts per rank"),
])
def test_bad_file_one_line(tmp_path, change, match):
    with pytest.raises(DayzeroError, match=match) as e:
        load_placement(write(tmp_path, dict(GOOD, **change)), experts=8, ep=4)
    assert "\n" not in str(e.value)


def test_missing_file_and_empty(tmp_path):
    with pytest.raises(DayzeroError, match="file not found"):
        load_placement(tmp_path / "nope.json")
    with pytest.raises(DayzeroError, match="lists no layers"):
        load_placement(write(tmp_path, {"format": FORMAT, "experts": 8, "ep": 4, "layers": {}}))


def test_check_slots_returns_tuples():
    assert check_slots([[1, 0], [3, 2]], 4, 2) == ((1, 0), (3, 2))
    with pytest.raises(PlacementError, match="cannot be split evenly"):
        contiguous_slots(6, 4)
