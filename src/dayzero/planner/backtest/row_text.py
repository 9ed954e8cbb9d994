"""Counts a published row states in its free text rather than its columns: the device count
("on 1,024 GPUs", "64 nodes x 8", "128 x 8 H100"), the batch in tokens ("tokens/batch = 16M",
"4M tokens per batch", "global batch of 2M tokens"), an MFU ("MFU over 52 %", "69.0 % MFU") and
packed documents ("reset attention mask", "document masking", "mean document length 2K").

Every pattern is linear in the text's length: no nested repeats, and every repeat bounded, so each
start position costs a constant.
"""

from __future__ import annotations

import re

_SUFFIX = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9}
_BIN_SUFFIX = {"": 1, "k": 2**10, "m": 2**20, "b": 2**30}
_NUM = r"(?<![\d.,])(\d[\d,]{0,15}(?:\.\d{1,6})?)"  # bounded: each start position costs O(1)
_S = r"\s{0,3}"  # optional blanks
_SP = r"\s{1,3}"  # required blanks
_WORD = rf"(?:[A-Za-z][\w-]{{0,20}}{_SP})?"  # one optional word before the noun ("H100 GPUs")
_DEVICE_WORDS = r"(?:gpus?|npus?|tpus?|accelerators?|devices?|chips?|cards?|dies|gcds?|xpus?|hpus?)"
_HOSTS = r"(?:nodes?|servers?|hosts?|machines?)"
_UNIT = r"([kmb]?)"
_BATCH = rf"(?:global{_SP})?(?:batch|step|iteration)"
_DEVICES = re.compile(rf"{_NUM}(?:{_S}[x×])?{_SP}(?!gb\b|tb\b|gib\b){_WORD}{_DEVICE_WORDS}\b", re.I)
_NODES = re.compile(rf"{_NUM}{_S}{_HOSTS}{_S}(?:x|\*|×|of|with){_S}{_NUM}\b", re.I)
_PRODUCT = re.compile(rf"{_NUM}{_S}[x×*]{_S}{_NUM}{_SP}{_WORD}{_DEVICE_WORDS}\b", re.I)
_NODES_EACH = re.compile(rf"{_NUM}{_S}{_HOSTS}\b[^.;]{{0,40}}?\b{_NUM}{_S}{_WORD}{_DEVICE_WORDS}{_S}"
                         rf"(?:each|per{_SP}(?:node|server|host))", re.I)
_TOKENS_PER_BATCH = re.compile(
    rf"(?:tokens?{_S}(?:/|per){_S}{_BATCH}{_S}(?:=|:|of|is)?{_S}~?{_NUM}{_S}{_UNIT}\b)|"
    rf"(?:~?{_NUM}{_S}{_UNIT}{_S}tokens?{_S}(?:/|per){_S}{_BATCH}\b)|"
    rf"(?:(?:global{_SP})?batch(?:{_SP}size)?{_S}(?:of|=|:){_S}~?{_NUM}{_S}{_UNIT}{_S}tokens\b)", re.I)
_MFU = re.compile(rf"(?:\bmfu\b[^0-9.;]{{0,24}}?{_NUM}{_S}%)|"
                  rf"(?:{_NUM}{_S}%{_S}(?:model{_SP}flops?{_SP}utili[sz]ation|mfu)\b)", re.I)

_PACKED = re.compile(r"reset[-_ ]attention[-_ ]mask|document[-_ ]mask|packed|per[- ]document|"
                     r"eod[-_ ]mask|intra[- ]document", re.I)
_DOC_LEN = re.compile(rf"(?:doc(?:ument)?s?[-_ ]{{0,2}}(?:length|len){_S}(?:=|:|of|~|is)?{_S}~?{_NUM}{_S}([k]?)\b)|"
                      rf"(?:documents?{_SP}of{_S}~?{_NUM}{_S}([k]?){_S}tokens\b)", re.I)


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def devices_in(text: str) -> tuple[int, str] | None:
    """The device count the text states and the phrase it was read from; None when none.
    Nodes x devices per node wins over a bare count (it is the more specific statement)."""
    for pattern in (_NODES, _NODES_EACH, _PRODUCT):
        if m := pattern.search(text):
            nodes, per = _number(m.group(1)), _number(m.group(2))
            if nodes.is_integer() and per.is_integer() and nodes > 0 and per > 0:
                return int(nodes * per), m.group(0).strip()
    best = None
    for m in _DEVICES.finditer(text):
        n = _number(m.group(1))
        if n.is_integer() and n >= 1 and (best is None or n > best[0]):
            best = (int(n), m.group(0).strip())
    return best


def tokens_per_batch_in(text: str) -> tuple[int, str] | None:
    """The global batch in tokens the text states ('16M' read as 16 x 2^20: sources that write
    tokens per batch in M count powers of two, as Llama's 4M = 4,194,304), with its phrase."""
    m = _TOKENS_PER_BATCH.search(text)
    if not m:
        return None
    groups = [g for g in m.groups()]
    for i in range(0, len(groups), 2):
        if groups[i] is not None:
            value, unit = _number(groups[i]), (groups[i + 1] or "").lower()
            tokens = value * _BIN_SUFFIX[unit]
            return (int(tokens), m.group(0).strip()) if tokens >= 1 else None
    return None


def mfu_in(text: str) -> tuple[float, str] | None:
    """An MFU the text states, as a fraction, with its phrase ('MFU over 52 %' -> 0.52)."""
    m = _MFU.search(text)
    if not m:
        return None
    value = _number(m.group(1) or m.group(2))
    return (value / 100, m.group(0).strip()) if 0 < value <= 100 else None


def documents_in(text: str) -> tuple[int | None, str] | None:
    """Packed sequences with per-document masks the text states: (mean document length in tokens,
    or None when it gives none; the phrase); None when the text does not say documents are masked."""
    packed = _PACKED.search(text)
    length = _DOC_LEN.search(text)
    if not packed and not length:
        return None
    if length:
        value = _number(length.group(1) or length.group(3))
        unit = (length.group(2) if length.group(1) else length.group(4)) or ""
        tokens = int(value * _BIN_SUFFIX[unit.lower()])
        return (tokens if tokens >= 1 else None), length.group(0).strip()
    return None, packed.group(0).strip()
