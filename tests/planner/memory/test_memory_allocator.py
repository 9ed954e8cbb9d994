"""The caching block allocator (PyTorch's rules) and the one-step replay built on the memory model."""

from __future__ import annotations

import pytest

from dayzero.planner.memory.allocator import AllocatorOOM, CachingAllocator, round_size, segment_size
from dayzero.planner.memory.memory import estimate_memory
from dayzero.planner.memory.replay import plot_timeline, simulate_step
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model

MiB = 2**20


def test_rounding_and_segment_sizes():
    assert round_size(1) == 512 and round_size(513) == 1024 and round_size(4096) == 4096
    assert segment_size(512) == 2 * MiB and segment_size(MiB) == 2 * MiB
    assert segment_size(MiB + 512) == 20 * MiB and segment_size(10 * MiB - 512) == 20 * MiB
    assert segment_size(10 * MiB) == 10 * MiB and segment_size(11 * MiB + 1) == 12 * MiB


def test_small_requests_share_a_2mib_segment():
    a = CachingAllocator()
    blocks = [a.malloc(1000) for _ in range(8)]
    assert a.reserved == 2 * MiB and a.allocated == 8 * 1024 and a.requested == 8000
    for b in blocks:
        a.free(b)
    assert a.allocated == 0 and a.reserved == 2 * MiB  # cached, not returned
    assert a.empty_cache() == 2 * MiB and a.reserved == 0


def test_best_fit_reuse_and_splitting():
    a = CachingAllocator()
    big = a.malloc(12 * MiB)
    assert a.reserved == 12 * MiB
    a.free(big)
    half = a.malloc(6 * MiB)  # reuses the cached 12 MiB block, splits off 6 MiB (> 1 MiB remains)
    assert a.reserved == 12 * MiB and half.size == 6 * MiB
    other = a.malloc(6 * MiB - 4096)  # fits the split remainder; 4 KiB left is not split (<= 1 MiB)
    assert a.reserved == 12 * MiB and other.size == 6 * MiB
    a.free(half)
    a.free(other)
    assert len(a.large.keys) == 1 and a.large.keys[0][0] == 12 * MiB  # merged back into one block


def test_mid_size_requests_get_a_20mib_segment_and_pack():
    a = CachingAllocator()
    for _ in range(3):
        a.malloc(5 * MiB)
    assert a.reserved == 20 * MiB and a.allocated == 15 * MiB and a.segments_created == 1


def test_fragmentation_when_a_freed_hole_is_too_small():
    a = CachingAllocator()
    first, second = a.malloc(100 * MiB), a.malloc(100 * MiB)
    a.free(first)
    third = a.malloc(150 * MiB)  # the 100 MiB hole cannot hold it: a new segment
    assert a.reserved == 350 * MiB and a.allocated == 250 * MiB
    assert a.fragmentation == pytest.approx(1 - 250 / 350)
    assert third.segment != first.segment and second.allocated


def test_capacity_releases_cached_segments_then_fails():
    a = CachingAllocator(capacity=100 * MiB)
    b = a.malloc(60 * MiB)
    a.free(b)
    c = a.malloc(80 * MiB)  # 60 + 80 > 100: the free 60 MiB segment is released first
    assert a.reserved == 80 * MiB and a.segments_released == 1 and c.allocated
    with pytest.raises(AllocatorOOM):
        a.malloc(30 * MiB)


LAYOUTS = [
    ("dense-3t", ParallelConfig(tp=8, pp=16, dp=64, zero=3, recompute="full")),
    ("dense-3t", ParallelConfig(tp=8, pp=16, dp=64, zero=1, recompute="selective", sequence_parallel=True,
                                gbs=64 * 32)),
    ("llama-3.1-8b", ParallelConfig(tp=2, pp=2, dp=2, gbs=16, zero=2, schedule="gpipe")),
    ("deepseek-v3", ParallelConfig(tp=2, pp=4, dp=8, ep=8, cp=2, gbs=64, layer_split=(16, 15, 15, 15), zero=1,
                                   sequence_parallel=True, recompute="full")),
    ("tiny-moe", ParallelConfig(tp=2, pp=2, dp=2, ep=2, vpp=2, layer_split=(1, 1, 1, 1), gbs=8,
                                sequence_parallel=True)),
]


@pytest.mark.parametrize("model,layout", LAYOUTS)
def test_replay_peak_lies_between_held_state_and_the_analytic_total(model, layout):
    """The replay reaches every byte the model says is held (states + in-flight activations) and never
    more than the analytic allocated total, whose temporaries assume everything transient coexists."""
    spec = load_model(model)
    sim = simulate_step(spec, layout, 10**15)
    st = estimate_memory(spec, layout, 10**15).stages[sim.rank]
    held = st.weights + st.gradients + st.optimizer + st.activations
    assert held * (1 - 1e-9) <= sim.peak_requested <= sim.analytic_allocated * (1 + 1e-9)
    assert sim.peak_allocated >= sim.peak_requested and sim.peak_reserved >= sim.peak_allocated
    assert 0 <= sim.fragmentation < 1 and sim.oom_at is None


def test_replay_reports_oom_against_a_small_device(tmp_path):
    spec = load_model("llama-3.1-8b")
    sim = simulate_step(spec, ParallelConfig(dp=8, gbs=8, zero=0), 16 * 10**9, record_timeline=True)
    assert sim.oom_at is not None  # 8B params x 18 B does not fit 16 GB
    out = tmp_path / "timeline.png"
    plot_timeline(sim, str(out))
    assert out.stat().st_size > 10_000 and out.read_bytes()[:4] == b"\x89PNG"


def test_replay_dispatch_buffer_is_as_wide_as_the_memory_model_says_for_latent_moe():
    """LatentMoE (Nemotron 3 Super, MoESpec.latent_size) dispatches latent-wide rows: the replay's
    all-to-all buffer is 2 x routed rows x latent x 2 B, the memory model's ``temporary:ep_a2a``
    (one rule, ``activations.expert_widths``), not hidden-wide rows."""
    import dataclasses

    from dayzero.planner.memory import replay
    from dayzero.planner.memory.memory_options import MemoryOptions

    base = load_model("tiny-moe")
    spec = dataclasses.replace(base, moe=dataclasses.replace(base.moe, latent_size=base.hidden // 4))
    p = ParallelConfig(ep=2, dp=2, gbs=4, seq=64)
    want = 2 * 2 * 64 * spec.moe.top_k * spec.moe.latent_size  # mbs 1, tp 1: 64 x top_k routed rows
    assert estimate_memory(spec, p, 10**15).stages[0].terms["temporary:ep_a2a"] == want
    tr = replay._Tracker(None, False)
    sizes = {}
    new = tr.new
    tr.new = lambda key, nbytes, cat: (sizes.setdefault(key[0], float(nbytes)), new(key, nbytes, cat))
    moe_layer = spec.layer_types.index("moe")
    replay._StepReplay(spec, p, MemoryOptions(), 0, tr).transients(moe_layer)
    assert sizes["a2a"] == want


def test_expandable_segments_grow_in_place_where_the_caching_allocator_needs_a_new_segment():
    """The hole case above under expandable segments (pytorch/pytorch#96995: the last block of a
    segment expands; large-pool pages of 20 MiB): 100 + 100 MiB map 200 MiB (10 pages); the first
    100 MiB is freed; 150 MiB does not fit that hole and the tail is allocated, so 8 pages (160 MiB)
    are mapped after it: 360 MiB reserved against the caching allocator's 350 MiB here, but then
    freeing the second block merges both into one free 200 MiB run that a 180 MiB request reuses
    with no new page, where the caching allocator's 100 MiB segments could not hold it."""
    a = CachingAllocator(expandable=True)
    first, second = a.malloc(100 * MiB), a.malloc(100 * MiB)
    assert a.reserved == 200 * MiB and a.segments_created == 1
    a.free(first)
    third = a.malloc(150 * MiB)
    assert a.reserved == 360 * MiB and third.offset == 200 * MiB and a.segments_created == 1
    a.free(second)
    a.malloc(180 * MiB)
    assert a.reserved == 360 * MiB
    b = CachingAllocator()
    f, s = b.malloc(100 * MiB), b.malloc(100 * MiB)
    b.free(f)
    b.malloc(150 * MiB)
    b.free(s)
    b.malloc(180 * MiB)
    assert b.reserved == 530 * MiB  # 100 + 100 + 150 + a fourth segment of 180 MiB


def test_expandable_segments_extend_a_free_tail_and_unmap_it_on_empty_cache():
    """A free tail block grows by the shortfall only: 30 MiB then freed, 50 MiB maps 20 MiB more
    (one 20 MiB page over the 40 MiB already mapped for the first request: 30 rounds up to 40)."""
    a = CachingAllocator(expandable=True)
    x = a.malloc(30 * MiB)
    assert a.reserved == 40 * MiB
    a.free(x)
    y = a.malloc(50 * MiB)
    assert a.reserved == 60 * MiB and y.offset == 0
    a.free(y)
    assert a.empty_cache() == 60 * MiB and a.reserved == 0
    assert a.malloc(MiB + 512).allocated and a.reserved == 20 * MiB
