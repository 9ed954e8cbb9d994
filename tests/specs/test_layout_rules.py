"""One layout encoding, one rule table: ParallelConfig <-> grid round-trips, problems() and the
search's mask agree layout by layout, the search enumerates exactly the valid layouts, and the
CLI's JSON is pinned by golden files."""

from __future__ import annotations

import itertools
import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dayzero.cli.app import main
from dayzero.errors import LayoutError
from dayzero.planner.predict import with_even_split
from dayzero.planner.search.search import VARIANT_COLUMNS, SearchSpace, enumerate_layouts, search, space_mask
from dayzero.specs import layout_rules
from dayzero.specs.cluster import build_cluster
from dayzero.specs.grid import FIELDS, RANK_ORDERS, columns, decode, encode
from dayzero.specs.layout_rules import DEGREES, mask
from dayzero.specs.parallel import PRECISIONS, RECOMPUTES, SCHEDULES, ParallelConfig
from dayzero.specs.registry import load_model
from helpers.paths import DATA

MIXTRAL = load_model("mixtral-8x7b")  # 32 layers, 32 heads, 8 KV heads, 8 experts
LLAMA = load_model("llama-3.1-8b")
SETTINGS = settings(derandomize=True, max_examples=60, deadline=None)
GOLDEN = DATA / "golden"


def valid_everywhere(spec, p: ParallelConfig, devices: int | None) -> bool:
    """What a grid row means: the layout with the near-even layer split (as plan() predicts it)."""
    if layout_rules.problems(p):
        return False
    return not layout_rules.problems(with_even_split(spec, p), spec, devices)


# -- the drifted rule --------------------------------------------------------------------------------

def test_etp_must_divide_tp_in_problems_and_in_the_search():
    p = ParallelConfig(tp=4, etp=3, dp=3)
    assert layout_rules.problems(p) == [
        "etp 3 must divide tp 4 (each expert's tensor-parallel group lies inside a tp group)"]
    assert not mask(encode([p]))[0]
    assert mask(encode([p.with_(etp=2)]))[0] and mask(encode([p.with_(etp=1)]))[0]
    # the search never builds it: with tp 4 and etp 3 every layout is indivisible, and the error says
    # so for all 104 (ep 2 options x zero 4 x recompute levels 13: none, selective with each of the 11
    # distinct sets of core_attn, moe_act, layernorm, moe on this MoE model (moe + moe_act drops what
    # moe drops), full)
    space = SearchSpace(tp=(4,), etp=(3,), ep=(1, 2), pp=(1,), cp=(1,), vpp=(1,), mbs=(1,))
    assert len(space.levels(MIXTRAL)) == 13
    with pytest.raises(LayoutError, match=r"104 rejected: etp 3 must divide tp 4 \(each"):
        enumerate_layouts(MIXTRAL, 12, 24, 4096, space)


# -- the encoding ------------------------------------------------------------------------------------

@st.composite
def any_layout(draw):
    """Degrees from invalid (0, -1) to large, every name, every rank order."""
    deg = lambda hi: draw(st.integers(0, hi))  # noqa: E731
    p = ParallelConfig(tp=deg(8), pp=deg(6), dp=draw(st.integers(-1, 8)), cp=deg(4), ep=deg(8), etp=deg(4),
                       vpp=deg(4), mbs=deg(3), gbs=draw(st.integers(-2, 96)),
                       seq=draw(st.sampled_from([0, 1024, 4095, 4096, 8192])), zero=draw(st.integers(-1, 4)),
                       recompute=draw(st.sampled_from(RECOMPUTES)), schedule=draw(st.sampled_from(SCHEDULES)),
                       precision=draw(st.sampled_from(PRECISIONS)), sequence_parallel=draw(st.booleans()),
                       rank_order=draw(st.sampled_from(RANK_ORDERS)),
                       recompute_layers=draw(st.one_of(st.none(), st.integers(1, 8))))  # None codes as 0
    return p


@SETTINGS
@given(st.lists(any_layout(), min_size=1, max_size=40))
def test_grid_round_trips_parallel_config(layouts):
    g = encode(layouts)
    assert set(g) == set(FIELDS) and all(v.dtype == np.int64 and len(v) == len(layouts) for v in g.values())
    assert decode(g) == layouts
    assert [columns(p) for p in layouts] == [{k: int(g[k][i]) for k in FIELDS} for i in range(len(layouts))]


@SETTINGS
@given(st.lists(any_layout(), min_size=1, max_size=50), st.sampled_from(["mixtral-8x7b", "llama-3.1-8b",
                                                                         "deepseek-v3"]),
       st.sampled_from([None, 16, 24, 64]))
def test_problems_and_the_vectorised_mask_agree_on_every_layout(layouts, model, devices):
    spec = load_model(model)
    got = mask(encode(layouts), spec, devices)
    assert got.tolist() == [valid_everywhere(spec, p, devices) for p in layouts]
    # without a model or devices, only the layout's own rules
    assert mask(encode(layouts)).tolist() == [not layout_rules.problems(p) for p in layouts]


def test_names_outside_their_tables_are_reported_not_encoded():
    p = ParallelConfig(recompute="most", precision="fp16", schedule="zb", rank_order="tp-dp-pp")
    assert layout_rules.problems(p) == ["recompute must be none|selective|full, got 'most'",
                            "schedule must be 1f1b|interleaved|gpipe|dualpipe|dualpipev, got 'zb'",
                            "precision must be bf16|fp8|fp4, got 'fp16'",
                            "rank order 'tp-dp-pp' must name each of tp, cp, dp, pp exactly once, fastest first "
                            "(e.g. tp-cp-dp-pp)"]
    with pytest.raises(LayoutError, match="recompute 'most'"):
        encode([p])
    assert columns(p)["precision"] == -1


def test_degrees_below_one_are_the_only_messages():
    assert layout_rules.problems(ParallelConfig(tp=0, gbs=-4)) == ["tp must be >= 1, got 0", "gbs must be >= 1, got -4"]
    assert set(DEGREES) <= set(FIELDS)


def test_rank_order_is_part_of_the_layout():
    p = ParallelConfig(tp=2, dp=4, rank_order=" DP-cp-TP-pp")
    assert p.rank_order == "dp-cp-tp-pp" and not layout_rules.problems(p)
    assert ParallelConfig.from_dict(p.to_dict()) == p
    assert layout_rules.problems(ParallelConfig(rank_order="dp-tp-cp-pp")) == [
        "rank order 'dp-tp-cp-pp': cp and dp must be adjacent (gradients are reduced over dp x cp)"]


# -- the search enumerates exactly the valid layouts ---------------------------------------------------

def test_search_bases_are_exactly_the_layouts_problems_accepts():
    devices, gbs, seq = 24, 48, 4096
    space = SearchSpace(tp=(1, 2, 3, 4, 8), pp=(1, 2, 3, 4, 6), cp=(1, 2, 3), ep=(1, 2, 3, 4, 8), etp=(1, 2, 3, 4),
                        vpp=(1, 2, 3), mbs=(1, 2, 3), zero=(0, 1), recompute=("none", "full"),
                        sequence_parallel=(False, True), rank_order=("tp-cp-dp-pp", "cp-dp-tp-pp"))
    bases, considered, indivisible, variants = enumerate_layouts(MIXTRAL, devices, gbs, seq, space)
    got = {tuple(int(bases[k][i]) for k in FIELDS if k not in VARIANT_COLUMNS) for i in range(len(bases["tp"]))}
    want, n = set(), 0
    for tp, pp, cp, ep, etp, vpp, mbs, sp, order in itertools.product(
            space.tp, space.pp, space.cp, space.ep, space.etp, space.vpp, space.mbs, space.sequence_parallel,
            space.rank_order):
        if tp == 1 and sp:  # a tp = 1 layout is one layout, without sequence parallelism
            continue
        # each vpp's default schedule, and DualPipeV beside every two-chunk layout whose dims before
        # vpp pass the rules that read only them (search.searched_schedules)
        prefix = {k: v for k, v in encode([ParallelConfig(tp=tp, pp=pp, dp=devices // (tp * pp * cp), cp=cp, ep=ep,
                                                             etp=etp, gbs=gbs, seq=seq, sequence_parallel=sp,
                                                             rank_order=order)]).items()
                  if k in ("tp", "sequence_parallel", "rank_order", "pp", "cp", "dp", "ep", "etp", "gbs", "seq",
                           "precision")}
        dual = vpp == 2 and pp > 1 and bool(mask(prefix, MIXTRAL, devices)[0])
        for schedule in ("1f1b",) + (("dualpipev",) if dual else ()):
            n += 1
            p = ParallelConfig(tp=tp, pp=pp, dp=devices // (tp * pp * cp), cp=cp, ep=ep, etp=etp, vpp=vpp, mbs=mbs,
                               gbs=gbs, seq=seq, sequence_parallel=sp, rank_order=order, schedule=schedule)
            in_space = bool(space_mask(encode([p]), MIXTRAL)[0])
            if in_space and valid_everywhere(MIXTRAL, p, devices):
                c = columns(p)
                want.add(tuple(c[k] for k in FIELDS if k not in VARIANT_COLUMNS))
    assert got == want and len(want) > 100
    assert considered == n * variants
    assert indivisible == (n - len(want)) * variants


def test_dp_and_schedule_pins_enumerate_exactly_the_layouts_inside_them():
    """Brute force: with dp and the schedule pinned the bases are the valid layouts whose derived dp
    is pinned and whose schedule runs as named (1f1b: vpp 1, interleaved: vpp > 1, gpipe: any);
    layouts outside the pins are not considered, the rest are bases or indivisible."""
    devices, gbs, seq = 24, 48, 4096
    space = SearchSpace(tp=(1, 2, 4), pp=(1, 2, 3), cp=(1, 2), ep=(1, 2), etp=(1,), vpp=(1, 2), mbs=(1, 2),
                        zero=(1,), recompute=("none",), sequence_parallel=(False,), dp=(2, 3, 4),
                        schedule=("1f1b", "interleaved", "gpipe"))
    bases, considered, indivisible, variants = enumerate_layouts(MIXTRAL, devices, gbs, seq, space)
    got = {tuple(int(bases[k][i]) for k in FIELDS if k not in VARIANT_COLUMNS) for i in range(len(bases["tp"]))}
    want, inside = set(), 0
    for tp, pp, cp, ep, vpp, sched, mbs in itertools.product(space.tp, space.pp, space.cp, space.ep, space.vpp,
                                                             space.schedule, space.mbs):
        dp = devices // (tp * pp * cp)
        if dp not in space.dp or (sched == "1f1b") != (vpp == 1) and sched != "gpipe":
            continue
        inside += 1
        p = ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=vpp, mbs=mbs, gbs=gbs, seq=seq, schedule=sched)
        if bool(space_mask(encode([p]), MIXTRAL)[0]) and valid_everywhere(MIXTRAL, p, devices):
            c = columns(p)
            want.add(tuple(c[k] for k in FIELDS if k not in VARIANT_COLUMNS))
    assert got == want and len(want) > 10
    assert {SCHEDULES[s] for s in bases["schedule"]} == {"1f1b", "interleaved", "gpipe"}
    assert set(bases["dp"].tolist()) <= {2, 3, 4}
    assert considered == inside * variants and indivisible == (inside - len(want)) * variants


def test_a_pin_no_layout_passes_names_the_rules_that_rejected_it():
    cluster = build_cluster("h100", 16)
    cases = ((SearchSpace(schedule=("1f1b",), vpp=(2, 4)), "the 1f1b schedule runs one model chunk per rank, got vpp"),
             (SearchSpace(dp=(16,), tp=(2, 4)), "is not among --dp 16"),
             (SearchSpace(dp=(5,)), "--dp 5: dp must divide the 16 devices"),
             (SearchSpace(tp=(8,), pp=(4,), cp=(1,)), "must equal the 16 devices"))
    for space, needle in cases:
        with pytest.raises(LayoutError, match="no layout of llama-3.1-8b on 16 devices passes|dp must divide") as e:
            search(LLAMA, cluster, 64, 4096, space=space)
        assert needle in str(e.value) and "\n" not in str(e.value)
        if "passes" in str(e.value):
            assert space.pins() in str(e.value)
    # the counts are layouts: a stage's rejected rows times the options not expanded yet
    with pytest.raises(LayoutError) as e:
        search(LLAMA, cluster, 64, 4096, space=SearchSpace(tp=(8,), pp=(4,), cp=(1,), mbs=(1, 2), zero=(1, 3)))
    assert "rejected: tp*cp*dp*pp = 8*1*0*4 = 0 must equal the 16 devices" in str(e.value)


def test_search_rejects_options_no_layout_could_use():
    cluster = build_cluster("h100", 16)
    for space, needle in ((SearchSpace(tp=(0, 2)), "tp must be >= 1"), (SearchSpace(zero=(1, 5)), "zero must be 0-3"),
                          (SearchSpace(recompute=("some",)), "recompute must be"),
                          (SearchSpace(rank_order=("dp-tp-cp-pp",)), "cp and dp must be adjacent")):
        with pytest.raises(LayoutError, match=needle):
            search(LLAMA, cluster, 64, 4096, space=space)
    with pytest.raises(LayoutError, match="precision must be"):
        search(LLAMA, cluster, 64, 4096, precision="fp16")


def test_user_options_that_break_a_rule_count_as_indivisible():
    # cp 3 cannot split 4096 tokens into 2*3 load-balanced chunks: rejected by the rule, not planned
    space = SearchSpace(cp=(1, 3), tp=(1, 2), pp=(1, 2), mbs=(1,))
    bases, considered, indivisible, variants = enumerate_layouts(LLAMA, 12, 24, 4096, space)
    assert set(bases["cp"].tolist()) == {1} and indivisible > 0


def test_the_search_times_each_rank_order_with_its_own_groups():
    from dayzero.planner.predict import predict

    cluster = build_cluster("h100", 16)
    # the schedule pinned: an unpinned search keeps only what an engine runs, and none numbers ranks pp-dp-cp-tp
    space = SearchSpace(tp=(8,), pp=(2,), cp=(1,), vpp=(1,), mbs=(1,), zero=(1,), schedule=("1f1b",),
                        rank_order=("tp-cp-dp-pp", "pp-dp-cp-tp"))
    result = search(LLAMA, cluster, 64, 4096, space=space, top_k=2)
    layouts = decode(result.candidates)
    # tp 8 inside a node beats tp 8 spread over two nodes; each row is timed with its own groups,
    # as predict() times that layout alone
    assert [p.rank_order for p in layouts] == ["tp-cp-dp-pp", "pp-dp-cp-tp"]
    assert result.evaluation.step_s[0] < result.evaluation.step_s[1]
    for i, p in enumerate(layouts):
        assert predict(LLAMA, p, cluster)["time"]["step_s"] == pytest.approx(result.evaluation.step_s[i], rel=1e-12)


# -- golden outputs: the encoding change moved no number -------------------------------------------------

GOLDEN_RUNS = {
    "plan_llama8b": ["plan", "llama-3.1-8b", "-a", "h100", "-n", "16", "--gbs", "64", "--seq", "4096", "--top", "3",
                     "--mbs", "1,2"],
    "predict_fp4": ["predict", "llama-3.1-8b", "-a", "gb300", "-n", "8", "--precision", "fp4", "--gbs", "64",
                    "--seq", "8192", "--mbs", "2"],
    "predict_moe": ["predict", "mixtral-8x7b", "-a", "h100", "-n", "32", "--tp", "2", "--pp", "2", "--cp", "2",
                    "--ep", "4", "--etp", "2", "--vpp", "2", "--gbs", "64", "--seq", "4096", "--zero", "2",
                    "--recompute", "selective", "--sequence-parallel", "--rank-order", "tp-dp-cp-pp"],
    "memory_moe": ["memory", "mixtral-8x7b", "-a", "h100", "-n", "32", "--tp", "2", "--pp", "2", "--cp", "2",
                   "--ep", "4", "--etp", "2", "--gbs", "64", "--seq", "4096", "--zero", "3", "--recompute", "full",
                   "--precision", "fp8", "--schedule", "gpipe"],
}


def assert_same(got, want, path="") -> None:
    """Equal JSON: same keys in the same order, same strings and ints, floats to 1e-9."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), path
        for k in want:
            if k != "seconds":  # wall-clock time of the search
                assert_same(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), path
        for i, (a, b) in enumerate(zip(got, want)):
            assert_same(a, b, f"{path}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12), path
    else:
        assert got == want and type(got) is type(want), path


@pytest.mark.parametrize("name", sorted(GOLDEN_RUNS))
def test_cli_json_matches_the_golden_file(name, capsys):
    """A deliberate change of the model's numbers regenerates the files, reviewed in the diff:
    ``DAYZERO_UPDATE_GOLDEN=1 pytest tests/specs/test_layout_rules.py -k golden``."""
    assert main(GOLDEN_RUNS[name] + ["--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    if os.environ.get("DAYZERO_UPDATE_GOLDEN"):
        (GOLDEN / f"{name}.json").write_text(json.dumps(got, indent=1) + "\n")
        pytest.skip("golden file rewritten")
    assert_same(got, json.loads((GOLDEN / f"{name}.json").read_text()))
