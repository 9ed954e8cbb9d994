"""Record every ATen operator a model runs in one training step (forward + backward).

A ``TorchDispatchMode`` sees each call after autograd, i.e. the operators a backend must execute,
forward and backward. Tensors live on the meta device, so a 600 B-parameter layer costs nothing.
For each call we keep: operator overload, phase, the decoder layer and module category it came
from (via ``torch.utils.module_tracker.ModuleTracker``, which also follows the backward pass),
input dtypes and shapes, FLOPs (``torch.utils.flop_counter``'s formulas), bytes moved (inputs read
+ outputs written, each tensor's memory footprint once), whether it launches a kernel at all
(views and allocations do not), and its producer calls so fusion can walk the dataflow.

Counts scale to the full model: a call in the representative of a layer kind counts once per
layer of that kind; calls outside decoder layers (embedding, final norm, head, loss) count once.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.utils.module_tracker import ModuleTracker
from torch.utils.weak import WeakIdKeyDictionary

from dayzero.errors import DayzeroError, one_line
from dayzero.ops._torch_compat import TorchDispatchMode, current_autograd_node, flop_formulas, tree_flatten, tree_map
from dayzero.ops.hf_model import LayerKind, MetaModel, build_meta_model
from dayzero.ops.modules import ModuleMap
from dayzero.ops.shadow import ShadowValues
from dayzero.specs.model import ModelSpec
from dayzero.torch_version import require_torch

aten = torch.ops.aten
# calls that allocate or re-describe memory without launching a compute kernel
_NO_KERNEL = {aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default,
              aten.new_empty.default, aten.new_empty_strided.default, aten._unsafe_view.default,
              aten.lift_fresh.default, aten._local_scalar_dense.default}


@dataclass(frozen=True)
class TensorSpec:
    """A tensor argument without data (enough to rebuild a random one)."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(slots=True)
class OpCall:
    """One ATen call of the traced step."""

    op: str  # overload name, e.g. "aten.mm.default"
    phase: str  # forward | backward
    layer: int | None  # index of the layer kind's representative; None outside decoder layers
    category: str  # attention | mlp | router | norm | embedding | head | loss | residual | other
    module: str  # deepest module path
    dtypes: tuple[str, ...]  # dtypes of the tensor inputs (plus an explicit dtype= argument)
    shapes: tuple[tuple[int, ...], ...]  # shapes of the tensor inputs
    flops: int
    bytes: int
    kernel: bool  # launches a kernel (views and allocations do not)
    inputs: tuple[int, ...]  # tensor ids read
    outputs: tuple[int, ...]  # tensor ids written
    producers: tuple[int, ...]  # indices of the calls that last wrote the inputs


@dataclass
class Trace:
    """The recorded step of the reduced model and how to scale it to the full depth."""

    model: str
    model_type: str
    seq: int
    batch: int
    dtype: str
    experts: str  # transformers' experts implementation ("" without MoE)
    kinds: tuple[LayerKind, ...]
    num_layers: int
    calls: list[OpCall]
    examples: dict[tuple[str, tuple[str, ...]], tuple]  # (op, dtypes) -> (args, kwargs) of its smallest call
    tensor_bytes: dict[int, int] = field(default_factory=dict)  # tensor id -> memory footprint
    layer_list: str = ""  # qualified name of the decoder-layer ModuleList, e.g. "model.layers"
    notes: list[str] = field(default_factory=list)
    spec: ModelSpec | None = None  # when dayzero parses the model_type (not for unknown remote code)
    # (layer of the reduced model, class of the layer's child module that saves: its mixer, its feed-forward
    # block, a norm; "" for the layer's own code) -> bytes its forward saves for backward (saved=True only)
    saved_bytes: dict[tuple[int, str], int] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return self.seq * self.batch

    def multiplier(self, call: OpCall) -> int:
        return 1 if call.layer is None else len(self.kinds[call.layer].layers)

    def module_path(self, call: OpCall) -> str:
        """The call's module without the root class, its layer index shown as the layer kind:
        ``model.layers[moe].mlp.experts`` (the reduced model's index would mislead)."""
        path = call.module.partition(".")[2] or call.module
        prefix = f"{self.layer_list}.{call.layer}"
        if call.layer is not None and (path == prefix or path.startswith(prefix + ".")):
            path = f"{self.layer_list}[{self.kinds[call.layer].name}]{path[len(prefix):]}"
        return path

    def total_flops(self) -> int:
        return sum(c.flops * self.multiplier(c) for c in self.calls)

    def op_counts(self) -> Counter:
        counts: Counter = Counter()
        for c in self.calls:
            counts[c.op] += self.multiplier(c)
        return counts


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def call_dtypes(args, kwargs, out=None) -> tuple[str, ...]:
    """The dtypes a manifest's ``dtypes`` entry is checked against: those of the tensor inputs
    and of an explicit ``dtype=`` argument (of the outputs for factories without tensor inputs)."""
    names = {_dtype_name(a.dtype) for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)}
    if isinstance(kwargs.get("dtype"), torch.dtype):
        names.add(_dtype_name(kwargs["dtype"]))
    if not names and out is not None:
        names = {_dtype_name(o.dtype) for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)}
    return tuple(sorted(names))


def _footprint(t: torch.Tensor) -> int:
    """Bytes of memory a kernel touches for ``t`` (an expanded tensor reads its base once)."""
    if t.numel() == 0:
        return 0
    span = 1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))
    return min(span, t.numel()) * t.element_size()


def _is_view(func) -> bool:
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def _grouped_mm_flops(a: torch.Tensor, b: torch.Tensor) -> int:
    """torch._grouped_mm: 2*M*K*N whichever operand is grouped (x G when both are 3-D, batched)."""
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    return 2 * m * k * n * (a.shape[0] if a.dim() == 3 and b.dim() == 3 else 1)


class OpRecorder(TorchDispatchMode):
    """Records every call into a list of :class:`OpCall`."""

    def __init__(self, modules: ModuleMap, tracker: ModuleTracker, shadows: ShadowValues,
                 deadline: float | None = None):
        super().__init__()
        self.modules, self.tracker, self.shadows = modules, tracker, shadows
        self.deadline = deadline  # time.monotonic() after which the trace is abandoned (TraceTimeout)
        self.calls: list[OpCall] = []
        self.examples: dict[tuple, tuple[int, tuple]] = {}
        # weak: holding tensors would change what autograd does (it clones a gradient it cannot steal)
        self._ids = WeakIdKeyDictionary()
        self._next_id = 0
        self._writer: dict[int, int] = {}
        self.tensor_bytes: dict[int, int] = {}
        self._formulas = flop_formulas()
        self._head_done = {"forward": False, "backward": False}
        # storage key -> (layer of its first writer in the forward, the storage, held so that no
        # later storage reuses its address while the trace runs); filled only for SavedTensors
        self.origins: dict[int, tuple[int | None, object]] | None = None

    def _tid(self, t: torch.Tensor) -> int:
        tid = self._ids.get(t)
        if tid is None:
            tid = self._ids[t] = self._next_id
            self._next_id += 1
            self.tensor_bytes[tid] = _footprint(t)
        return tid

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise TraceTimeout("the trace ran past its time budget")
        out = self.shadows.run(func, args, kwargs)
        self._record(func, args, kwargs, out)
        return out

    def _context(self, phase: str) -> tuple[int | None, str, str]:
        """(layer, category, module) of the call being recorded. In the backward, the autograd
        node being executed carries the context of the forward call that created it (see
        :meth:`tag_autograd_nodes`); gradient accumulation into a parameter gets the parameter's
        module. Otherwise (and for the forward) the module tracker's innermost module decides."""
        if phase == "backward":
            node = current_autograd_node()
            if node is not None:
                hit = node.metadata.get("dayzero")
                if hit is not None:
                    return hit
                var = getattr(node, "variable", None)
                if var is not None and self.modules.owner(var) is not None:
                    return self.modules.owner(var)
        deepest = max(self.tracker.parents, key=lambda p: p.count("."))
        layer, category = self.modules.locate(deepest)
        if category == "head":
            self._head_done[phase] = True
        elif category == "root":
            category = "loss" if self._head_done[phase] != (phase == "backward") else "other"
        return layer, category, deepest

    def _stamp(self, t: torch.Tensor, tid: int) -> None:
        """Give ``t``'s autograd node the context of the call that last wrote ``t``, so its
        backward is attributed to that call's layer and module."""
        node = t.grad_fn
        writer = self._writer.get(tid)
        if node is not None and writer is not None and "dayzero" not in node.metadata:
            c = self.calls[writer]
            node.metadata["dayzero"] = (c.layer, c.category, c.module)

    def tag_autograd_nodes(self, *tensors: torch.Tensor) -> None:
        """After the forward: stamp the nodes of tensors no call consumed (the loss)."""
        for t in tensors:
            self._stamp(t, self._tid(t))

    def _record(self, func, args, kwargs, out) -> None:
        flat_in = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        flat_out = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        name = str(func)
        kernel = func not in _NO_KERNEL and not _is_view(func)
        nbytes = 0
        if kernel:
            seen_in = {id(t): t for t in flat_in}
            seen_out = {id(t): t for t in flat_out}
            nbytes = sum(_footprint(t) for t in seen_in.values()) + sum(_footprint(t) for t in seen_out.values())
        flops = 0
        formula = self._formulas.get(func.overloadpacket)
        if formula is not None:
            flops = int(formula(*args, **kwargs, out_val=out))
        elif func is aten._grouped_mm.default:
            flops = _grouped_mm_flops(args[0], args[1])
        phase = "backward" if self.tracker.is_bw else "forward"
        layer, category, deepest = self._context(phase)
        dts = call_dtypes(args, kwargs, out)
        inputs = tuple(self._tid(t) for t in flat_in)
        if phase == "forward":  # every autograd node belongs to a tensor a later call consumes
            for t, tid in zip(flat_in, inputs):
                self._stamp(t, tid)
        producers = tuple(sorted({self._writer[i] for i in inputs if i in self._writer}))
        index = len(self.calls)
        outputs = tuple(self._tid(t) for t in flat_out)
        for o in outputs:
            self._writer[o] = index
        if self.origins is not None and phase == "forward":
            for t in flat_out:
                st = _storage(t)
                if st is not None:
                    self.origins.setdefault(st._cdata, (layer, st))
        self.calls.append(OpCall(op=name, phase=phase, layer=layer, category=category, module=deepest,
                                 dtypes=dts, shapes=tuple(tuple(t.shape) for t in flat_in),
                                 flops=flops, bytes=nbytes, kernel=kernel, inputs=inputs, outputs=outputs,
                                 producers=producers))
        size = sum(t.numel() for t in flat_in) + sum(t.numel() for t in flat_out)
        key = (name, dts)
        if key not in self.examples or size < self.examples[key][0]:
            spec = tree_map(lambda a: TensorSpec(tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a,
                            (tuple(args), dict(kwargs)))
            self.examples[key] = (size, spec)


def trace_model(model: str, seq: int | None = None, batch: int = 1, dtype: str = "bfloat16",
                experts: str = "grouped_mm", trust_remote_code: bool = False) -> Trace:
    """Trace one training step (forward, loss, backward) of MODEL's real modeling code."""
    require_torch("dayzero ops")
    meta = build_meta_model(model, dtype=dtype, experts=experts, trust_remote_code=trust_remote_code)
    max_pos = getattr(meta.model.config, "max_position_embeddings", None) or 4096
    seq = seq or min(max_pos, 4096)
    if seq < 2 or batch < 1:
        raise DayzeroError(f"--seq {seq} / --batch {batch}: need seq >= 2 and batch >= 1")
    return _run(meta, seq, batch, dtype)


def _storage(t: torch.Tensor):
    """``t``'s untyped storage (views share it), or None for a tensor without one."""
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None


class SavedTensors:
    """Bytes autograd saves for backward in each decoder layer of the reduced model, counted by
    ``torch.autograd.graph.saved_tensors_hooks`` during the forward.

    A saved tensor is charged to the decoder layer, and the class of that layer's child module
    (:meth:`ModuleMap.layer_child`), of the module that saves it (the module tracker's innermost
    module), once per storage: views and repeated saves of one tensor (the input of q,
    k and v projections) share a storage and count once, at its full size, which is what stays
    allocated. Storage identity is the storage's address (``_cdata``; meta tensors have no data
    pointer), kept unique by holding every storage the trace writes (:attr:`OpRecorder.origins`).
    Not counted: parameters and buffers (and their views: a transposed weight), and tensors that
    need no gradient written outside the decoder layers, which every layer shares (rotary tables,
    masks, position ids). A tensor saved by two layers counts in the first."""

    def __init__(self, net: torch.nn.Module, modules: ModuleMap, tracker: ModuleTracker, rec: OpRecorder):
        self.modules, self.tracker, self.rec = modules, tracker, rec
        rec.origins = {}
        self._exclude = {st._cdata for t in (*net.parameters(), *net.buffers()) if (st := _storage(t)) is not None}
        self._seen: set[int] = set()
        self.bytes: dict[tuple[int, str], int] = {}  # (layer of the reduced model, child class) -> saved bytes

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        deepest = max(self.tracker.parents, key=lambda p: p.count("."))
        layer = self.modules.locate(deepest)[0]
        st = _storage(t)
        if layer is None or st is None or st._cdata in self._exclude or st._cdata in self._seen:
            return t
        origin = self.rec.origins.get(st._cdata)
        if (origin is None or origin[0] is None) and not t.requires_grad:
            return t
        self._seen.add(st._cdata)
        key = (layer, self.modules.layer_child(deepest))
        self.bytes[key] = self.bytes.get(key, 0) + st.nbytes()
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t


class TraceTimeout(DayzeroError):
    """A trace that ran past the caller's time budget (its model code loops per token, say)."""


def _run(meta: MetaModel, seq: int, batch: int, dtype: str, deadline: float | None = None,
         backward: bool = True, saved: bool = False) -> Trace:
    """Trace ``meta`` at ``seq`` x ``batch`` tokens; ``saved``: also count the bytes each decoder
    layer saves for backward (:class:`SavedTensors`, ``Trace.saved_bytes``)."""
    net = meta.model
    modules = ModuleMap(net, meta.layer_list)
    shadows = ShadowValues()
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    shadows.attach(ids, torch.zeros(batch, seq, dtype=torch.long))
    counter = None
    with ModuleTracker() as tracker, OpRecorder(modules, tracker, shadows, deadline) as rec:
        try:
            if saved:
                counter = SavedTensors(net, modules, tracker, rec)
                with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
                    out = net(input_ids=ids, labels=ids, use_cache=False)
            else:
                out = net(input_ids=ids, labels=ids, use_cache=False)
            if backward:
                loss = _loss_of(out, ids)
                rec.tag_autograd_nodes(loss)
                loss.backward()
        except TraceTimeout:
            raise
        except Exception as e:  # the model's own code failed on meta tensors: say where, in one line
            where = max(tracker.parents, key=lambda p: p.count("."))
            what = str(e) if isinstance(e, DayzeroError) else one_line(e)
            raise DayzeroError(f"{meta.name}: tracing failed in {where}: {what}") from None
    examples = {k: v[1] for k, v in rec.examples.items()}
    return Trace(model=meta.name, model_type=meta.model_type, seq=seq, batch=batch, dtype=dtype, experts=meta.experts,
                 kinds=meta.kinds, num_layers=meta.num_layers, calls=rec.calls, examples=examples,
                 tensor_bytes=rec.tensor_bytes, layer_list=meta.layer_list,
                 notes=list(meta.notes) + _routing_note(shadows), spec=meta.spec,
                 saved_bytes=dict(counter.bytes) if counter is not None else {})


def _routing_note(shadows: ShadowValues) -> list[str]:
    if not shadows.synthesized:
        return []
    return [f"routing indices ({', '.join(sorted(shadows.synthesized))}) assumed balanced: every expert gets "
            "tokens*top_k/experts tokens"]


def _loss_of(out, labels: torch.Tensor) -> torch.Tensor:
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    if loss is None and isinstance(out, (tuple, list)) and out and out[0].dim() == 0:
        loss = out[0]
    if loss is None:  # a model that does not compute its loss: next-token cross entropy on its logits
        logits = out.logits if hasattr(out, "logits") else out[0]
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten())
    return loss
