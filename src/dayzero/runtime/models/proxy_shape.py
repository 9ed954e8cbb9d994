"""The proxy of a model derived from its own modeling code: the full model's structure at a smaller size.

The runtime's proxy flags (``--layers``, ``--hidden``, ``--experts``, ``--vocab``) shrink the config
dict; what stays consistent is read from the config class and the built modules, never from a
table per family:

- **Fields the config class computes** from the hidden size (a Mamba head dimension ``expand x
  hidden / heads``, an attention width ``2 x hidden``): found by building the config class with the
  field left out and the hidden size doubled; a field whose value follows is left out of the proxy's
  dict, so the class recomputes it for the proxy's hidden size.
- **Widths** (``*intermediate_size``, ``*lora_rank``, ``*heads`` counts) scale by H / hidden; a field
  whose value is the product of a scaled head count and another field (an SSM's ``d_ssm = heads x
  head_dim``) is recomputed from that product; a field that is a whole multiple of the hidden size
  and the size of some parameter of the full model scales with it; per-head sizes (``head_dim``,
  SSM state, convolution kernels) are kept.
- **Key names** are the config class's standard ones (its ``attribute_map`` read first: GPT-2's
  ``n_embd`` is shrunk as ``hidden_size``).
- **Layer kinds** (the decoder layers grouped by structure, :mod:`dayzero.derive.structure`):
  ``--layers N`` keeps the first N layers when they hold every kind; else every per-layer list
  (``layer_types``, a hybrid pattern string) keeps the first layer of each kind plus the earliest
  others up to N; else (kinds set by a period such as every-k-th attention, or first-k dense layers)
  the fewest leading layers that hold every kind.
- **The check**: each candidate is built by the config class and on the meta device, and, when small,
  runs one CPU forward of two short sequences; a candidate the modeling code rejects gives way to the
  next smaller consistent shape (the hidden size halved), and only then is the proxy refused with the
  modeling code's own reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dayzero.errors import DayzeroError, one_line

_EXPERTS = re.compile(r"^(num|n)_(local_|routed_)?experts$")
_TOP_K = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k")
_NOT_SIZES = ("vocab_size", "num_hidden_layers")
FORWARD_PROBE_MAX = 300_000_000  # parameters: above this the pre-launch check builds on meta only


@dataclass(frozen=True)
class Proxy:
    """A proxy config that the modeling code accepts, and what the shrink did beyond the flags."""

    cfg: dict
    notes: tuple[str, ...]


def _ints(cfg: dict) -> dict[str, int]:
    return {k: v for k, v in cfg.items() if isinstance(v, int) and not isinstance(v, bool)}


def _scaled(v: int, r: float) -> int:
    return max(1, round(v * r))


def _width(v: int, r: float) -> int:
    """A scaled width, a multiple of 8 from 8 up (grouped GEMM kernels need 16-byte strides)."""
    w = v * r
    return max(1, round(w)) if w < 8 else 8 * max(1, round(w / 8))


def computed_fields(cfg: dict, make) -> set[str]:
    """Int fields the config class recomputes from the hidden size (left out: the same value; left
    out with the hidden size doubled: another)."""
    old = cfg.get("hidden_size")
    if not isinstance(old, int):
        return set()
    out = set()
    for k, v in _ints(cfg).items():
        if k in ("hidden_size", *_NOT_SIZES) or k.endswith("heads"):
            continue
        trial = {x: y for x, y in cfg.items() if x != k}
        try:
            same = getattr(make(trial), k, None)
            got = getattr(make(dict(trial, hidden_size=2 * old)), k, None)
        except Exception:  # noqa: BLE001 - a config class may reject the doubled size; then not computed
            continue
        if same == v and isinstance(got, int) and got != v:
            out.add(k)
    return out


def shrink_hidden(cfg: dict, hidden: int, computed: set[str] = frozenset(), param_dims: set[int] = frozenset(),
                  head_dim_key: bool = True) -> dict:
    """``cfg`` at hidden size ``hidden`` with every width scaled and every product kept (see module).
    Where the full model's heads tile its width (no ``head_dim``, or one equal to hidden / heads) and
    the scaled heads do not tile the new width, a config without ``head_dim`` gets the full model's
    head size as ``head_dim`` (``head_dim_key``); or (``head_dim_key`` False: for a class that computes
    its head size as hidden // heads in one place and reads ``head_dim`` in another) the head count
    nearest the scaled one that divides the width, its head size hidden / heads."""
    old = cfg["hidden_size"]
    r = hidden / old
    out = {k: v for k, v in cfg.items() if k not in computed}
    ints = {k: v for k, v in _ints(cfg).items() if k not in computed and k not in _NOT_SIZES}
    heads = cfg.get("num_attention_heads")
    head_dim = cfg.get("head_dim") or (old // heads if isinstance(heads, int) and heads else None)
    out["hidden_size"] = hidden
    scaled: dict[str, int] = {}
    for k, v in ints.items():
        if k.endswith("heads"):
            scaled[k] = _scaled(v, r)
        elif "intermediate_size" in k or k.endswith("lora_rank"):
            scaled[k] = _width(v, r)
    counts = {k for k in scaled if k.endswith("heads")}
    for k, v in ints.items():
        if k in scaled or k == "hidden_size" or v < 2:
            continue
        for c in counts:  # a width (>= hidden / 8) = a scaled head count x a kept per-head size (>= 8)
            if v >= old // 8 and ints[c] > 1 and v % ints[c] == 0 and v // ints[c] >= 8 and any(
                    ints[b] == v // ints[c] for b in ints if b not in scaled and b != k):
                scaled[k] = scaled[c] * (v // ints[c])
                break
        else:
            if v >= old and v % old == 0 and v in param_dims and v // old <= 16:
                scaled[k] = hidden * (v // old)
    out.update(scaled)
    h, kv = out.get("num_attention_heads"), out.get("num_key_value_heads")
    if isinstance(h, int) and isinstance(kv, int):
        out["num_key_value_heads"] = max(d for d in range(1, min(kv, h) + 1) if h % d == 0)
    # heads x head size = hidden in the full model (head_dim computed, or set to exactly that)
    tiles = isinstance(h, int) and head_dim and ("head_dim" not in cfg or heads * head_dim == old)
    if tiles and hidden != h * head_dim:
        if head_dim_key and "head_dim" not in cfg:
            out["head_dim"] = head_dim
        elif not head_dim_key:
            out["num_attention_heads"] = h = min((d for d in range(1, hidden + 1) if hidden % d == 0),
                                                 key=lambda d: (abs(d - h), abs(hidden // d - head_dim)))
            if "head_dim" in cfg:
                out["head_dim"] = hidden // h
            full_kv = cfg.get("num_key_value_heads")
            if isinstance(full_kv, int) and full_kv > 0:  # the query heads per key/value head kept where they fit
                want = max(1, round(h * full_kv / heads))
                out["num_key_value_heads"] = max(d for d in range(1, min(want, h) + 1) if h % d == 0)
    return out


def shrink_experts(cfg: dict, experts: int) -> dict:
    out = dict(cfg)
    for k, v in cfg.items():
        if _EXPERTS.match(k) and isinstance(v, int) and experts < v:
            out[k] = experts
            for t in _TOP_K:
                if isinstance(cfg.get(t), int):
                    out[t] = min(cfg[t], experts)
            g = cfg.get("n_group")
            if isinstance(g, int) and g > 1 and experts % g:
                out["n_group"], out["topk_group"] = 1, 1
    return out


def shrink_vocab(cfg: dict, vocab: int) -> dict:
    """``cfg`` with ``vocab`` tokens; a special token id (``*token_id``, an int or a list of them) past
    the new vocabulary moves to the top of it, distinct ids to distinct slots (the j-th to vocab - 1 - j),
    so a config class that requires the id (an int, not None) and ids that must differ still hold.
    Other vocabularies larger than ``vocab`` (embedding tables indexed by a hash of n-grams or by the
    token id per layer: ``*vocab*`` fields, e.g. BLT's 500,002 hash rows per group) shrink to it: the
    tables keep their role, a hash is taken modulo any size."""
    out = dict(cfg, vocab_size=vocab)
    for k, v in _ints(cfg).items():
        if "vocab" in k and k != "vocab_size" and v > vocab:
            out[k] = vocab
    moved: dict[int, int] = {}

    def fit(t):
        if not isinstance(t, int) or isinstance(t, bool) or t < vocab:
            return t
        return moved.setdefault(t, vocab - 1 - len(moved))

    for k, v in cfg.items():
        if k.endswith("token_id"):
            out[k] = [fit(t) for t in v] if isinstance(v, list) else fit(v)
    return out


def recomputed_lists(cfg: dict, make) -> set[str]:
    """List fields the config class reproduces when left out (a layout computed from another field,
    e.g. the indices of a hybrid's attention layers): left out of a proxy that keeps other layers."""
    out = set()
    for k, v in cfg.items():
        if isinstance(v, list) and len(v) != cfg.get("num_hidden_layers"):
            try:
                if getattr(make({x: y for x, y in cfg.items() if x != k}), k, None) == v:
                    out.add(k)
            except Exception:  # noqa: BLE001 - the class needs the field: kept
                continue
    return out


def truncate_layers(cfg: dict, n: int, keep: list[int], drop: set[str] = frozenset(), counts: str = "scale") -> dict:
    """``cfg`` with ``keep`` (layer indices) of its ``n`` layers: every per-layer list, every pattern
    string of length n (at most 4 symbols, one repeated, e.g. ``M-M*``) and every mapping keyed by layer
    index, subset to them (a mapping re-keyed to the kept layers' new indices), the other counts of
    layers as :func:`layer_counts` reads them (``counts``), the fields in ``drop`` left to the config
    class."""
    cfg = {k: v for k, v in cfg.items() if k not in drop}
    out = dict(cfg, num_hidden_layers=len(keep), **layer_counts(cfg, n, keep, counts))
    for k, v in cfg.items():
        if isinstance(v, list) and len(v) == n:
            out[k] = [v[i] for i in keep]
        elif isinstance(v, str) and len(v) == n and n > 2 and len(set(v)) <= min(4, n - 1):
            # a pattern, one symbol a layer, some repeated (a 4-layer model's "gelu" is a word, not a pattern)
            out[k] = "".join(v[i] for i in keep)
        elif _layer_keyed(v, n):  # per-layer overrides keyed by layer index (transformers' per_layer_config)
            at = {int(i): x for i, x in v.items()}
            out[k] = {(str(j) if isinstance(next(iter(v)), str) else j): at[i] for j, i in enumerate(keep) if i in at}
    return out


COUNT_READINGS = ("scale", "tail", "head")


def layer_counts(cfg: dict, n: int, keep: list[int], reading: str = "scale") -> dict[str, int]:
    """The config's other counts of layers (``*layers*`` fields, 1..n) for a proxy keeping the layers
    ``keep`` of its ``n``: one equal to n becomes their number m; counts that sum to n (a stack's input,
    recurrent and output sections) split m in their proportions, each kept >= 1 where m allows; another
    count k is read as ``reading`` says: ``scale`` k x m / n, at least 1 (k MTP layers); ``tail`` the kept
    layers among the last k (Gemma 3n's last 15 layers sharing their key/value cache); ``head`` those
    among the first k. The fit tries them in that order (:data:`COUNT_READINGS`)."""
    m = len(keep)
    counts = {k: v for k, v in _ints(cfg).items() if "layers" in k and k != "num_hidden_layers" and 0 < v <= n}
    out = {k: m for k, v in counts.items() if v == n}
    rest = {k: v for k, v in counts.items() if v < n}
    parts = next((c for c in _sums_to(rest, n)), None)
    if parts:
        share = {k: max(1 if m >= len(parts) else 0, int(rest[k] * m / n)) for k in parts}
        for k in sorted(parts, key=lambda k: -(rest[k] * m / n - int(rest[k] * m / n)))[:m - sum(share.values())]:
            share[k] += 1
        while sum(share.values()) > m:  # the minimum of one each overshot: take from the largest
            share[max(share, key=share.get)] -= 1
        out.update(share)
    for k, v in rest.items():
        if k not in out:
            out[k] = (max(1, round(v * m / n)) if reading == "scale" else
                      sum(i >= n - v for i in keep) if reading == "tail" else sum(i < v for i in keep))
    return out


def count_readings(cfg: dict, n: int, keep: list[int] | None) -> tuple[str, ...]:
    """The readings of the config's other layer counts worth trying for ``keep`` (one where they agree)."""
    if keep is None:
        return ("scale",)
    seen, out = [], []
    for r in COUNT_READINGS:
        c = layer_counts(cfg, n, keep, r)
        if c not in seen:
            seen.append(c)
            out.append(r)
    return tuple(out)


def _sums_to(counts: dict[str, int], n: int):
    """Sets of two to four of ``counts``' keys whose values sum to ``n``, largest sets first."""
    from itertools import combinations

    keys = sorted(counts)
    for r in range(min(4, len(keys)), 1, -1):
        for c in combinations(keys, r):
            if sum(counts[k] for k in c) == n:
                yield c


def _layer_keyed(v, n: int) -> bool:
    """A non-empty mapping whose keys are all layer indices in [0, n) (ints, or their decimal text)."""
    return (isinstance(v, dict) and bool(v)
            and all((isinstance(i, int) and not isinstance(i, bool)) or (isinstance(i, str) and i.isdigit())
                    for i in v) and all(0 <= int(i) < n for i in v))


def shrink_towers(cfg: dict, lm: dict, hidden: int | None, layers: int | None,
                  vocab: int | None) -> tuple[dict, str, dict[str, list[str]]]:
    """(``cfg`` with its other towers shrunk, a note, the towers' fields tied to the language model's
    width): the sub-configs beside the language model ``lm`` that carry their own ``hidden_size`` (a
    vision or audio encoder, BLT's byte encoder, global model and patcher) scale by the language
    model's ratio (``hidden`` / its hidden size; with no hidden size of its own, the widest tower's),
    so a width tied across towers (an encoder's ``hidden_size_global`` = the global model's, an
    adapter's input = its tower's width) stays tied: a field holding a tower's width takes that
    tower's new width. A field holding the language model's width (an adapter's output) follows the
    proxy language model's width wherever the fit puts it (:func:`tie_towers`). Each tower keeps its
    first ``layers`` layers and a vocabulary of at most ``vocab``."""
    towers = {k: v for k, v in cfg.items() if isinstance(v, dict) and v is not lm
              and isinstance(v.get("hidden_size"), int) and not isinstance(v["hidden_size"], bool)}
    if hidden is None or not towers:
        return cfg, "", {}
    own = lm.get("hidden_size")
    own = own if isinstance(own, int) and not isinstance(own, bool) and own > 0 else None
    r = hidden / (own or max(t["hidden_size"] for t in towers.values()))
    widths = {t["hidden_size"] for t in towers.values()}
    out, ties = dict(cfg), {}
    for k, t in towers.items():
        small = shrink_hidden(t, _width(t["hidden_size"], r), head_dim_key=False) if t["hidden_size"] > 0 else dict(t)
        small.update({f: _width(v, r) for f, v in _ints(t).items() if v in widths and v != own})
        ties[k] = [f for f, v in _ints(t).items() if f != "hidden_size" and own and v == own]
        n = small.get("num_hidden_layers")
        if layers is not None and isinstance(n, int) and layers < n:
            small = truncate_layers(small, n, list(range(layers)))
        if vocab is not None and isinstance(small.get("vocab_size"), int) and small["vocab_size"] > vocab:
            small = shrink_vocab(small, vocab)
        out[k] = small
    note = (f"{', '.join(sorted(towers))} shrunk by the language model's ratio {r:.3g} (widths tied across towers "
            "kept tied)" + (f", first {layers} layers each" if layers is not None else ""))
    return out, note, {k: fs for k, fs in ties.items() if fs}


def tie_towers(whole: dict, ties: dict[str, list[str]], hidden) -> dict:
    """``whole`` (a config dict with its towers) with each tower's fields in ``ties`` set to the
    language model's ``hidden`` size."""
    if not ties or not isinstance(hidden, int):
        return whole
    return {**whole, **{k: {**whole[k], **{f: hidden for f in fs}} for k, fs in ties.items() if k in whole}}


def shrink_config(cfg: dict, layers: int | None = None, hidden: int | None = None, experts: int | None = None,
                  vocab: int | None = None) -> dict:
    """The proxy's config dict by the flags alone (first ``layers`` layers; no config class consulted)."""
    out = dict(cfg)
    n = cfg.get("num_hidden_layers")
    if layers is not None and isinstance(n, int) and layers < n:
        out = truncate_layers(out, n, list(range(layers)))
    if hidden is not None and isinstance(cfg.get("hidden_size"), int) and hidden != cfg["hidden_size"]:
        out = shrink_hidden(out, hidden)
    if experts is not None:
        out = shrink_experts(out, experts)
    if vocab is not None:
        out = shrink_vocab(out, vocab)
    return out


def layer_kinds(layers) -> list[list[int]]:
    """Indices of the layers of each kind (:func:`dayzero.derive.structure.layer_signature`), a scalar
    that differs on every layer (a layer number or seed, n > 2 layers) not making a kind."""
    from dayzero.derive import structure as st

    sigs = [st.layer_signature(layer) for layer in layers]
    scal = [{(q, k): v for q, _, attrs, _, _ in sig for k, v in attrs} for sig in sigs]
    keys = set().union(*scal) if scal else set()
    per_layer = {k for k in keys if len(sigs) > 2 and len({repr(d.get(k)) for d in scal}) == len(sigs)}
    groups: dict[tuple, list[int]] = {}
    for i, sig in enumerate(sigs):
        key = tuple((q, c, tuple(a for a in attrs if (q, a[0]) not in per_layer), p, b) for q, c, attrs, p, b in sig)
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def layer_candidates(cfg: dict, layers: int, kinds: list[list[int]]) -> list[tuple[list[int], str]]:
    """(layer indices, how) to try for ``--layers``: the first N; one of each kind from the per-layer
    lists; then the fewest leading layers holding every kind."""
    n = cfg["num_hidden_layers"]
    first = [g[0] for g in kinds]
    out = [(list(range(layers)), "")]
    if max(first) >= layers:
        others = [i for i in range(n) if i not in first][:max(0, layers - len(first))]
        keep = sorted(set(first) | set(others))
        note = (f"--layers {layers} keeps one layer of each of its {len(kinds)} layer kinds: "
                f"{len(keep)} layers (of {n}: {', '.join(map(str, keep))})")
        out.append((keep, note))
        lead = max(first) + 1
        out.append((list(range(lead)), f"--layers {layers} keeps one layer of each of its {len(kinds)} layer kinds: "
                    f"the first {lead} layers (of {n}; the kinds are set by position)"))
    return out


def standard_names(cfg: dict, make) -> dict:
    """``cfg`` with the keys the config class aliases (its ``attribute_map``: GPT-2's ``n_embd`` is
    ``hidden_size``) under their standard names, so the flags find them."""
    amap = getattr(type(make(cfg)), "attribute_map", None) or {}
    moved = {std: cfg[key] for std, key in amap.items() if key in cfg and std not in cfg}
    return {**{k: v for k, v in cfg.items() if k not in {amap[s] for s in moved}}, **moved}


def layer_count_key(cfg: dict, make, name: str) -> str:
    """The config's field counting the decoder layers: ``num_hidden_layers``, or, where a class names
    it otherwise without an alias (LongCat-Flash's ``num_layers``), the one ``*layer*`` field equal to
    the layer count of the built model (found by structure)."""
    from dayzero.derive import structure as st

    if isinstance(cfg.get("num_hidden_layers"), int):
        return "num_hidden_layers"
    count = len(st.find_layer_list(build(make(cfg), name))[1])
    same = [k for k, v in _ints(cfg).items() if "layer" in k and v == count]
    return same[0] if len(same) == 1 else "num_hidden_layers"


def fit(cfg: dict, make, layers: int | None, hidden: int | None, experts: int | None, vocab: int | None,
        name: str) -> Proxy:
    """The proxy config (see module): the flags applied, the structure kept, checked by the modeling
    code; raises DayzeroError naming what the modeling code rejected when no candidate builds."""
    cfg = standard_names(cfg, make)
    key = layer_count_key(cfg, make, name) if layers is not None else "num_hidden_layers"
    if key == "num_hidden_layers":
        return _fit(cfg, make, layers, hidden, experts, vocab, name)

    def theirs(d: dict) -> dict:  # the class's own name for the layer count
        return {(key if k == "num_hidden_layers" else k): v for k, v in d.items()}

    proxy = _fit({("num_hidden_layers" if k == key else k): v for k, v in cfg.items()},
                 lambda d: make(theirs(d)), layers, hidden, experts, vocab, name)
    return Proxy(theirs(proxy.cfg), proxy.notes)


def _fit(cfg: dict, make, layers: int | None, hidden: int | None, experts: int | None, vocab: int | None,
         name: str) -> Proxy:
    from dayzero.derive import structure as st

    n = cfg.get("num_hidden_layers")
    full = None
    if (layers is not None and isinstance(n, int) and layers < n) or hidden is not None:
        full = build(make(cfg), name)
    layer_opts: list[tuple[list[int] | None, str]] = [(None, "")]
    lists: set[str] = set()
    kinds: list[list[int]] = []
    if full is not None and layers is not None and isinstance(n, int) and layers < n:
        kinds = layer_kinds(st.find_layer_list(full)[1])
        layer_opts = layer_candidates(cfg, layers, kinds)
        lists = recomputed_lists(cfg, make)
    computed: set[str] = set()
    dims: set[int] = set()
    old = cfg.get("hidden_size")
    hiddens: list[int | None] = [None]
    if hidden is not None and isinstance(old, int) and hidden != old:
        computed = computed_fields(cfg, make)
        dims = {d for p in full.parameters() for d in p.shape}
        hiddens = [hidden] + [h for h in (hidden // 2, hidden // 4) if h >= 16]
    last = ""
    for keep, note, reading in [(k, t, r) for k, t in layer_opts for r in count_readings(cfg, n, k)]:
        base = truncate_layers(cfg, n, keep, lists if note else set(), reading) if keep is not None else dict(cfg)
        for h, head_key in [(h, k) for h in hiddens for k in ((True, False) if h is not None else (True,))]:
            small = shrink_hidden(base, h, computed, dims, head_key) if h is not None else dict(base)
            if not head_key and small == shrink_hidden(base, h, computed, dims):
                continue  # the heads already tile the width: the same candidate
            if experts is not None:
                small = shrink_experts(small, experts)
            if vocab is not None:
                small = shrink_vocab(small, vocab)
            try:
                config = make(small)
                net = build(config, name)
                if kinds and len(layer_kinds(st.find_layer_list(net)[1])) < len(kinds):
                    last = f"the first {len(keep)} layers keep fewer than its {len(kinds)} layer kinds"
                    break
                if sum(p.numel() for p in net.parameters()) <= FORWARD_PROBE_MAX:
                    probe(build(config, name, "cpu"), config, name)
            except DayzeroError as e:
                last = str(e)
                continue
            notes = [note] if note else []
            if not head_key:
                notes.append(f"{small['num_attention_heads']} attention heads, dividing hidden {h}: the modeling "
                             f"code rejects a head_dim kept from the full model ({last})")
            if h is not None and h != hidden:
                notes.append(f"--hidden {hidden} is rejected by the modeling code ({last}); the proxy uses hidden {h}")
            return Proxy(small, tuple(notes))
    raise DayzeroError(f"{name}: no proxy of this shape is accepted by the model's own code: {last}; "
                       "try other --hidden / --layers values")


def build(config, name: str, device: str = "meta"):
    """transformers' model of ``config`` on ``device`` in fp32; one line when the modeling code fails."""
    import torch
    from transformers import AutoModelForCausalLM

    from dayzero.ops.hf_model import _quiet_transformers

    with _quiet_transformers(), torch.device(device):
        try:
            return AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
        except Exception as e:  # any modeling code can fail; one line, never a traceback
            raise DayzeroError(f"{name}: cannot build the proxy {type(config).__name__}: "
                               f"{one_line(e)}") from None


def probe(net, config, name: str, tokens: int = 8) -> None:
    """One forward of two short sequences: a config the model's own code cannot run (e.g. MLA with
    fewer key/value heads than heads) is one line here, not a traceback per rank."""
    import torch

    vocab = int(getattr(config, "vocab_size", 2) or 2)
    ids = torch.arange(2 * tokens, dtype=torch.long).remainder(vocab).reshape(2, tokens)
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            net(input_ids=ids, use_cache=False)
    except Exception as e:  # any modeling code can fail; one line, never a traceback
        raise DayzeroError(f"{name}: the model's own code fails a forward pass of the proxy "
                           f"({one_line(e)}); check the config's shapes "
                           "(heads, key/value heads, head dims) against what the modeling code expects") from None
