"""Property tests (hypothesis, derandomized): sharding never adds memory to the sharded categories,
bigger micro-batches or sequences never remove memory, and the vectorised path equals the scalar one."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dayzero.planner.memory.memory import estimate_memory, peak_memory_batch
from dayzero.specs import layout_rules
from dayzero.specs.grid import encode
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model

MODELS = {name: load_model(name) for name in ("tiny-llama", "tiny-moe", "llama-3.1-8b", "deepseek-v3", "gpt3-175b",
                                              "mixtral-8x7b")}
CAP = 80 * 10**9
SETTINGS = settings(derandomize=True, max_examples=80, deadline=None,
                    suppress_health_check=[HealthCheck.filter_too_much])
SHARDED = ("weights", "gradients", "optimizer")
POW2 = st.sampled_from([1, 2, 4, 8])


@st.composite
def layouts(draw):
    name = draw(st.sampled_from(sorted(MODELS)))
    spec = MODELS[name]
    moe = spec.moe is not None
    tp, pp, dp, cp = draw(POW2), draw(st.sampled_from([1, 2, 4])), draw(POW2), draw(st.sampled_from([1, 2]))
    ep = draw(POW2) if moe else 1
    etp = draw(st.sampled_from([e for e in (1, 2) if e <= tp])) if moe else 1
    vpp = draw(st.sampled_from([1, 2])) if pp > 1 else 1
    mbs = draw(st.sampled_from([1, 2]))
    m = pp * draw(st.sampled_from([1, 2, 4]))
    p = ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vpp=vpp, mbs=mbs, gbs=m * mbs * dp,
                       seq=draw(st.sampled_from([512, 2048, 4096])), zero=draw(st.integers(0, 3)),
                       recompute=draw(st.sampled_from(["none", "selective", "full"])),
                       sequence_parallel=draw(st.booleans()) and tp > 1,
                       precision=draw(st.sampled_from(["bf16", "fp8", "fp4"])),
                       schedule=draw(st.sampled_from(["1f1b", "gpipe"])) if vpp == 1 else "interleaved")
    assume(not layout_rules.problems(p, spec))
    return spec, p


def _max_by_category(spec, p) -> dict[str, int]:
    rep = estimate_memory(spec, p, CAP)
    return {c: max(getattr(s, c) for s in rep.stages) for c in SHARDED}


def _valid(spec, p) -> bool:
    return not layout_rules.problems(p, spec)


@SETTINGS
@given(layouts(), st.sampled_from(["tp", "pp", "dp", "cp", "ep", "etp"]))
def test_growing_a_sharding_degree_never_increases_sharded_memory(case, degree):
    spec, p = case
    bigger = p.with_(**{degree: getattr(p, degree) * 2})
    if degree == "dp":
        bigger = bigger.with_(gbs=p.gbs * 2)  # keep the micro-batch count
    assume(_valid(spec, bigger))
    before, after = _max_by_category(spec, p), _max_by_category(spec, bigger)
    for c in SHARDED:
        assert after[c] <= before[c] + 2, (degree, c, before[c], after[c])


@SETTINGS
@given(layouts(), st.sampled_from(["mbs", "seq", "mbs_fixed_gbs"]))
def test_growing_mbs_or_seq_never_decreases_memory(case, what):
    spec, p = case
    if what == "seq":
        bigger = p.with_(seq=p.seq * 2)
    elif what == "mbs":
        bigger = p.with_(mbs=p.mbs * 2, gbs=p.gbs * 2)  # same number of micro-batches
    else:
        bigger = p.with_(mbs=p.mbs * 2)  # same global batch: half the micro-batches
    assume(_valid(spec, bigger))
    a, b = estimate_memory(spec, p, CAP), estimate_memory(spec, bigger, CAP)
    assert b.peak_bytes >= a.peak_bytes - 2
    for s0, s1 in zip(a.stages, b.stages):
        assert s1.activations >= s0.activations - 2 and s1.temporary >= s0.temporary - 2


@SETTINGS
@given(st.lists(layouts(), min_size=1, max_size=6))
def test_vectorised_peak_equals_estimate_memory(cases):
    by_model: dict[str, list[ParallelConfig]] = {}
    for spec, p in cases:
        by_model.setdefault(spec.name, []).append(p)
    for name, ps in by_model.items():
        spec = MODELS[name]
        grid = encode(ps)
        want = [estimate_memory(spec, p, CAP).peak_bytes for p in ps]
        np.testing.assert_allclose(peak_memory_batch(spec, grid, CAP), want, rtol=1e-12, atol=8)
