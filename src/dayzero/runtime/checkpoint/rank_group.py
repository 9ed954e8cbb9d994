"""The checkpoint's own process group: this rank, the world, and the object collectives a save,
a verification or a load uses (a no-op in one process).

Async saves run DCP's collectives on a background thread; a gloo group of their own keeps them
from interleaving with the training loop's collectives.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist


class RankGroup:
    def __init__(self):
        if dist.is_available() and dist.is_initialized():
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
            self.pg = dist.new_group(backend="gloo")
        else:
            self.rank, self.world, self.pg = 0, 1, None

    def gather(self, obj: Any) -> list:
        """Every rank's ``obj`` on rank 0 (an empty list elsewhere)."""
        if self.pg is None:
            return [obj]
        out = [None] * self.world if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=self.pg)
        return out or []

    def all_gather(self, obj: Any) -> list:
        if self.pg is None:
            return [obj]
        out: list = [None] * self.world
        dist.all_gather_object(out, obj, group=self.pg)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if self.pg is None:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.pg)
        return box[0]
