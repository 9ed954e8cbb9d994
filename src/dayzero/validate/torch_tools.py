"""The one place validation touches private PyTorch APIs, behind a version check.

``dayzero memory --exact`` needs three things PyTorch has only under private names so far:
the ``fake`` process group's store (``torch.testing._internal.distributed.fake_pg``), the FSDP2
memory tracker (``torch.distributed._tools.fsdp2_mem_tracker``) and its running snapshot. They
exist from torch 2.5 on; the floor is :mod:`dayzero.torch_version`.
"""

from __future__ import annotations

import contextlib


def local_tensor(t):
    """This rank's shard of a DTensor (its private ``_local_tensor``), or ``t`` itself."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def fake_store():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    return FakeStore()


@contextlib.contextmanager
def local_sharding_propagation():
    """DTensor derives an op's global output shape by running it on fake tensors of the global
    shape (ShardingPropagator._propagate_tensor_meta_non_cached), under the fake mode already
    active if there is one. Under ``--exact`` that is the tracker's own mode, which would count
    those global-shape shadow tensors (e.g. the full-vocabulary loss-parallel gradient) as memory
    that no rank allocates. Inside this context the propagation gets a fake mode of its own, as
    in a real run, and the tracker skips it."""
    from torch.distributed.tensor import _sharding_prop

    detect = _sharding_prop.detect_fake_mode
    _sharding_prop.detect_fake_mode = lambda *args: None
    try:
        yield
    finally:
        _sharding_prop.detect_fake_mode = detect


class _CategoryTracking:
    """What :func:`category_tracker` adds to torch's FSDPMemTracker (a mixin placed before it, so
    its overrides come first): per op, ``categorize(current snapshot)`` and the largest value each
    of its keys reached (``maxima``), and what was live when the ``temporary`` category reached its
    largest (``temporary_at``)."""

    def __init__(self, mod, optm, categorize, transient_refs, min_bytes: int):
        self.categorize, self.transient_refs, self.min_bytes = categorize, transient_refs, min_bytes
        super().__init__(mod, optm)
        self.maxima: dict = {}
        self.temporary_at: dict = {}
        self._listed = 0  # temporary bytes when the live tensors were last listed

    # FSDPMemTracker files the tensors an activation-checkpoint recomputation creates in
    # backward as activations while an FSDP unit's forward runs inside it (``_in_ac``, set by
    # that unit's pre-forward in backward: fsdp2_mem_tracker._fsdp_state_pre_forward, torch
    # 2.13), and as temporaries elsewhere. A checkpointed block that is itself an FSDP unit is
    # recomputed without its pre-forward (the checkpoint re-runs the forward function, not the
    # module call), but a nested unit (a MoE layer's experts under expert data parallelism) is
    # called as a module, so its recomputed tensors became "activations" that no forward-end
    # snapshot counts and no temporary maximum sees. The planner counts every recomputed tensor
    # as a backward transient: so does this tracker (the flag is kept False).
    @property
    def _in_ac(self) -> bool:
        return False

    @_in_ac.setter
    def _in_ac(self, value) -> None:
        pass

    def _fsdp_param_group_post_backward(self, fsdp_mod, orig):
        # A backward without gradient sync upcasts the unsharded gradient to the reduce dtype
        # (FSDPParam.to_accumulated_grad_if_needed) inside the post-backward hook, i.e. in the
        # backward region, so the tracker files that accumulated gradient as a temporary: it
        # is the unsharded gradient, kept until the micro-batch that syncs.
        inner = super()._fsdp_param_group_post_backward(fsdp_mod, orig)

        def wrapped(*args, **kwargs):
            inner(*args, **kwargs)
            group = fsdp_mod._get_fsdp_state()._fsdp_param_group
            for fsdp_param in (group.fsdp_params if group else ()):
                acc = fsdp_param.unsharded_accumulated_grad
                if acc is not None:
                    self._update_and_maybe_create_winfos(acc, ref_types().UNSHARDED_GRAD)

        return wrapped

    def _param_grads(self) -> set:
        """ids of the storages of the parameter gradients autograd has produced in this
        backward (FSDP2's unsharded parameters' ``.grad``, before the unit's post-backward
        reduce-scatter), which the tracker files as temporaries."""
        from torch.distributed.fsdp import FSDPModule

        ids = set()
        for mod in self._root_mod.modules():
            group = mod._get_fsdp_state()._fsdp_param_group if isinstance(mod, FSDPModule) else None
            for fp in (group.fsdp_params if group else ()):
                param = getattr(fp, "_unsharded_param", None)
                grad = getattr(param, "grad", None) if param is not None else None
                if grad is not None:
                    ids.add(id(local_tensor(grad).untyped_storage()))
        return ids

    def _live(self) -> list[tuple[str, int]]:
        """Live buffers of the transient kinds, largest first; a temporary that is a parameter's
        gradient is listed as an unsharded gradient (what it is until FSDP2 reduces it)."""
        grads = self._param_grads()
        temp = ref_types().TEMP
        live = [("Unsharded Grad" if w.reftype == temp and id(st) in grads else
                 str(getattr(w.reftype, "value", w.reftype)), int(w.mem_consumed))
                for st, (w, _) in self._WINFO.items()
                if w.reftype in self.transient_refs and w.mem_consumed >= self.min_bytes]
        return sorted(live, key=lambda x: -x[1])

    def observe(self, func=None) -> None:
        for snap in self._curr_mem_snap.values():
            for k, v in self.categorize(snap).items():
                if v > self.maxima.get(k, 0):
                    self.maxima[k] = v
                    if k == "temporary":
                        parents = sorted(self._mod_tracker.parents, key=len)
                        self.temporary_at.update(op=str(func), bytes=int(v), module=parents[-1] if parents else "",
                                                 phase="backward" if self._mod_tracker.is_bw else "forward")
                        if v > self._listed:  # the live set at every new maximum (the last one is the maximum)
                            self._listed = v
                            self.temporary_at["live"] = self._live()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        res = super().__torch_dispatch__(func, types, args, kwargs)
        if res is not NotImplemented:
            self.observe(func)
        return res


def category_tracker(module, optimizer, categorize, transient_refs=frozenset(), min_bytes: int = 2**20):
    """An FSDPMemTracker that also keeps, for every op, ``categorize(current snapshot)`` and the
    largest value each of its keys reached (``tracker.maxima``), and what was live when the
    ``temporary`` category reached its largest (``tracker.temporary_at``: the op, forward or
    backward, the innermost module, and the live tensors of the tracker categories in
    ``transient_refs`` of at least ``min_bytes``, largest first)."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    class _Tracker(_CategoryTracking, FSDPMemTracker):
        pass

    return _Tracker(module, optimizer, categorize, transient_refs, min_bytes)


def ref_types():
    from torch.distributed._tools.fsdp2_mem_tracker import _FSDPRefType

    return _FSDPRefType
