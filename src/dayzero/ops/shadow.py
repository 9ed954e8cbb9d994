"""Concrete values for the few small tensors whose values decide shapes on the meta device.

Meta tensors have shapes but no values, which is all a trace needs, until the model's code asks
for a value: MoE routing turns router scores into expert indices, then ``nonzero``/``where``/
``.item()`` decide how many tokens each expert gets and which experts run at all. For those
paths we keep a CPU "shadow" value next to small meta tensors:

* factories (``arange``, ``zeros``, ``full``, ...) and ops whose meta inputs all have shadows get
  a shadow computed on CPU (positions, masks, expert one-hots, offsets) when small (<= 64 M
  integer/bool elements, <= 64 k floating-point ones);
* top-k / sort / arg-max over values the trace cannot know (router scores derived from weights)
  get *balanced* synthetic indices: row r picks experts (r*k + j) mod n, so every expert receives
  tokens*k/n tokens (+-1), the load a trained, balanced router aims for (an assumption, reported);
* data-dependent operators (``nonzero``, ``.item()``, boolean indexing, ...) run on CPU with the
  shadows, and with zero stand-ins (expanded from one element, no memory) for weight-derived
  inputs, to learn the output shape; the meta result gets that shape.

Activations never get shadows, so this costs tens of milliseconds.
"""

from __future__ import annotations

import torch
from torch.utils.weak import WeakIdKeyDictionary

from dayzero.errors import DayzeroError
from dayzero.ops._torch_compat import tree_flatten, tree_map

aten = torch.ops.aten
# elements: larger integer/bool tensors never get a shadow (2^26 int64 = 512 MiB, transient; holds
# the expert one-hot tokens x top_k x (experts+1) of transformers' eager MoE loop up to ~16 k tokens
# with 512 experts, top-8)
LIMIT = 1 << 26
FLOAT_LIMIT = 1 << 16  # floating-point results (masks turned into -inf biases, ...) rarely decide shapes
_DATA_DEPENDENT = {aten.nonzero.default, aten._local_scalar_dense.default, aten.masked_select.default,
                   aten._unique2.default, aten.unique_dim.default, aten.unique_consecutive.default,
                   aten.repeat_interleave.Tensor, aten.bincount.default, aten.equal.default, aten.is_nonzero.default}
# value-free results: their values do not depend on their inputs' values
_VALUE_FREE = {aten.zeros_like.default, aten.ones_like.default, aten.full_like.default, aten.new_zeros.default,
               aten.new_ones.default, aten.new_full.default}
# index outputs picked from values the trace cannot know: synthesized, balanced
_INDEX_PICKERS = {aten.topk.default, aten.sort.default, aten.sort.stable, aten.max.dim, aten.min.dim,
                  aten.argmax.default, aten.argmin.default, aten.multinomial.default}


def _balanced_indices(shape: tuple[int, ...], n: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """Indices of ``shape`` in [0, n) along ``dim``: row r, slot j -> (r*k + j) % n (distinct in a
    row when k <= n; every index used equally often over the rows)."""
    dim = dim % max(len(shape), 1)
    moved = list(shape[:dim]) + list(shape[dim + 1:]) + [shape[dim] if shape else 1]
    k = moved[-1]
    rows = 1
    for s in moved[:-1]:
        rows *= s
    idx = (torch.arange(rows).unsqueeze(1) * k + torch.arange(k).unsqueeze(0)) % max(n, 1)
    idx = idx.reshape(moved).movedim(-1, dim) if shape else idx.reshape(())
    return idx.to(dtype)


class ShadowValues:
    """CPU values for small meta tensors; ``run`` executes one operator with them."""

    def __init__(self):
        self._values = WeakIdKeyDictionary()  # meta tensor -> its CPU value (weak: never extends a lifetime)
        self.synthesized: set[str] = set()  # operators whose indices were synthesized

    def attach(self, meta: torch.Tensor, value: torch.Tensor) -> None:
        self._values[meta] = value

    def get(self, meta: torch.Tensor) -> torch.Tensor | None:
        return self._values.get(meta)

    def _cpu(self, x, stand_in: bool):
        if isinstance(x, torch.Tensor) and x.is_meta:
            v = self.get(x)
            if v is None and stand_in:  # zeros expanded from one element: no memory
                v = torch.zeros((), dtype=x.dtype).expand(x.shape)
            return v
        if isinstance(x, torch.device) and x.type == "meta":
            return torch.device("cpu")
        return x

    def run(self, func, args, kwargs):
        """Execute ``func`` on meta tensors, keeping shadows current; returns the meta result."""
        leaves = tree_flatten((args, kwargs))[0]
        metas = [t for t in leaves if isinstance(t, torch.Tensor) and t.is_meta]
        all_known = all(self.get(t) is not None for t in metas)
        if func in _DATA_DEPENDENT:
            return self._run_on_cpu(func, args, kwargs, all_known)
        try:
            out = func(*args, **kwargs)
        except (NotImplementedError, RuntimeError):
            if not metas:
                raise
            return self._run_on_cpu(func, args, kwargs, all_known)
        mutated = [a for a, r in zip(args, func._schema.arguments) if isinstance(a, torch.Tensor)
                   and r.alias_info is not None and r.alias_info.is_write]
        if metas and all_known:
            self._shadow_outputs(func, args, kwargs, out, stand_in=False)
        elif func in _VALUE_FREE or (not metas and kwargs.get("device") == torch.device("meta")):
            self._shadow_outputs(func, args, kwargs, out, stand_in=True)
        else:
            for m in mutated:  # written from values we do not know: the shadow is stale
                self._values.pop(m, None)
            if func in _INDEX_PICKERS:
                self._synthesize(func, args, kwargs, out)
        return out

    def _shadow_outputs(self, func, args, kwargs, out, stand_in: bool) -> None:
        outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        if not outs or any(o.numel() > (FLOAT_LIMIT if o.is_floating_point() else LIMIT) for o in outs):
            return
        cpu_args, cpu_kwargs = tree_map(lambda x: self._cpu(x, stand_in), (args, kwargs))
        try:
            result = func(*cpu_args, **cpu_kwargs)
        except (NotImplementedError, RuntimeError):  # no CPU kernel for this dtype (e.g. histc on int):
            return  # the values stay unknown, which only matters if a data-dependent op needs them later
        values = [v for v in tree_flatten(result)[0] if isinstance(v, torch.Tensor)]
        for o, v in zip(outs, values):
            if o.is_meta and o is not v:
                self.attach(o, v)

    def _synthesize(self, func, args, kwargs, out) -> None:
        x = args[0]
        if func is aten.topk.default:
            dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
            target = out[1]
        elif func in (aten.argmax.default, aten.argmin.default):
            dim = args[1] if len(args) > 1 else kwargs.get("dim")
            if dim is None:
                return
            target = out
        elif func is aten.multinomial.default:
            dim, target = -1, out
        else:  # sort / max.dim / min.dim: (values, indices)
            dim = args[1] if len(args) > 1 and isinstance(args[1], int) else kwargs.get("dim", -1)
            target = out[1]
        if target.numel() > LIMIT:
            return
        n = x.shape[dim] if x.dim() else 1
        if func in (aten.sort.default, aten.sort.stable):  # identity permutation
            shape = list(target.shape)
            idx = torch.arange(shape[dim]).view([-1 if i == dim % len(shape) else 1 for i in range(len(shape))])
            value = idx.expand(shape).to(target.dtype).contiguous()
        elif target.dim() < x.dim():  # keepdim=False reductions: one index per row, still balanced
            value = _balanced_indices(tuple(target.shape) + (1,), n, -1, target.dtype).squeeze(-1)
        else:
            value = _balanced_indices(tuple(target.shape), n, dim, target.dtype)
        self.attach(target, value)
        self.synthesized.add(str(func))

    def _run_on_cpu(self, func, args, kwargs, all_known: bool):
        """Data-dependent operator: compute on CPU to learn the result (shape), return it on meta."""
        int_inputs_known = all(self.get(t) is not None for t in tree_flatten((args, kwargs))[0]
                               if isinstance(t, torch.Tensor) and t.is_meta
                               and not (t.is_floating_point() or t.is_complex()))
        if not (all_known or int_inputs_known):
            raise DayzeroError(f"{func} needs the value of a tensor computed from the model's weights, which a "
                               "meta-device trace does not have (the code branches on data); this model cannot be "
                               "traced without weights")
        cpu_args, cpu_kwargs = tree_map(lambda x: self._cpu(x, True), (args, kwargs))
        result = func(*cpu_args, **cpu_kwargs)

        def to_meta(v):
            if not isinstance(v, torch.Tensor):
                return v
            m = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
            if all_known and v.numel() <= LIMIT:
                self.attach(m, v)
            return m

        return tree_map(to_meta, result)
