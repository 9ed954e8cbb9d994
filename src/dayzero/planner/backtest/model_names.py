"""Model names as published-run sources write them -> dayzero's architectures.

Sources spell one model many ways: ``Llama 3.1 8B``, ``LLAMA3.1_8B``, ``llama3-8b``,
``Llama-3-8B``, ``meta-llama/Meta-Llama-3.1-8B [FSDP2, compile]``. One rule reads any of them
into a :class:`NameKey`:

1. drop annotations in brackets, parentheses or braces and a repository owner (``org/``);
2. split camel case (``DeepSeekV3`` -> ``Deep Seek V3``), lowercase, cut into word and number
   tokens (``llama3.1_405b`` -> ``llama 3.1 405b``), drop words that name a release or a
   vendor rather than an architecture (:data:`STOPWORDS`);
3. the leading words are the **family** (joined: ``gpt oss`` -> ``gptoss``); a bare number
   right after them the **version** (a ``v`` before it is dropped); the first number with a
   size unit the **size** (``8b``, ``760m``, ``1t``, ``8x22b``); ``a`` + size the **active**
   size (``a22b``); any later word a **variant** (``scout``, ``nano``).

Two keys denote the same architecture (:func:`matches`) when the families are equal, the
versions agree (equal, or one refines the other: ``3`` and ``3.1``; a candidate without a
version accepts any), the sizes agree where both are known (a preset whose
name has no size is compared with its parameter count, within 15 %), the active sizes agree
where both are known, and the variant words agree: exactly for a model (``GLM-4.5-Air`` is
not ``GLM-4.5``), as a subset for a family or a layer-type entry (``Nemotron 3 Nano`` covers
``Nemotron-3-Nano-30B-A3B``). Candidates are
the model presets that name a public model and the ``models`` entries of
``data/published_models.json``; the best-ranked agreeing candidate wins (exact version, size
stated, more variant words), and two different answers at the best rank are no answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

# Words that name a release, a checkpoint flavour or a vendor, never a different architecture
STOPWORDS = frozenset({"meta", "instruct", "chat", "base", "hf", "it", "sft", "dpo", "rlhf", "model", "llm", "pretrain",
                       "pretraining", "pretrained", "proxy", "tokendrop", "dropless", "moe", "nvidia", "mistralai",
                       "google", "microsoft", "openai", "release", "preview", "the", "bf", "fp", "megatron", "mcore",
                       "nemo", "maxtext", "torchtitan", "titan", "deepspeed", "fsdp", "mock", "synthetic", "benchmark",
                       "seq"})
SIZE_UNITS = {"k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}
PRESET_SIZE_TOLERANCE = 0.15  # nominal sizes round: Llama 2 "7B" is 6.74e9, gpt-oss "120B" 116.8e9

_TOKEN = re.compile(r"\d+(?:\.\d+)?(?:x\d+(?:\.\d+)?)?[a-z]*|[a-z]+")
_SIZE = re.compile(r"(?:(?<!\d)(\d+)x)?(?<!\d)(\d+(?:\.\d+)?)([kmbt])")


@dataclass(frozen=True)
class NameKey:
    family: str
    version: str | None = None
    size: str | None = None  # "8b", "760m", "8x22b"
    active: str | None = None  # "22b" of "A22B"
    words: frozenset[str] = frozenset()

    def describe(self) -> str:
        parts = [self.family, self.version, self.size, f"a{self.active}" if self.active else None, *sorted(self.words)]
        return " ".join(p for p in parts if p)


def strip_annotations(name: str) -> str:
    """``Llama 3.1 8B [FSDP2, compile] (NeMo)`` -> ``Llama 3.1 8B``; ``org/Model`` -> ``Model``."""
    s = re.sub(r"\[[^\[\]]*\]|\([^()]*\)|\{[^{}]*\}", " ", name)
    s = s.strip().rsplit("/", 1)[-1] if re.fullmatch(r"[\w.\-]+/[\w.\-]+", s.strip()) else s
    return " ".join(s.split())


def annotations(name: str) -> list[str]:
    """The bracketed and parenthesised parts of a name (``[FSDP2, compile]`` -> ``FSDP2, compile``)."""
    found = re.finditer(r"\[([^\[\]]*)\]|\(([^()]*)\)|\{([^{}]*)\}", name)
    return [m.group(1) or m.group(2) or m.group(3) for m in found]


def size_value(size: str | None) -> float | None:
    """``8b`` -> 8e9, ``8x22b`` -> 1.76e11 (the product), None when not a size."""
    m = _SIZE.fullmatch(size or "")
    if not m:
        return None
    return float(m.group(1) or 1) * float(m.group(2)) * SIZE_UNITS[m.group(3)]


def parse_name(name: str) -> NameKey:
    """The :class:`NameKey` of a model name (module docstring, steps 1-3)."""
    s = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", strip_annotations(name)).lower()
    tokens = [t for t in _TOKEN.findall(s) if t not in STOPWORDS]
    family, i = [], 0
    while i < len(tokens) and tokens[i].isalpha():
        if tokens[i] == "v" and i + 1 < len(tokens) and tokens[i + 1][0].isdigit() and family:
            break
        family.append(tokens[i])
        i += 1
    version = size = active = None
    words: set[str] = set()
    for j in range(i, len(tokens)):
        t = tokens[j]
        prev = tokens[j - 1] if j > i else ""
        if _SIZE.fullmatch(t):
            if prev == "a" and size is not None:
                active = t
            elif size is None:
                size = t
        elif re.fullmatch(r"\d+(?:\.\d+)*", t):
            if version is None and size is None and (j == i or prev == "v"):
                version = t
        elif t.isalpha() and t not in ("v", "a", "x"):
            words.add(t)
    return NameKey(family="".join(family), version=version, size=size, active=active, words=frozenset(words))


def sizes_agree(row: str, cand: str) -> bool:
    if row == cand:
        return True
    if ("x" in row) != ("x" in cand):
        return False
    a, b = size_value(row), size_value(cand)
    return a is not None and b is not None and abs(a - b) <= 0.01 * b


def version_rank(row: str | None, cand: str | None) -> int | None:
    """2: equal (or the candidate names none), 1: one refines the other (3 and 3.1) or the row
    names none, None: they disagree (2 and 3.1)."""
    if cand is None or row == cand:
        return 2
    if row is None:
        return 1
    return 1 if cand.startswith(row + ".") or row.startswith(cand + ".") else None


@dataclass(frozen=True)
class Candidate:
    key: NameKey
    kind: str  # preset | config | unsupported | family | layout
    target: str  # preset name, or the entry's name
    entry: dict
    params: float | None = None  # a preset's parameter count, when its name gives no size


def matches(row: NameKey, cand: Candidate) -> tuple | None:
    """Rank of ``cand`` for ``row`` (higher is better), or None when they disagree."""
    c = cand.key
    exact_words = cand.kind in ("preset", "config")
    if row.family != c.family or not (c.words == row.words if exact_words else c.words <= row.words):
        return None
    v = version_rank(row.version, c.version)
    if v is None:
        return None
    if row.active and c.active and row.active != c.active:
        return None
    size_known = 0
    if row.size and c.size:
        if not sizes_agree(row.size, c.size):
            return None
        size_known = 1
    elif row.size and cand.params is not None:
        value = size_value(row.size)
        if "x" in row.size or value is None or abs(value - cand.params) > PRESET_SIZE_TOLERANCE * cand.params:
            return None
        size_known = 1
    elif row.size and cand.kind in ("preset", "config"):
        return None  # the candidate is one model of unknown size; a sized row is another
    return (v, size_known, len(c.words))


@dataclass(frozen=True)
class NameMatch:
    candidate: Candidate
    note: str  # "" when the name agrees in full; else how it was read


def best_match(name: str, candidates: list[Candidate], size_hint: str | None = None) -> NameMatch | None:
    """The best-ranked agreeing candidate (module docstring); None when none or ambiguous."""
    key = parse_name(name)
    if key.size is None and size_hint:
        hint = parse_name(f"x {size_hint}").size  # a total_params column such as "7B"
        if hint:
            key = NameKey(key.family, key.version, hint, key.active, key.words)
    if not key.family:
        return None
    ranked = [(r, c) for c in candidates if (r := matches(key, c)) is not None]
    if not ranked:
        return None
    top = max(r for r, _ in ranked)
    best = {c.target: c for r, c in ranked if r == top}
    if len(best) > 1:
        return None
    cand = next(iter(best.values()))
    notes = []
    if key.version and cand.key.version and key.version != cand.key.version:
        notes.append(f"version {key.version} read as {cand.key.version}")
    if not key.size and cand.key.size:
        notes.append(f"no size in the name; {cand.target} is the only match")
    return NameMatch(cand, "; ".join(notes))


@lru_cache(maxsize=1)
def preset_candidates() -> tuple[Candidate, ...]:
    """Model presets that name a public model (test and design presets cite 'dayzero')."""
    from dayzero.specs.counting import params_total
    from dayzero.specs.registry import load_model, model_presets

    out = []
    for name, cfg in model_presets().items():
        source = str(cfg.get("_dayzero", {}).get("source", ""))
        if not source or source.startswith("dayzero"):
            continue
        key = parse_name(name)
        params = None if key.size else float(params_total(load_model(name)))
        out.append(Candidate(key, "preset", name, {"source": source}, params))
    return tuple(out)
