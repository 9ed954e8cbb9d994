"""A caching block allocator ("data-block" memory pool), modelled on PyTorch's CUDA caching allocator
(c10/cuda/CUDACachingAllocator.cpp; torch_npu's NPUCachingAllocator uses the same constants):

- every request is rounded up to a multiple of 512 B;
- requests <= 1 MiB come from the small pool, carved out of 2 MiB segments; larger ones from the
  large pool: requests under 10 MiB get a 20 MiB segment, bigger ones a segment rounded up to 2 MiB;
- a request takes the smallest cached free block that fits (best fit, one stream); the block is
  split when the remainder is >= 512 B (small pool) or > 1 MiB (large pool);
- a freed block merges with free neighbours of the same segment and stays cached (reserved);
- when a new segment would exceed the device capacity, fully free segments are released first
  (``empty_cache``), then the request fails (an OOM).

With ``expandable=True`` it follows ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``
(pytorch/pytorch#96995, "Expandable blocks in allocator": on the cuMemMap virtual-memory API "it
adds the ability to expand the last block in a segment when more memory is needed"): each pool
is one segment in a large virtual range that grows at its end in pages of 2 MiB (small pool) or
20 MiB (large pool), the segment sizes above (CUDACachingAllocator.cpp, ExpandableSegment's
``segment_size``). A request that no free block holds extends a free tail block, or maps new
pages after an allocated one; ``empty_cache`` unmaps the free tail. What is left is the holes
between live blocks, which the next request of their size reuses.

Reserved minus allocated is what fragmentation and caching cost; this module measures it for an
allocation sequence, it does not guess it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20  # largest "small" request, 1 MiB
SMALL_BUFFER = 2 << 20  # small-pool segment, 2 MiB
LARGE_BUFFER = 20 << 20  # segment for 1-10 MiB requests, 20 MiB
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


def round_size(nbytes: int) -> int:
    return MIN_BLOCK if nbytes < MIN_BLOCK else MIN_BLOCK * -(-nbytes // MIN_BLOCK)


def segment_size(rounded: int) -> int:
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * -(-rounded // ROUND_LARGE)


class AllocatorOOM(Exception):
    def __init__(self, requested: int, reserved: int, capacity: int):
        super().__init__(f"cannot reserve {requested} more bytes: {reserved} reserved of {capacity}")
        self.requested, self.reserved, self.capacity = requested, reserved, capacity


@dataclass(eq=False)
class Block:
    segment: int
    offset: int
    size: int
    small: bool
    allocated: bool = False
    requested: int = 0
    prev: "Block | None" = None
    next: "Block | None" = None

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.size, self.segment, self.offset)


@dataclass
class _Pool:
    keys: list = field(default_factory=list)  # sorted (size, segment, offset) of free blocks
    blocks: dict = field(default_factory=dict)

    def add(self, b: Block) -> None:
        bisect.insort(self.keys, b.key)
        self.blocks[b.key] = b

    def remove(self, b: Block) -> None:
        i = bisect.bisect_left(self.keys, b.key)
        del self.keys[i]
        del self.blocks[b.key]

    def best_fit(self, size: int) -> Block | None:
        i = bisect.bisect_left(self.keys, (size, -1, -1))
        if i == len(self.keys):
            return None
        b = self.blocks[self.keys[i]]
        self.remove(b)
        return b


class CachingAllocator:
    """Replays malloc/free; tracks allocated (block bytes in use), requested and reserved bytes."""

    def __init__(self, capacity: int | None = None, expandable: bool = False):
        self.capacity = capacity
        self.expandable = expandable
        self._grown: dict[bool, int] = {}  # expandable: pool (small?) -> its one segment id
        self._last: dict[int, Block] = {}  # expandable: segment id -> the block at its end
        self.small, self.large = _Pool(), _Pool()
        self.segments: dict[int, int] = {}  # segment id -> size
        self._next_segment = 0
        self.allocated = self.requested = self.reserved = 0
        self.peak_allocated = self.peak_requested = self.peak_reserved = 0
        self.allocated_at_peak_reserved = 0
        self.segments_created = self.segments_released = 0

    def _pool(self, small: bool) -> _Pool:
        return self.small if small else self.large

    def malloc(self, nbytes: int) -> Block:
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self._pool(small)
        block = pool.best_fit(size)
        if block is None:
            block = self._grow(size, small) if self.expandable else self._new_segment(size, small)
        remaining = block.size - size
        if (remaining >= MIN_BLOCK) if small else (remaining > SMALL_SIZE):
            rest = Block(block.segment, block.offset + size, remaining, small, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            pool.add(rest)
            if self._last.get(block.segment) is block:
                self._last[block.segment] = rest
        block.allocated, block.requested = True, nbytes
        self.allocated += block.size
        self.requested += nbytes
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_requested = max(self.peak_requested, self.requested)
        return block

    def free(self, block: Block) -> None:
        assert block.allocated, "double free"
        self.allocated -= block.size
        self.requested -= block.requested
        block.allocated, block.requested = False, 0
        pool = self._pool(block.small)
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                pool.remove(neighbour)
                if neighbour is block.prev:  # absorb prev: block starts where prev started
                    block.offset, block.prev = neighbour.offset, neighbour.prev
                    if neighbour.prev is not None:
                        neighbour.prev.next = block
                else:
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
                    if self._last.get(block.segment) is neighbour:
                        self._last[block.segment] = block
                block.size += neighbour.size
        pool.add(block)

    def _reserve(self, nbytes: int, request: int) -> None:
        """Count ``nbytes`` more reserved for a request of ``request`` bytes (releasing cached
        memory first, and failing, at capacity)."""
        if self.capacity is not None and self.reserved + nbytes > self.capacity:
            self.empty_cache()
            if self.reserved + nbytes > self.capacity:
                raise AllocatorOOM(nbytes, self.reserved, self.capacity)
        self.reserved += nbytes
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved
            self.allocated_at_peak_reserved = self.allocated + request

    def _grow(self, size: int, small: bool) -> Block:
        """Expandable segments: map pages at the end of the pool's one segment for ``size`` bytes,
        extending its tail block when that is free."""
        page = SMALL_BUFFER if small else LARGE_BUFFER

        def plan():
            sid = self._grown.get(small)
            tail = self._last.get(sid) if sid is not None else None
            free_tail = tail is not None and not tail.allocated
            return sid, tail, free_tail, page * -(-(size - (tail.size if free_tail else 0)) // page)

        sid, tail, free_tail, grow = plan()
        if self.capacity is not None and self.reserved + grow > self.capacity:
            self.empty_cache()  # may unmap the free tail: plan again from what is left
            sid, tail, free_tail, grow = plan()
        self._reserve(grow, size)
        if sid is None:
            sid = self._grown[small] = self._next_segment
            self._next_segment += 1
            self.segments[sid] = 0
            self.segments_created += 1
        if free_tail:
            self._pool(small).remove(tail)
            tail.size += grow
            block = tail
        else:
            block = Block(sid, self.segments[sid], grow, small, prev=tail)
            if tail is not None:
                tail.next = block
            self._last[sid] = block
        self.segments[sid] += grow
        return block

    def _new_segment(self, size: int, small: bool) -> Block:
        seg = segment_size(size)
        self._reserve(seg, size)
        sid = self._next_segment
        self._next_segment += 1
        self.segments[sid] = seg
        self.segments_created += 1
        return Block(sid, 0, seg, small)

    def empty_cache(self) -> int:
        """Release every fully free segment (expandable: unmap each segment's free tail); returns
        the bytes released."""
        released = 0
        for small, sid in list(self._grown.items()):
            tail = self._last.get(sid)
            if tail is None or tail.allocated:
                continue
            self._pool(small).remove(tail)
            released += tail.size
            self.segments[sid] -= tail.size
            if tail.prev is None:  # the whole segment was free
                del self._grown[small], self._last[sid], self.segments[sid]
                self.segments_released += 1
            else:
                tail.prev.next = None
                self._last[sid] = tail.prev
        for pool in (self.small, self.large):
            for key in [k for k, b in pool.blocks.items() if b.prev is None and b.next is None]:
                b = pool.blocks[key]
                pool.remove(b)
                released += self.segments.pop(b.segment)
                self.segments_released += 1
        self.reserved -= released
        return released

    @property
    def fragmentation(self) -> float:
        """Share of the peak reservation never handed out at that moment: 1 - allocated/reserved."""
        return 1 - self.allocated_at_peak_reserved / self.peak_reserved if self.peak_reserved else 0.0
