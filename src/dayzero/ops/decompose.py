"""Decompose operators a backend lacks into operators it has, and check the result numerically.

For an unsupported operator we try, in order, the decompositions PyTorch ships
(``torch._decomp.core_aten_decompositions()``, then the rest of ``torch._decomp``'s post-autograd
table, skipping ``torch._refs`` entries, which lower to ``prims`` rather than ATen), then a few
textbook identities for Core ATen ops PyTorch does not decompose (they are primitives there):
``rsqrt(x) = 1/sqrt(x)``, ``sigmoid(x) = 1/(1+exp(-x))``, ``x**2 = x*x``, ..., and for an in-place
op without one, functionalization's rewrite ``x.op_(y) = x.copy_(op(x, y))``.

A :class:`Lowering` dispatch mode applies the chosen decomposition and, recursively, decomposes
any operator inside it that is still unsupported, until every leaf is supported (or has no
decomposition: then the op "needs a kernel"). For each op we pick the first candidate whose full
expansion is supported. The check runs the original operator and its lowering on the same random
CPU inputs (the smallest traced call, shapes shrunk when large) and compares them within the
dtype's tolerance.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import torch

from dayzero.ops._torch_compat import TorchDispatchMode, decomposition_tables, tree_flatten, tree_map
from dayzero.ops.trace import TensorSpec, call_dtypes

aten = torch.ops.aten
MAX_DEPTH = 8
MAX_CHECK_ELEMENTS = 1 << 21  # per check: larger examples are shrunk
# (rtol, atol) per dtype: max|lowered - original| <= atol + rtol * max|original| (a few units in
# the last place of the dtype; reductions may sum in another order)
TOLERANCE = {torch.bfloat16: (2e-2, 1e-3), torch.float16: (2e-3, 1e-4), torch.float32: (1e-5, 1e-6),
             torch.float64: (1e-12, 1e-14)}


def _mean_dim(x, dim, keepdim=False, dtype=None):
    dims = range(x.dim()) if not dim else [d % x.dim() for d in dim]
    n = math.prod(x.shape[d] for d in dims)
    return aten.div.Scalar(aten.sum.dim_IntList(x, list(dims), keepdim, dtype=dtype), n)


def _pow_scalar(x, exponent):
    if exponent == 2:
        return aten.mul.Tensor(x, x)
    if exponent == 0.5:
        return aten.sqrt.default(x)
    if exponent == -1:
        return aten.reciprocal.default(x)
    return NotImplemented


# identities for Core ATen operators that torch._decomp leaves as primitives
IDENTITIES: dict = {
    aten.rsqrt.default: lambda x: aten.reciprocal.default(aten.sqrt.default(x)),
    aten.sqrt.default: lambda x: aten.pow.Tensor_Scalar(x, 0.5),
    aten.reciprocal.default: lambda x: aten.pow.Tensor_Scalar(x, -1),
    aten.neg.default: lambda x: aten.mul.Scalar(x, -1),
    aten.sigmoid.default: lambda x: aten.reciprocal.default(aten.add.Scalar(aten.exp.default(aten.neg.default(x)), 1)),
    aten.sub.Tensor: lambda x, y, alpha=1: aten.add.Tensor(x, y, alpha=-alpha),
    aten.div.Tensor: lambda x, y: aten.mul.Tensor(x, aten.reciprocal.default(y)),
    aten.mean.dim: _mean_dim,
    aten.pow.Tensor_Scalar: _pow_scalar,
}


def _functional_of(func):
    """``aten.div_.Tensor`` -> ``aten.div.Tensor`` (None when there is no functional twin)."""
    name = func._schema.name.split("::")[1]
    if not name.endswith("_") or name.startswith("_") and name.count("_") < 2:
        return None
    packet = getattr(torch.ops.aten, name[:-1], None)
    overload = func._overloadname
    return getattr(packet, overload, None) if packet is not None else None


def _functionalized(func):
    """In-place ``x.op_(...)`` as ``x.copy_(op(x, ...))``: how functionalization rewrites it."""
    functional = _functional_of(func)
    if functional is None or not func._schema.arguments or func._schema.arguments[0].alias_info is None:
        return None

    def run(self, *args, **kwargs):
        return aten.copy_.default(self, functional(self, *args, **kwargs))

    return run


def candidates(func) -> list[tuple[str, Callable]]:
    """(source, decomposition) pairs for ``func``, best first."""
    core, table = decomposition_tables()
    out = []
    if func in core:
        out.append(("torch._decomp (core ATen)", core[func]))
    fn = table.get(func)
    if fn is not None and fn is not core.get(func) and not fn.__module__.startswith("torch._refs"):
        out.append(("torch._decomp", fn))
    if func in IDENTITIES:
        out.append(("identity", IDENTITIES[func]))
    inplace = _functionalized(func)
    if inplace is not None:
        out.append(("functionalization", inplace))
    return out


class Lowering(TorchDispatchMode):
    """Runs every call; unsupported ones are replaced by their chosen decomposition (recursively)."""

    def __init__(self, supported: Callable[[str, tuple[str, ...]], bool], choice: dict, stack: tuple = ()):
        super().__init__()
        self.supported, self.choice, self.stack = supported, choice, list(stack)
        self.leaves: Counter = Counter()  # supported leaves
        self.missing: Counter = Counter()  # unsupported leaves with no (working) decomposition
        self.steps: dict[str, list[str]] = {}  # op -> ops its decomposition calls directly
        self.sources: dict[str, str] = {}
        self._children: list[list[str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        if self._children:
            self._children[-1].append(name)
        if self.supported(name, call_dtypes(args, kwargs)):
            self.leaves[name] += 1
            return func(*args, **kwargs)
        return self.expand(func, args, kwargs)

    def expand(self, func, args, kwargs):
        name = str(func)
        index = self._choose(func, args, kwargs)
        if index is None:
            self.missing[name] += 1
            return func(*args, **kwargs)
        source, fn = candidates(func)[index]
        self.stack.append(func)
        self._children.append([])
        try:
            with self:
                out = fn(*args, **kwargs)
        finally:
            self.stack.pop()
            children = self._children.pop()
        self.steps.setdefault(name, children)
        self.sources.setdefault(name, source)
        return out

    def _choose(self, func, args, kwargs) -> int | None:
        """Index of the first candidate whose expansion is fully supported (else the one missing
        the fewest ops); None when there is none. Memoized per operator in ``choice``."""
        if func in self.choice:
            return self.choice[func]
        if func in self.stack or len(self.stack) >= MAX_DEPTH:
            return None
        self.choice[func] = None  # while deciding, a recursive use of func is a dead end
        best, fewest = None, None
        for i, (_, fn) in enumerate(candidates(func)):
            trial = Lowering(self.supported, self.choice, tuple(self.stack) + (func,))
            trial._children.append([])
            try:
                with trial:
                    out = fn(*_clone_meta(args), **_clone_meta(kwargs))
            except Exception:  # a decomposition that rejects these arguments: try the next one
                continue
            if out is NotImplemented:
                continue
            missing = sum(trial.missing.values())
            if missing == 0:
                best = i
                break
            if fewest is None or missing < fewest:
                best, fewest = i, missing
        self.choice[func] = best
        return best


def _clone_meta(tree):
    return tree_map(lambda a: torch.empty_like(a, device="meta") if isinstance(a, torch.Tensor) else a, tree)


@dataclass(frozen=True)
class Decomposition:
    """How an unsupported operator lowers onto a backend."""

    op: str
    complete: bool  # every leaf is supported
    leaves: tuple[str, ...]  # supported operators it ends up calling
    missing: tuple[str, ...]  # operators it still needs (no decomposition)
    steps: tuple[str, ...]  # "op -> a, b" for each decomposition applied
    sources: tuple[str, ...]
    verified: bool | None  # numerics on CPU: True pass, False fail, None not checked
    max_abs_err: float | None
    check: str  # what the check did, or why it was skipped

    def to_dict(self) -> dict:
        return {"op": self.op, "complete": self.complete, "ops": list(self.leaves), "missing": list(self.missing),
                "steps": list(self.steps), "sources": list(self.sources), "verified": self.verified,
                "max_abs_err": self.max_abs_err, "check": self.check}


def decompose(op: str, example: tuple, supported: Callable[[str, tuple[str, ...]], bool],
              check: bool = True, seed: int = 0) -> Decomposition:
    """Lower ``op`` (called as in ``example``: (args, kwargs) with TensorSpec leaves) onto the
    supported operators and, if ``check``, compare with the original on random CPU inputs."""
    func = _resolve(op)
    args, kwargs = _materialize(example, "meta", None, {})
    choice: dict = {}
    low = Lowering(supported, choice)
    try:
        low.expand(func, args, kwargs)
    except Exception as e:  # the op's own meta kernel or a decomposition failed on these arguments
        return Decomposition(op, False, (), (op,), (), (), None, None, f"could not decompose: {type(e).__name__}")
    missing = tuple(sorted(low.missing))
    if choice.get(func) is None:
        missing = (op,)
    steps = tuple(f"{k} -> {', '.join(dict.fromkeys(v))}" for k, v in low.steps.items())
    sources = tuple(sorted(set(low.sources.values())))
    complete = not missing
    verified, err, note = (None, None, "not checked")
    if check and choice.get(func) is not None:
        verified, err, note = _check(func, example, supported, choice, seed)
    return Decomposition(op, complete, tuple(sorted(low.leaves)), missing, steps, sources, verified, err, note)


def _resolve(op: str):
    ns, name, overload = op.split(".")
    return getattr(getattr(getattr(torch.ops, ns), name), overload)


def _shrink_map(example: tuple) -> dict[int, int]:
    """Large sizes -> small distinct sizes (equal sizes stay equal), so a huge call can be checked."""
    specs = [a for a in tree_flatten(example)[0] if isinstance(a, TensorSpec)]
    if sum(s.numel for s in specs) <= MAX_CHECK_ELEMENTS:
        return {}
    sizes = sorted({d for s in specs for d in s.shape if d > 16})
    return {v: 16 + i for i, v in enumerate(sizes)}


def _materialize(example: tuple, device: str, gen: torch.Generator | None, sizes: dict[int, int], int_high: int = 2):
    def make(a):
        if isinstance(a, TensorSpec):
            shape = tuple(sizes.get(d, d) for d in a.shape)
            if device == "meta":
                return torch.empty(shape, dtype=a.dtype, device="meta")
            if a.dtype.is_floating_point or a.dtype.is_complex:
                return torch.randn(shape, generator=gen, dtype=torch.float32).to(a.dtype)
            if a.dtype == torch.bool:
                return torch.randint(0, 2, shape, generator=gen).bool()
            return torch.randint(0, int_high, shape, generator=gen).to(a.dtype)  # indices: 0..int_high-1
        if isinstance(a, torch.device):
            return torch.device(device)
        if isinstance(a, int) and not isinstance(a, bool) and a in sizes:
            return sizes[a]
        return a

    args, kwargs = example
    return tree_map(make, (tuple(args), dict(kwargs)))


def _check(func, example: tuple, supported, choice: dict, seed: int) -> tuple[bool | None, float | None, str]:
    if torch.Tag.nondeterministic_seeded in func.tags:
        return None, None, "random operator: lowering traced, values not comparable"
    sizes = _shrink_map(example)
    failure = None
    for int_high in (2, 1):  # integer inputs are often indices: retry with all zeros if 0/1 is out of range
        gen = torch.Generator().manual_seed(seed)
        try:
            args, kwargs = _materialize(example, "cpu", gen, sizes, int_high)
            ref_args, ref_kwargs = tree_map(lambda a: a.clone() if isinstance(a, torch.Tensor) else a, (args, kwargs))
            ref = func(*ref_args, **ref_kwargs)
            got = Lowering(supported, choice).expand(func, args, kwargs)
            break
        except Exception as e:
            failure = e
    else:
        why = "shrunk inputs rejected" if sizes else "inputs rejected"
        return None, None, f"not checked ({why}: {type(failure).__name__})"
    pairs = list(zip(tree_flatten((ref, ref_args, ref_kwargs))[0], tree_flatten((got, args, kwargs))[0]))
    worst, ok = 0.0, True
    for r, g in pairs:
        if not isinstance(r, torch.Tensor):
            ok &= r == g
            continue
        if r.shape != g.shape or r.dtype != g.dtype:
            return False, None, f"shape/dtype differ: {tuple(r.shape)} {r.dtype} vs {tuple(g.shape)} {g.dtype}"
        if not (r.dtype.is_floating_point or r.dtype.is_complex):
            ok &= bool(torch.equal(r, g))
            continue
        rtol, atol = TOLERANCE.get(r.dtype, (1e-5, 1e-6))
        same = (r == g) | (r.isnan() & g.isnan())  # equal infinities and NaNs in the same places
        if bool((r.isnan() ^ g.isnan()).any()) or bool((r.isinf() & ~same).any()):
            return False, None, "NaN or infinity where the original has none"
        diff = torch.where(same, 0.0, (r.double() - g.double()).abs())
        scale = torch.where(same, 0.0, r.double().abs())
        if diff.numel():
            err = float(diff.max())
            worst = max(worst, err)
            ok &= err <= atol + rtol * float(scale.max())
    shape_note = " (shapes shrunk)" if sizes else ""
    if ok:
        return True, worst, f"random CPU inputs{shape_note}, max error within the dtype's tolerance"
    return False, worst, f"random CPU inputs{shape_note}: max error {worst:.3g} exceeds the dtype's tolerance"
