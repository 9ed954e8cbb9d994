"""Expert placement: which routed experts each expert-parallel (EP) rank holds, per MoE layer.

A placement gives every EP rank the same number of expert *slots*; with ``redundant`` spare slots
in total, ``slots per rank = (experts + redundant) / ep``. Every expert ``0..E-1`` sits in at least
one slot of every layer; an expert in slots on two ranks is *replicated* (its tokens are split over
its replicas, as in DeepSeek-V3's redundant experts, arXiv:2412.19437 section 3.4).

The file (``dayzero moe place --out``; read by the runtime) is JSON::

    {"format": "dayzero-expert-placement/1", "experts": 8, "ep": 4,
     "layers": {"3": [[0, 5, 7], [1, 2, 7], [3, 4, 0], [6, 5, 1]], ...},
     "default": [[0, 1], [2, 3], [4, 5], [6, 7]]}

``layers`` maps a global layer index to one list of expert ids per EP rank, in slot order;
``default`` (optional) serves the layers not listed. Pure Python; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dayzero.errors import ConfigError
from dayzero.inputs import load_json

FORMAT = "dayzero-expert-placement/1"

Slots = tuple[tuple[int, ...], ...]  # slots[rank] = expert ids on that EP rank, in slot order


class PlacementError(ConfigError):
    """A placement file (or a placement built in code) breaks the placement rules."""


def contiguous_slots(experts: int, ep: int) -> Slots:
    """The default placement: expert ``e`` on rank ``e // (experts / ep)``, no replicas."""
    if ep < 1 or experts < 1 or experts % ep:
        raise PlacementError("placement", None, f"{experts} experts cannot be split evenly over ep={ep} ranks; "
                             "choose ep dividing the expert count")
    per = experts // ep
    return tuple(tuple(range(r * per, (r + 1) * per)) for r in range(ep))


def check_slots(slots: Any, experts: int, ep: int, source: str = "placement", field: str | None = None) -> Slots:
    """``slots`` (one list of expert ids per EP rank) as a :data:`Slots` tuple, or one
    PlacementError naming the broken rule: a rank outside the EP group, unequal slot counts, an
    expert id out of range, an expert twice on one rank, or an expert missing."""
    def bad(problem: str) -> PlacementError:
        return PlacementError(source, field, problem)

    if not isinstance(slots, (list, tuple)) or not all(isinstance(r, (list, tuple)) for r in slots):
        raise bad("expected one list of expert ids per EP rank")
    if len(slots) > ep:
        raise bad(f"names rank {ep} (of {len(slots)} ranks) but the EP group has ranks 0..{ep - 1}; "
                  f"give exactly {ep} rank lists or place for ep={len(slots)}")
    if len(slots) < ep:
        raise bad(f"has {len(slots)} rank lists but ep={ep}; give one list of expert ids per EP rank")
    counts = [len(r) for r in slots]
    if len(set(counts)) != 1 or counts[0] == 0:
        raise bad(f"ranks hold unequal slot counts {counts}; every EP rank needs the same number "
                  f"((experts + redundant) / ep) of slots")
    out = []
    for rank, ids in enumerate(slots):
        for e in ids:
            if isinstance(e, bool) or not isinstance(e, int) or not 0 <= e < experts:
                raise bad(f"rank {rank} names expert {e!r}; expert ids are integers 0..{experts - 1}")
        if len(set(ids)) != len(ids):
            twice = sorted({e for e in ids if ids.count(e) > 1})
            raise bad(f"rank {rank} holds expert {twice[0]} twice; replicas must be on different ranks")
        out.append(tuple(int(e) for e in ids))
    missing = sorted(set(range(experts)) - {e for r in out for e in r})
    if missing:
        shown = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
        raise bad(f"expert {shown} placed on no rank; every expert 0..{experts - 1} needs at least one slot")
    return tuple(out)


@dataclass(frozen=True)
class Placement:
    """Expert-to-rank slots per global MoE layer index; ``default`` serves layers not listed."""

    experts: int
    ep: int
    layers: tuple[tuple[int, Slots], ...] = ()  # (global layer index, slots), sorted by layer
    default: Slots | None = None

    def __post_init__(self):
        for layer, slots in self.layers:
            check_slots(slots, self.experts, self.ep, "placement", f"layers.{layer}")
        if self.default is not None:
            check_slots(self.default, self.experts, self.ep, "placement", "default")
        sizes = {len(s[0]) for _, s in self.layers} | ({len(self.default[0])} if self.default else set())
        if len(sizes) > 1:
            raise PlacementError("placement", None, f"layers hold different slot counts per rank {sorted(sizes)}; "
                                 "use one redundant-expert count for all layers")

    @property
    def slots_per_rank(self) -> int:
        first = self.default if self.default is not None else (self.layers[0][1] if self.layers else None)
        return len(first[0]) if first else self.experts // self.ep

    @property
    def redundant(self) -> int:
        return self.slots_per_rank * self.ep - self.experts

    @property
    def layer_indices(self) -> tuple[int, ...]:
        return tuple(layer for layer, _ in self.layers)

    def slots(self, layer: int) -> Slots:
        """The slots of global layer ``layer``: its own, else the default, else contiguous."""
        for idx, s in self.layers:
            if idx == layer:
                return s
        if self.default is not None:
            return self.default
        if self.layers:
            raise PlacementError("placement", None, f"has no slots for layer {layer} and no 'default'; "
                                 f"it lists layers {list(self.layer_indices)}")
        return contiguous_slots(self.experts, self.ep)

    def replicas(self, layer: int) -> dict[int, tuple[int, ...]]:
        """expert id -> the EP ranks holding it (ascending) in layer ``layer``."""
        out: dict[int, list[int]] = {e: [] for e in range(self.experts)}
        for rank, ids in enumerate(self.slots(layer)):
            for e in ids:
                out[e].append(rank)
        return {e: tuple(r) for e, r in out.items()}

    def to_json(self) -> dict:
        obj: dict[str, Any] = {"format": FORMAT, "experts": self.experts, "ep": self.ep,
                               "layers": {str(i): [list(r) for r in s] for i, s in self.layers}}
        if self.default is not None:
            obj["default"] = [list(r) for r in self.default]
        return obj


def placement_from_json(obj: Any, experts: int | None = None, ep: int | None = None,
                        source: str = "placement") -> Placement:
    """A :class:`Placement` from the parsed JSON, checked against the model's ``experts`` and the
    layout's ``ep`` when given (else the file's own)."""
    if not isinstance(obj, dict):
        raise PlacementError(source, None, f"expected a JSON object with \"format\": \"{FORMAT}\"")
    if obj.get("format") != FORMAT:
        raise PlacementError(source, "format", f"is {obj.get('format')!r}; expected {FORMAT!r} "
                             "(write one with `dayzero moe place --out`)")
    for key, want in (("experts", experts), ("ep", ep)):
        got = obj.get(key)
        if isinstance(got, bool) or not isinstance(got, int) or got < 1:
            raise PlacementError(source, key, f"must be a positive integer, got {got!r}")
        if want is not None and got != want:
            raise PlacementError(source, key, f"is {got} but this run has {key}={want}; "
                                 "place again for this model and EP size with `dayzero moe place`")
    experts, ep = int(obj["experts"]), int(obj["ep"])
    layers = obj.get("layers", {})
    if not isinstance(layers, dict):
        raise PlacementError(source, "layers", "must map a global layer index to rank lists")
    parsed = []
    for key, slots in layers.items():
        if not str(key).isdigit():
            raise PlacementError(source, "layers", f"key {key!r} is not a layer index (a non-negative integer)")
        parsed.append((int(key), check_slots(slots, experts, ep, source, f"layers.{key}")))
    default = obj.get("default")
    if default is not None:
        default = check_slots(default, experts, ep, source, "default")
    if not parsed and default is None:
        raise PlacementError(source, "layers", "lists no layers and no 'default'; nothing to place")
    try:
        return Placement(experts, ep, tuple(sorted(parsed)), default)
    except PlacementError as e:
        raise PlacementError(source, None, e.problem) from None


def load_placement(path: str | Path, experts: int | None = None, ep: int | None = None) -> Placement:
    """Read and check a placement file (see the module docstring for the format)."""
    obj = load_json(path, "write one with `dayzero moe place --loads ... --out placement.json`")
    return placement_from_json(obj, experts, ep, str(path))
