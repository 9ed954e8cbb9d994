"""Plans one per family, with the runner-ups' delta, and the constraint that binds the best."""

from dayzero.planner.search.explain import binding, family
from dayzero.planner.search.search import best_of_families
from dayzero.specs.parallel import ParallelConfig as P


def _pred(step, compute, comm, bubble, opt, util):
    return {"time": {"step_s": step, "compute_s": compute, "comm_exposed_s": comm, "bubble_s": bubble,
                     "optimizer_s": opt}, "memory": {"utilization": util}}


def test_binding_is_memory_at_the_limit_else_the_largest_loss():
    assert binding(_pred(10, 8, 1, 0.5, 0.5, 0.84), 0.85)["constraint"] == "memory"  # 0.84 >= 0.95 x 0.85
    b = binding(_pred(10, 7, 1, 2, 0, 0.5), 0.85)
    assert b["constraint"] == "pipeline bubble" and abs(b["share"] - 0.2) < 1e-12 and "20.0%" in b["detail"]
    assert binding(_pred(10, 9.95, 0.05, 0, 0, 0.3), 0.85)["constraint"] == "compute"


def test_families_ignore_cp_mbs_and_dp_but_not_the_choices_that_change_the_run():
    a = P(tp=8, pp=4, dp=4, zero=1, recompute="full")
    assert family(a) == family(P(tp=8, pp=4, dp=2, cp=2, mbs=4, zero=1, recompute="full")) == "tp8 pp4 zero1 full"
    assert family(a) != family(a.with_(zero=3)) and family(P(ep=4, dp=4)) == "tp1 pp1 ep4 zero1 none"


def test_one_plan_per_family_then_the_next_best_fill_in():
    same = [P(tp=2, dp=4), P(tp=2, dp=2, cp=2), P(tp=4, dp=2), P(tp=2, dp=1, cp=4)]
    assert best_of_families(same, 2) == [0, 2]
    assert best_of_families(same, 3) == [0, 1, 2]  # two families only: the best leftover fills in


def test_the_default_plan_lists_distinct_families_with_their_delta():
    from dayzero.planner.search.search import plan
    from dayzero.specs.cluster import build_cluster
    from dayzero.specs.registry import load_model

    obj = plan(load_model("llama-3.1-8b"), build_cluster("h100", 64, 8), 256, 4096, top_k=4)
    fams = [p["family"] for p in obj["plans"]]
    assert len(set(fams)) == len(fams) == 4
    assert obj["plans"][0]["vs_best"] == 0 and all(p["vs_best"] >= 0 for p in obj["plans"])
    assert obj["plans"][0]["binding"]["constraint"] in ("memory", "exposed communication", "pipeline bubble",
                                                         "optimizer step", "compute")
