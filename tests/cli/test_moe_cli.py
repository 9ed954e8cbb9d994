"""``dayzero moe place|loads`` and ``predict/plan --expert-loads/--placement``: output, files, bad input."""

from __future__ import annotations

import json

import pytest

from dayzero.cli.app import main
from dayzero.specs.expert_loads import read_expert_loads, read_telemetry
from dayzero.specs.placement import load_placement
from helpers.paths import DATA

METRICS = str(DATA / "moe_skewed_metrics.jsonl")
MATRIX = str(DATA / "moe_skewed_loads.json")
PLACE = ["moe", "place", "--ep", "4", "--nodes", "2", "--redundant", "4", "--groups", "4"]


def run(capsys, argv):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def one_line(code, err, *needles):
    lines = [ln for ln in err.strip().splitlines() if ln]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], (n, lines[0])


def test_place_json_and_file(tmp_path, capsys):
    out_file = tmp_path / "placement.json"
    code, out, _ = run(capsys, PLACE + ["--loads", METRICS, "--out", str(out_file), "--json"])
    assert code == 0
    doc = json.loads(out)
    assert doc["policy"] == "hierarchical" and doc["slots_per_rank"] == 3 and doc["loads"]["snapshots"] == 2
    assert doc["layers"][0]["max_mean_before"] == pytest.approx(110 / 70)
    assert doc["layers"][0]["max_mean_after"] == pytest.approx(80 / 70)
    pl = load_placement(out_file, experts=8, ep=4)  # the file the runtime loads
    assert pl.slots(1) == ((7, 6, 5), (7, 6, 4), (0, 2, 3), (0, 3, 1)) and pl.layer_indices == (1, 2)
    assert doc["placement"] == json.loads(out_file.read_text())


def test_place_matrix_equals_metrics_and_prints_a_table(capsys):
    """The JSON matrix fixture holds the metrics fixture's summed loads: same placement."""
    assert read_expert_loads(MATRIX).matrix == read_expert_loads(METRICS).matrix
    code, out, _ = run(capsys, PLACE + ["--loads", MATRIX, "--json"])
    by_matrix = json.loads(out)["placement"]
    code2, out2, _ = run(capsys, PLACE + ["--loads", METRICS, "--json"])
    assert code == code2 == 0 and by_matrix == json.loads(out2)["placement"]
    code, out, _ = run(capsys, PLACE + ["--loads", MATRIX])
    assert code == 0 and "1.571" in out and "1.143" in out and "27.3%" in out and "layer 1: r0: 7 6 5" in out


def test_loads_report_and_heatmap(tmp_path, capsys):
    png = tmp_path / "heat.png"
    code, out, _ = run(capsys, ["moe", "loads", METRICS, "--out", str(png), "--json"])
    assert code == 0
    doc = json.loads(out)
    assert doc["steps"] == 4 and doc["snapshots"] == [2, 4] and doc["experts"] == 8
    first = doc["layers"][0]
    assert first["layer"] == 1 and first["hottest"][0] == {"expert": 0, "tokens": 90.0, "share": 90 / 280}
    assert first["max_mean"]["worst"] == pytest.approx(2.6667) and first["dropped"]["worst"] == 0.0
    recorded = [json.loads(x)["moe"]["rank_max_mean"][0] for x in open(METRICS) if '"moe"' in x]
    assert first["rank_max_mean"]["mean"] == pytest.approx(sum(recorded) / 4)
    assert first["rank_max_mean"]["last"] == recorded[-1] and first["rank_max_mean"]["worst"] == max(recorded)
    assert doc["heatmap"] == {"path": str(png), "skipped": None} and png.read_bytes()[:4] == b"\x89PNG"
    code, out, _ = run(capsys, ["moe", "loads", METRICS])
    assert code == 0 and "2.56 / 2.67" in out


def test_loads_heatmap_skipped_without_snapshots(tmp_path, capsys):
    lines = [json.loads(x) for x in open(METRICS)]
    for r in lines:
        r.pop("expert_loads", None)
    p = tmp_path / "m.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in lines))
    code, out, _ = run(capsys, ["moe", "loads", str(p), "--out", str(tmp_path / "h.png"), "--json"])
    assert code == 0 and "no expert_loads snapshots" in json.loads(out)["heatmap"]["skipped"]
    assert not (tmp_path / "h.png").exists() and len(read_telemetry(p).steps) == 4


@pytest.mark.parametrize("content, extra, needles", [
    ('[[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3]]', [], ["ragged matrix"]),
    ('[[1, 2, 3, 4, 5, 6, 7, -8]]', [], ["negative load -8"]),
    ('[[1, 2, 3, 4, 5, 6, 7, "x"]]', [], ["expert 7 has load 'x'"]),
    ('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.9}\n', [], ["no expert_loads records"]),
    ('[[1, 2, 3, 4, 5, 6, 7, 8]]', ["--ep", "8"], ["--ep 8 does not divide experts + redundant = 8 + 4 = 12"]),
    ('[[1, 2, 3, 4, 5, 6, 7, 8]]', ["--nodes", "3"], ["--nodes 3 does not divide --ep 4"]),
    ('[[1, 2, 3, 4, 5, 6, 7, 8]]', ["--groups", "3"], ["--groups 3 does not divide the 8 experts"]),
    ('[[1, 2, 3, 4, 5, 6, 7, 8]]', ["--policy", "random"], ["--policy", "hierarchical, global"]),
    ('{not json', [], ["malformed JSON"]),
])
def test_place_bad_input_one_line(tmp_path, capsys, content, extra, needles):
    p = tmp_path / "loads.json"
    p.write_text(content)
    argv = ["moe", "place", "--loads", str(p), "--ep", "4", "--nodes", "2", "--redundant", "4", "--groups", "4"]
    for flag, value in zip(extra[::2], extra[1::2]):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    one_line(*run(capsys, argv)[::2], *needles)


def test_loads_bad_input_one_line(tmp_path, capsys):
    dense = tmp_path / "dense.jsonl"
    dense.write_text('{"step": 1, "loss": 2.0}\n')
    one_line(*run(capsys, ["moe", "loads", str(dense)])[::2], "has no MoE records")
    one_line(*run(capsys, ["moe", "loads", str(tmp_path / "nope.jsonl")])[::2], "file not found")
    one_line(*run(capsys, ["moe", "loads", MATRIX])[::2], "not a metrics JSONL")


# -- the planner uses the measured imbalance ---------------------------------------------------------------

PREDICT = ["predict", "mixtral-8x7b", "-a", "h100", "-n", "32", "--tp", "2", "--ep", "4", "--gbs", "64", "--seq",
           "4096", "--json"]


def step_and_imbalance(capsys, extra):
    code, out, err = run(capsys, PREDICT + extra)
    assert code == 0, err
    d = json.loads(out)
    return d["time"]["step_s"], d["moe_imbalance"]


def test_predict_uses_measured_imbalance(tmp_path, capsys):
    """Mixtral has 8 experts like the fixture. Its loads on ep=4 under the contiguous placement
    give max/mean 110/70 (layer 1) and 160/65 (layer 2) -> mean 1.802: slower than balanced; the
    EPLB placement with 4 replicas lowers the factor, and the step time with it."""
    base_s, base = step_and_imbalance(capsys, [])
    assert base == {"value": 1.0, "from": "constant", "flag": "--moe-imbalance"}
    skew_s, skew = step_and_imbalance(capsys, ["--expert-loads", METRICS])
    assert skew["from"] == "measured" and skew["placement"] == "contiguous (default)" and skew["loads"] == METRICS
    assert skew["value"] == pytest.approx((110 / 70 + 160 / 65) / 2) and skew["worst_layer"] == pytest.approx(160 / 65)
    assert skew_s > base_s
    const_s, _ = step_and_imbalance(capsys, ["--moe-imbalance", str(skew["value"])])
    assert const_s == pytest.approx(skew_s)  # the measured factor enters exactly where the constant does
    placement = tmp_path / "p.json"
    assert main(PLACE + ["--loads", METRICS, "--out", str(placement), "--json"]) == 0
    capsys.readouterr()
    placed_s, placed = step_and_imbalance(capsys, ["--expert-loads", METRICS, "--placement", str(placement)])
    assert placed["placement"] == str(placement) and 1.0 <= placed["value"] < skew["value"]
    assert base_s <= placed_s < skew_s


def test_plan_measured_imbalance_per_ep(tmp_path, capsys):
    code, out, err = run(capsys, ["plan", "mixtral-8x7b", "-a", "h100", "-n", "16", "--gbs", "32", "--seq", "2048",
                                  "--top", "3", "--ep", "2,4", "--expert-loads", MATRIX, "--json"])
    assert code == 0, err
    plans = json.loads(out)["plans"]
    from dayzero.planner.perf.moe_imbalance import measured_imbalance

    m = measured_imbalance(8, read_expert_loads(MATRIX))
    for p in plans:
        assert p["moe_imbalance"]["value"] == pytest.approx(m.at(p["parallel"]["ep"]).mean)


def test_predict_bad_loads_one_line(tmp_path, capsys):
    one_line(*run(capsys, PREDICT + ["--expert-loads", METRICS, "--moe-imbalance", "1.5"])[::2], "not both")
    wide = tmp_path / "wide.json"
    wide.write_text(json.dumps([[1] * 16]))
    one_line(*run(capsys, PREDICT + ["--expert-loads", str(wide)])[::2], "loads for 16 experts", "8 routed experts")
    placement = tmp_path / "p.json"
    assert main(PLACE + ["--loads", METRICS, "--out", str(placement), "--json"]) == 0
    capsys.readouterr()
    argv = [a if a != "4" else "2" for a in PREDICT] + ["--placement", str(placement)]
    one_line(*run(capsys, argv)[::2], "for ep 4, not ep 2")
    one_line(*run(capsys, ["predict", "llama-3.1-8b", "-a", "h100", "-n", "8", "--expert-loads", METRICS])[::2],
             "no MoE layers")
