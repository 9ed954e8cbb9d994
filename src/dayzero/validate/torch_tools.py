"""The one place validation touches private PyTorch APIs, behind a version check.

``dayzero memory --exact`` needs three things PyTorch has only under private names so far:
the ``fake`` process group's store (``torch.testing._internal.distributed.fake_pg``), the FSDP2
memory tracker (``torch.distributed._tools.fsdp2_mem_tracker``) and its running snapshot. They
exist from torch 2.5 on; the floor is :mod:`dayzero.torch_version`.
"""

from __future__ import annotations

def fake_store():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    return FakeStore()


def category_tracker(module, optimizer, categorize):
    """An FSDPMemTracker that also keeps, for every op, ``categorize(current snapshot)`` and the
    largest value each of its keys reached (``tracker.maxima``)."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    class _Tracker(FSDPMemTracker):
        def __init__(self, mod, optm):
            super().__init__(mod, optm)
            self.maxima: dict = {}

        def observe(self) -> None:
            for snap in self._curr_mem_snap.values():
                for k, v in categorize(snap).items():
                    if v > self.maxima.get(k, 0):
                        self.maxima[k] = v

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            res = super().__torch_dispatch__(func, types, args, kwargs)
            if res is not NotImplemented:
                self.observe()
            return res

    return _Tracker(module, optimizer)


def ref_types():
    from torch.distributed._tools.fsdp2_mem_tracker import _FSDPRefType

    return _FSDPRefType
