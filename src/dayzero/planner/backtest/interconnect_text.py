"""Interconnect statements of published runs -> per-device bandwidth of the cluster's two tiers.

Sources describe the fabric in free text: ``1600 Gbps node-node (RoCE)``, ``8x400G InfiniBand
NDR``, ``3.2 Tbps per node``, ``NVLink 900 GB/s``, ``100 Gbps per GPU``. :func:`read_interconnect`
returns the scale-up (inside a node) and scale-out (between nodes) bandwidths per device and per
direction -- the units of ``specs.cluster`` tiers -- and says how it read every figure. The text
is cut into segments at ``;`` ``,`` ``|`` ``+`` ``' / '`` and ``and``; each figure is read by
these rules, and where the text does not say, the convention used is returned in ``assumed``:

* **Figure**: a number and a rate unit. Bits: ``Gb/s Gbps Gbit/s 400G 100GbE Tb/s``; bytes:
  ``GB/s GBps GByte/s TB/s``; a rate whose case is lost (``gb/s``, ``GBPS``) is bits on a network,
  bytes on a scale-up fabric. A count multiplies (``8x400G``, ``4x HDR 200Gb/s``, ``8 NICs``). A
  generation without a number is its rate: InfiniBand EDR/HDR/NDR/XDR 100/200/400/800 Gb/s per
  port; NVLink 2/3/4/5 150/300/450/900 GB/s per GPU per direction (NVIDIA's NVLink pages:
  300/600/900/1800 GB/s both ways); PCIe Gen 3/4/5/6 x16 16/32/64/128 GB/s per direction.
* **Tier**: the nearest tier word: scale-up (NVLink, NVSwitch, xGMI, Infinity Fabric, HCCS, ICI,
  intra-node, scale-up, NVL72) or scale-out (InfiniBand/IB, RoCE, Ethernet, EFA, Slingshot, NIC,
  HCA, DCN, inter-node, node-node, between nodes, scale-out, network); PCIe counts as scale-up
  only where no other word names a tier. No tier word: a rate in bits is scale-out (networks
  are quoted in bits); in bytes, scale-out up to 100 GB/s per device, scale-up above.
* **Per node or per device**: ``per node/server/host/instance``, ``/node``, ``node-node``, or a
  count of NICs (``8x400G``: the node's links) -> the node's total, divided by its devices;
  ``per GPU/device/accelerator/card/chip/rank`` -> one device's. No word: scale-up figures are
  per device; scale-out figures above 800 Gb/s (no NIC port runs faster) and AWS EFA figures
  (AWS quotes them per instance) per node, others per device.
* **Direction**: ``bidirectional``/``bi-directional``/``both directions`` halve the figure;
  ``per direction``/``unidirectional``/``each way`` keep it. No word: scale-up figures are both
  directions (NVIDIA and AMD quote NVLink and Infinity Fabric so: H100 "900 GB/s" is 450 each
  way), scale-out figures are line rates, one direction.
* Storage, management and front-end networks are ignored. A segment with no figure is listed
  in ``unread``; a tier no figure gives keeps the catalog's value (the caller's default).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

SCALE_UP, SCALE_OUT = "scale-up", "scale-out"
NIC_PORT_MAX_GBITS = 800.0  # fastest NIC port shipping (ConnectX-8, 800G): a larger figure is a node's total
SCALE_OUT_MAX_GBYTES = 100.0  # per device: bytes above this with no tier word describe a scale-up fabric
IB_GBITS = {"edr": 100, "hdr100": 100, "hdr": 200, "ndr200": 200, "ndr": 400, "xdr": 800}
NVLINK_GBYTES = {2: 150, 3: 300, 4: 450, 5: 900}  # per GPU per direction
PCIE_X16_GBYTES = {3: 16, 4: 32, 5: 64, 6: 128}  # per direction

# a statement is a phrase (the published runs' longest is 26 characters); a longer text is not read, so
# a pasted log or a hostile cell costs nothing
MAX_TEXT = 2000
_PREFIX = {"t": 1000.0, "g": 1.0, "m": 0.001}
_FIGURE = re.compile(
    r"(?:(?<!\d)(?P<count>\d+)\s*[x×]\s*(?i:(?:ib|infiniband|hdr|ndr|edr|xdr|connectx-?\d*|cx-?\d|roce|ethernet|nics?)\s+){0,2})?"
    r"(?<!\d)(?P<num>\d+(?:\.\d+)?)\s*(?P<prefix>[TGMtgm])(?P<rest>i?B(?:ytes?)?/s|i?B(?:ytes?)?ps|BPS|b(?:its?)?/s|bits?\b"
    r"|bps|bE\b|b\b|(?![A-Za-z]))(?:\s*[x×]\s*(?P<count_after>\d+)\b)?")
_COUNT_WORDS = re.compile(r"\b(\d++)\s*(?:x\s*)?(?:\w+\s+)?(?:nics?|hcas?|ports?|links?|rails?|adapters?)\b", re.I)
_IB_GEN = re.compile(r"(?:(?<!\d)(?P<count>\d+)\s*[x×]\s*)?\b(?P<gen>edr|hdr100|hdr|ndr200|ndr|xdr)\b", re.I)
_NVLINK_GEN = re.compile(r"nvlink\s*(?:gen\s*)?(?P<a>[2-5])(?:\.0)?\b|(?P<b>[2-5])(?:st|nd|rd|th)[- "
                         r"]gen\w*\s+nvlink", re.I)
_PCIE_GEN = re.compile(r"pcie\s*(?:gen\s*)?(?P<gen>[3-6])(?:\.0)?\b", re.I)
_DPN = re.compile(r"(?<!\d)(\d+)\s*(?:x\s*)?(?:gpus?|devices?|accelerators?|cards?|chips?)\s*(?:per|/|each|in a)\s*"
                  r"(?:node|server|host)|(?<!\d)(\d+)-(?:gpu|device|accelerator)\s+(?:nodes?|servers?|hosts?)|"
                  r"nodes? of (\d+)", re.I)
_UP_WORDS = re.compile(r"nvlink|nvswitch|xgmi|infinity fabric|hccs|\bici\b|intra[- ]?node|\bintra\b|scale[- ]?up|"
                       r"within (?:a|the|each) node|\bnvl\d+", re.I)
_OUT_WORDS = re.compile(r"infiniband|\bib\b|\b(?:edr|hdr|ndr|xdr)\d*\b|roce|ethernet|gbe\b|\befa\b|slingshot|"
                        r"\bnics?\b|\bhcas?\b|\bdcn\b|connectx|"
                        r"inter[- ]?node|\binter\b|node[- ]?(?:to[- ])?node|between nodes|cross[- ]node|scale[- ]?out|"
                        r"network|omni-?path|spectrum-?x|\btcp\b", re.I)
_WEAK_UP_WORDS = re.compile(r"\bpcie", re.I)
_PER_NODE = re.compile(r"per (?:node|server|host|instance|machine|box)|/\s*(?:node|server|host)\b|"
                       r"node[- ]?(?:to[- ])?node|(?<!within )each node", re.I)
_PER_DEVICE = re.compile(r"per (?:gpu|device|accelerator|card|chip|rank|gcd|npu)|/\s*(?:gpu|device|card|chip)\b|"
                         r"each (?:gpu|device|card|chip)|one per (?:gpu|device)", re.I)
_BIDIR = re.compile(r"bi-?directional|\bbidir\b|both directions|in \+ out|total duplex", re.I)
_UNIDIR = re.compile(r"per direction|uni-?directional|each (?:way|direction)|one[- ]way", re.I)
_IGNORED = re.compile(r"storage|management|front[- ]?end|in-band|out-of-band|\bbmc\b", re.I)
_SPLIT = re.compile(r";|\||\+|,(?!\d{3}\b)|\s/\s|\band\b|\n", re.I)


@dataclass(frozen=True)
class InterconnectReading:
    intra_gbytes_per_s: float | None  # scale-up, per device per direction (None: not stated)
    inter_gbytes_per_s: float | None  # scale-out, per device per direction (None: not stated)
    devices_per_node: int | None  # when the text states it
    read: tuple[str, ...] = ()  # how each figure was read
    assumed: tuple[str, ...] = ()  # conventions applied where the text did not say
    unread: tuple[str, ...] = ()  # segments that give no figure


@dataclass(frozen=True)
class _Figure:
    pos: int
    gbits: float  # as written, in Gb/s (bytes x 8)
    unit: str  # bits | bytes | ambiguous
    count: int
    phrase: str
    generation: bool = False  # a named generation's rate: already per device and one direction


class _Words:
    """Where each word pattern matches in one segment, for nearest-word lookups in O(log n)."""

    def __init__(self, seg: str):
        self.seg = seg
        self._spans: dict[re.Pattern, tuple[list[int], list[int]]] = {}
        self.bidir, self.unidir = bool(_BIDIR.search(seg)), bool(_UNIDIR.search(seg))
        self.efa = bool(re.search(r"\befa\b", seg, re.I))

    def _of(self, p: re.Pattern) -> tuple[list[int], list[int]]:
        if p not in self._spans:
            ms = list(p.finditer(self.seg))
            self._spans[p] = ([m.start() for m in ms], [m.end() for m in ms])
        return self._spans[p]

    def nearest(self, pos: int, *patterns: re.Pattern) -> int | None:
        """Index of the pattern with a match nearest to ``pos`` (None when none matches)."""
        best = None
        for i, p in enumerate(patterns):
            starts, ends = self._of(p)
            k = bisect.bisect_left(starts, pos)
            for j in (k - 1, k):
                if 0 <= j < len(starts):
                    d = min(abs(starts[j] - pos), abs(ends[j] - pos))
                    if best is None or d < best[0]:
                        best = (d, i)
        return None if best is None else best[1]


def _unit(prefix: str, rest: str) -> str:
    if "bit" in rest or rest in ("bps", "bE", "b", ""):
        return "bits"
    if rest == "BPS" or (prefix.islower() and rest.startswith("b")):
        return "ambiguous"
    return "bytes" if rest.startswith(("B", "iB")) else "bits"


def _figures(seg: str) -> list[_Figure]:
    out = []
    for m in _FIGURE.finditer(seg):
        value = float(m.group("num")) * _PREFIX[m.group("prefix").lower()]
        unit = _unit(m.group("prefix"), m.group("rest"))
        count = int(m.group("count") or m.group("count_after") or 1)
        if value <= 0 or count < 1:  # "0G" is no rate
            continue
        out.append(_Figure(m.start(), value * (8 if unit == "bytes" else 1), unit, count, m.group(0).strip()))
    if not out:
        for m in _NVLINK_GEN.finditer(seg):
            gen = int(m.group("a") or m.group("b"))
            out.append(_Figure(m.start(), NVLINK_GBYTES[gen] * 8, "bytes", 1, f"NVLink {gen}", generation=True))
        for m in _IB_GEN.finditer(seg):
            out.append(_Figure(m.start(), IB_GBITS[m.group("gen").lower()], "bits", max(1, int(m.group("count") or 1)),
                               m.group(0).strip()))
        if not out:
            for m in _PCIE_GEN.finditer(seg):
                out.append(_Figure(m.start(), PCIE_X16_GBYTES[int(m.group("gen"))] * 8, "bytes", 1,
                                   f"PCIe Gen{m.group('gen')} x16", generation=True))
    if out and all(f.count == 1 for f in out):
        m = _COUNT_WORDS.search(seg)
        if m and 1 < int(m.group(1)) <= 1024:
            out = [_Figure(f.pos, f.gbits, f.unit, int(m.group(1)), f.phrase, f.generation) for f in out]
    return out


def _segments(text: str) -> list[str]:
    text = re.sub(r"(\d),(\d{3})\b", r"\1\2", text)  # 1,600 Gbps
    segs = [s.strip() for s in _SPLIT.split(text) if s and s.strip()]
    merged: list[str] = []
    for s in segs:  # "8x NDR 400G, one per GPU": a qualifier alone belongs to the figure before it
        if merged and not _figures(s) and (_PER_NODE.search(s) or _PER_DEVICE.search(s)) and len(s.split()) <= 4:
            merged[-1] = f"{merged[-1]} {s}"
        else:
            merged.append(s)
    return merged


def _quote(seg: str, limit: int = 80) -> str:
    return repr(seg if len(seg) <= limit else seg[:limit - 3] + "...")


def _tier_word(words: _Words, pos: int) -> str | None:
    """The tier the word nearest to ``pos`` names; PCIe only where no other tier word appears."""
    i = words.nearest(pos, _UP_WORDS, _OUT_WORDS)
    if i is not None:
        return (SCALE_UP, SCALE_OUT)[i]
    return SCALE_UP if words.nearest(pos, _WEAK_UP_WORDS) is not None else None


def _read_figure(words: _Words, f: _Figure, dpn: int) -> tuple[str, float, str, list[str]]:
    """(tier, GB/s per device per direction, how it was read, conventions applied)."""
    notes = []
    generation = f.generation
    scope = words.nearest(f.pos, _PER_NODE, _PER_DEVICE)  # 0: the node's total, 1: one device's
    if scope is None and f.count > 1:
        scope = 0
    tier = _tier_word(words, f.pos)
    if tier is None:
        if f.unit == "bytes":
            per_device = f.gbits / 8 * f.count / (dpn if scope == 0 else 1)
            tier = SCALE_OUT if per_device <= SCALE_OUT_MAX_GBYTES else SCALE_UP
            notes.append(f"no tier named: {per_device:g} GB/s per device read as {tier}")
        else:
            tier = SCALE_OUT
            notes.append("no tier named: a rate in bits read as scale-out")
    gbits = f.gbits
    if f.unit == "ambiguous":
        gbits = f.gbits if tier == SCALE_OUT else f.gbits * 8
        notes.append(f"unit case lost: read as {'bits' if tier == SCALE_OUT else 'bytes'} ({tier})")
    if scope is None:
        if tier == SCALE_UP or generation:
            scope = 1
        elif words.efa:
            scope = 0
            notes.append("an EFA figure is per instance (as AWS quotes it)")
        else:
            scope = 0 if gbits > NIC_PORT_MAX_GBITS else 1
            notes.append(f"no 'per node' or 'per GPU': {gbits:g} Gb/s read as "
                         f"{'a node total (above one NIC port)' if scope == 0 else 'one device NIC'}")
    per_device = gbits * f.count / (dpn if scope == 0 else 1)
    if words.bidir:
        per_device /= 2
    elif tier == SCALE_UP and not generation and not words.unidir:
        per_device /= 2
        notes.append("scale-up figure without a direction: read as both directions (vendor convention)")
    how = (f"{f.count} x " if f.count > 1 else "") + f"{gbits:g} Gb/s" + \
        (f" per node / {dpn} devices" if scope == 0 else " per device")
    return tier, per_device / 8, how, notes


def read_interconnect(text: str, devices_per_node: int) -> InterconnectReading:
    """Per-device bandwidths of the two tiers stated in ``text`` (rules: module docstring);
    ``devices_per_node`` converts a node's figure unless the text states its own."""
    if len(text or "") > MAX_TEXT:
        return InterconnectReading(None, None, None, unread=(f"{len(text):,} characters: longer than any interconnect "
                                                             f"statement (at most {MAX_TEXT:,}); not read",))
    if re.search(r"\d{13}", text or ""):  # 10^12 Gb/s, 10^12 NICs: no figure has 13 digits
        return InterconnectReading(None, None, None, unread=("a number of 13 or more digits: not a bandwidth "
                                                             "statement; not read",))
    m = _DPN.search(text or "")
    stated = next(g for g in m.groups() if g) if m else None
    stated_dpn = int(stated) if stated and len(stated) <= 7 else None  # beyond 10^7 devices a node: not a count
    dpn = stated_dpn or devices_per_node
    got: dict[str, list[float]] = {SCALE_UP: [], SCALE_OUT: []}
    named: dict[str, str] = {}
    read, assumed, unread = [], [], []
    for seg in _segments(text or ""):
        if _IGNORED.search(seg):
            read.append(f"{_quote(seg)}: not the compute fabric (ignored)")
            continue
        figs = _figures(seg)
        if not figs:
            tiers = [t for t, p in ((SCALE_UP, _UP_WORDS), (SCALE_OUT, _OUT_WORDS)) if p.search(seg)]
            for t in tiers:
                named.setdefault(t, seg)
            if not tiers and not _DPN.search(seg):
                unread.append(f"{_quote(seg)}: no bandwidth figure")
            continue
        words = _Words(seg)
        for f in figs:
            tier, gbytes, how, notes = _read_figure(words, f, dpn)
            read.append(f"{_quote(seg)}: {tier} {gbytes:g} GB/s per device per direction ({how})")
            assumed.extend(f"{_quote(seg)}: {n}" for n in notes)
            got[tier].append(gbytes)
    value = {}
    for tier, vals in got.items():
        value[tier] = vals[0] if vals else None
        others = sorted({round(v, 6) for v in vals[1:]} - {round(vals[0], 6)}) if vals else []
        if others:
            assumed.append(f"{tier}: several figures ({', '.join(f'{v:g}' for v in others)} GB/s besides "
                           f"{vals[0]:g}); the first is used")
    for tier, seg in named.items():
        if value[tier] is None:
            unread.append(f"{_quote(seg)}: names the {tier} fabric but gives no bandwidth")
    return InterconnectReading(intra_gbytes_per_s=value[SCALE_UP], inter_gbytes_per_s=value[SCALE_OUT],
                               devices_per_node=stated_dpn, read=tuple(read), assumed=tuple(assumed),
                               unread=tuple(unread))
