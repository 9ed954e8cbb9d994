"""The in-flight async save of a :class:`~dayzero.runtime.checkpoint.checkpointer.Checkpointer`.

Two stages: staging copies the state into reused CPU buffers (:class:`CachedStager`, on a thread
while the next forward/backward runs; the next ``optimizer.step()`` of a saved optimizer waits for
it through a pre-step hook), then writing, hashing and the commit run on a thread of their own.
One save is in flight at a time: the next one waits for it.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

from dayzero.runtime.checkpoint.dcp_io import CachedStager, dcp_errors


class AsyncSaves:
    def __init__(self, overlap_staging: bool = True):
        self.stager = CachedStager(background=overlap_staging)
        self._staging: Future | None = None
        self._pending: Future | None = None
        self._hooks: dict[int, Any] = {}
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="dayzero-ckpt")

    def guard(self, optimizer) -> None:
        """With background staging, an optimizer step must wait until the state is copied out."""
        if optimizer is None:
            return
        for opt in optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]:
            if id(opt) not in self._hooks:
                self._hooks[id(opt)] = opt.register_step_pre_hook(self._staged_hook)

    def started(self, resp, finish: Callable[[Future], Any]) -> None:
        """``resp``: what ``dcp.async_save`` returned; ``finish(upload)`` runs on the thread once
        staging is under way (it waits for the upload, then commits)."""
        upload, self._staging = (resp.upload_completion, resp.staging_completion) \
            if isinstance(resp, AsyncSaveResponse) else (resp, None)
        self._pending = self._executor.submit(finish, upload)

    def staged(self) -> float:
        """Block until the in-flight save's state has been copied out (seconds waited)."""
        fut, self._staging = self._staging, None
        if fut is None:
            return 0.0
        t0 = time.perf_counter()
        with dcp_errors("staging a checkpoint"):
            fut.result()
        return time.perf_counter() - t0

    def in_flight(self) -> bool:
        """Whether a save is still being written or committed (any thread may ask)."""
        fut = self._pending
        return fut is not None and not fut.done()

    def wait(self) -> Any:
        """Block until the in-flight save is committed and return its result (None when there is
        none); re-raise its failure."""
        self.staged()
        fut, self._pending = self._pending, None
        return None if fut is None else fut.result()

    def close(self, wait: bool) -> None:
        """Remove the optimizer hooks and stop the threads (``wait``: let them finish)."""
        for h in self._hooks.values():
            h.remove()
        self._hooks.clear()
        if wait:
            self.stager.close()
        self._executor.shutdown(wait=wait, cancel_futures=not wait)

    def _staged_hook(self, *_args) -> None:
        self.staged()
