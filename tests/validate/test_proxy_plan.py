"""The proxy sizing rule of dayzero day0 --validate: ranks from the host's cores, the plan's
degrees cut by greatest common divisor so they always fit the ranks."""

import math

from hypothesis import given
from hypothesis import strategies as st

from dayzero.validate.proxy_plan import MAX_RANKS, default_ranks, proxy_parallel


def test_ranks_are_the_cores_at_most_four():
    assert [default_ranks(c) for c in (1, 2, 3, 4, 16)] == [1, 2, 3, 4, MAX_RANKS]


def test_a_big_plan_keeps_tensor_parallelism_first():
    p = {"tp": 8, "pp": 16, "cp": 1, "vpp": 3, "schedule": "interleaved", "mbs": 2, "ep": 1, "etp": 1}
    assert {k: proxy_parallel(p, 2)[k] for k in ("tp", "pp", "dp", "vpp", "schedule")} == {
        "tp": 2, "pp": 1, "dp": 1, "vpp": 1, "schedule": "1f1b"}
    four = proxy_parallel(p, 4)
    assert (four["tp"], four["pp"], four["dp"], four["vpp"], four["schedule"]) == (4, 1, 1, 1, "1f1b")
    assert proxy_parallel({"tp": 2, "pp": 8, "vpp": 2, "schedule": "interleaved"}, 4)["pp"] == 2
    assert proxy_parallel({"tp": 1, "pp": 1, "dp": 512}, 3)["dp"] == 3


def test_experts_fit_the_proxy_data_parallel_ranks():
    out = proxy_parallel({"tp": 1, "pp": 1, "ep": 8, "etp": 2}, 4)
    assert (out["dp"], out["ep"], out["etp"]) == (4, 4, 1)


@given(st.integers(1, 64), st.integers(1, 64), st.integers(1, 8), st.integers(1, 64), st.integers(1, 4))
def test_degrees_always_divide_the_ranks(tp, pp, cp, ep, nproc):
    out = proxy_parallel({"tp": tp, "pp": pp, "cp": cp, "ep": ep}, nproc)
    assert out["tp"] * out["pp"] * out["cp"] * out["dp"] == nproc
    assert tp % out["tp"] == 0 and pp % out["pp"] == 0 and cp % out["cp"] == 0
    assert (out["dp"] * out["cp"]) % out["ep"] == 0 and math.gcd(ep, out["ep"]) == out["ep"]


def test_a_derived_models_proxy_runs_what_transformers_modules_can():
    from dayzero.validate.proxy_plan import derived_parallel

    p = {"tp": 1, "pp": 1, "cp": 2, "dp": 2, "recompute": "selective", "recompute_modules": ["core_attn"],
         "cp_comm": "a2a"}
    out, changed = derived_parallel(p, derived=True)
    assert out["recompute"] == "full" and out["recompute_modules"] == [] and out["cp"] == 2 and out["dp"] == 2
    assert len(changed) == 1 and "selective" in changed[0]  # cp runs (runtime.parallel.hf_context)
    assert derived_parallel(p, derived=False) == (p, [])
