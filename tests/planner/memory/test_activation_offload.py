"""Activation CPU offload (Megatron-Core ``--cpu-offloading --cpu-offloading-num-layers N``, TE
``get_cpu_offload_context``; planner.memory.activation_offload).

Hand count, Llama 3.1 8B (h 4096, 8 KV heads of 128, SwiGLU 14336, 32 heads), tp 1, one sequence of
s = 4096 tokens, BF16, fused kernels and FlashAttention: one layer saves 2 B x s x (6 x 4096 (norm
inputs, QKV input, Q, attention output, MLP input) + 2 x 1024 (K, V) + 3 x 14336 (the SwiGLU's two
inputs and the down projection's input)) + 4 B x s x 32 (the log-sum-exp) = 570,425,344 + 524,288 =
570,949,632 B. Over PCIe Gen5 x16 (63.0154 GB/s a direction, planner.memory.offload) that is 9.0605 ms
each way.

TE's scheduling (docs/features/cpu_offloading): the first N layers of a chunk are offloaded, at most
L - N sets of activations stay on the device, and N = L - 1 leaves no overlap.
"""

from __future__ import annotations

import json

import pytest

from dayzero.errors import ConfigError, LayoutError
from dayzero.planner.memory.activation_offload import (
    check_activation_offload,
    exposed_transfer_s,
    offload_fraction,
    offloaded_layers,
    resident_sets,
)
from dayzero.planner.memory.memory import estimate_memory
from dayzero.planner.memory.memory_options import MemoryOptions
from dayzero.planner.memory.offload import PCIE_GEN5_X16_BW
from dayzero.planner.perf.perf import PerfOptions, evaluate
from dayzero.specs.cluster import build_cluster
from dayzero.specs.grid import encode
from dayzero.specs.parallel import ParallelConfig
from dayzero.specs.registry import load_model

SPEC = load_model("llama-3.1-8b")
H100 = build_cluster("h100", 8)
LAYER = 2 * 4096 * (6 * 4096 + 2 * 1024 + 3 * 14336) + 4 * 4096 * 32  # saved bytes of one layer (docstring)
P1 = ParallelConfig(tp=1, pp=1, dp=8, mbs=1, gbs=16, seq=4096, zero=1)  # 2 micro-batches of one sequence
X = LAYER / PCIE_GEN5_X16_BW  # one copy of one layer's saved bytes


def test_hand_count_of_one_layer():
    assert LAYER == 570_949_632
    assert X == pytest.approx(9.0605e-3, rel=1e-4)


def test_offloaded_layers_keep_one_set_per_chunk():
    """N of each chunk, at most L - 1 (TE: num_layers <= model_layers - 1)."""
    assert float(offloaded_layers(4, 32, 1)) == 4
    assert float(offloaded_layers(40, 32, 1)) == 31
    assert float(offloaded_layers(3, 16, 2)) == 6  # two chunks of 8 on the rank
    assert float(offload_fraction(8, 32, 1)) == 0.25
    assert float(offload_fraction(8, 0, 1)) == 0.0
    assert float(resident_sets(2, 5, 1)) == 3  # TE's Figure 3: num_layers 2, model_layers 5
    assert float(resident_sets(31, 32, 1)) == 1


def test_exposed_copy_is_what_the_compute_does_not_cover():
    """A 10 ms copy beside a 4 ms forward and an 8 ms backward: 6 + 2 = 8 ms exposed; beside a 20 ms
    forward and 30 ms backward: hidden; with one resident set (no overlap): both copies, 20 ms."""
    b = 0.010 * PCIE_GEN5_X16_BW
    assert float(exposed_transfer_s(b, 0.004, 0.008, 2)) == pytest.approx(0.008)
    assert float(exposed_transfer_s(b, 0.020, 0.030, 2)) == 0.0
    assert float(exposed_transfer_s(b, 0.020, 0.030, 1)) == pytest.approx(0.020)


def test_memory_falls_by_the_offloaded_layers_of_the_micro_batches_in_flight():
    """pp 2, 1F1B, 8 micro-batches: stage 0 holds 16 layers of 2 micro-batches in flight,
    16 x 2 x 570,949,632 = 18,270,388,224 B; offloading 4 layers per chunk leaves 12 x 2 x LAYER =
    13,702,791,168 B; the last stage (one in flight) 8 x LAYER -> 6 x LAYER. The total falls by the
    saving plus its 10 % fragmentation budget (MemoryOptions: caching allocator)."""
    p = ParallelConfig(tp=1, pp=2, dp=4, mbs=1, gbs=32, seq=4096, zero=1)
    off = estimate_memory(SPEC, p, H100.memory_bytes, MemoryOptions())
    on = estimate_memory(SPEC, p, H100.memory_bytes, MemoryOptions(activation_offload_layers=4))
    assert off.stages[0].terms["activations:layers"] == 16 * 2 * LAYER == 18_270_388_224
    assert on.stages[0].terms["activations:layers"] == 12 * 2 * LAYER == 13_702_791_168
    assert on.stages[1].terms["activations:layers"] == 12 * LAYER
    assert off.stages[0].total - on.stages[0].total == pytest.approx(1.1 * 4 * 2 * LAYER, abs=2)
    assert on.stages[0].weights == off.stages[0].weights


def test_exposed_time_per_layer_and_micro_batch():
    """pp 1, 2 micro-batches, N = 4: each offloaded layer exposes (X - fwd) + (X - bwd), with the
    layer's forward and backward from the compute model (3.954 ms and 8.114 ms on an H100 here:
    both shorter than the 9.06 ms copy), 6.053 ms; 4 layers x 2 micro-batches = 48.4 ms. N = 31
    keeps one set resident: both copies whole, 31 x 2 x 2 X = 1.1235 s."""
    from dayzero.planner.perf.calibration import constants_for, rates
    from dayzero.planner.perf.compute import compute_costs

    g = encode([P1])
    consts = constants_for(H100)
    c = compute_costs(SPEC, g, rates(H100, consts), consts, 1.0, "fused")
    fwd, bwd = float(c.fwd[0, 0]), float(c.bwd[0, 0])
    assert fwd < X and bwd < X
    base = evaluate(SPEC, g, H100, PerfOptions())
    on = evaluate(SPEC, g, H100, PerfOptions(activation_offload_layers=4))
    want = 4 * 2 * ((X - fwd) + (X - bwd))
    assert want == pytest.approx(0.0484, rel=2e-3)
    assert float(on.offload_s[0]) == pytest.approx(want, rel=1e-6)
    assert float(on.step_s[0] - base.step_s[0]) == pytest.approx(want, rel=1e-6)
    assert float(on.compute_s[0]) == float(base.compute_s[0])
    whole = evaluate(SPEC, g, H100, PerfOptions(activation_offload_layers=31))
    assert float(whole.offload_s[0]) == pytest.approx(31 * 2 * 2 * X, rel=1e-6) == pytest.approx(1.1235, rel=1e-4)


def test_a_checkpoint_sized_copy_hides_behind_the_compute():
    """Under full recompute a layer keeps its input only, 2 B x 4096 x 4096 = 33,554,432 B = 0.53 ms
    a copy, shorter than the layer's forward: nothing exposed, the step unchanged."""
    g = encode([P1.with_(recompute="full")])
    base = evaluate(SPEC, g, H100, PerfOptions())
    on = evaluate(SPEC, g, H100, PerfOptions(activation_offload_layers=4))
    assert float(on.offload_s[0]) == 0.0 and float(on.step_s[0]) == float(base.step_s[0])


def test_engine_limits():
    """Megatron-Core runs --cpu-offloading only with pp 1 and no recompute (TransformerConfig);
    torchtitan, DeepSpeed and the runtime have no N-layer activation offload."""
    from dayzero.planner.engines import engine_problems, engines_for

    on = {"activation_offload_layers": 4}
    assert engines_for(P1, on) == ["megatron"]
    assert engines_for(P1.with_(zero=3), on) == ["megatron"] and "torchtitan" in engines_for(P1.with_(zero=3))
    assert "megatron" in engines_for(P1) and len(engines_for(P1)) > 1
    assert engines_for(P1.with_(pp=2, dp=4), on) == []
    assert engines_for(P1.with_(recompute="selective"), on) == []
    why = " ".join(engine_problems("megatron", P1.with_(pp=2, dp=4), on))
    assert "activation offload layers 4" in why and "pipeline parallelism" in why


def test_bad_offload_counts_are_one_line_errors():
    with pytest.raises(ConfigError, match="must be >= 0"):
        check_activation_offload(-1)
    with pytest.raises(ConfigError, match="at most 31"):
        check_activation_offload(32, 32)
    with pytest.raises(ConfigError):
        MemoryOptions(activation_offload_layers=-2)
    from dayzero.planner.predict import check_offload_layout

    with pytest.raises(ConfigError, match="smallest chunk has 16"):
        check_offload_layout(SPEC, P1.with_(pp=2, dp=4), 16)


def test_replay_keeps_the_offloaded_layers_on_the_host():
    """The allocator replay drops an offloaded layer's saved tensors once the next layer has run and
    brings them back for its backward: one micro-batch in flight (pp 1), the peak falls by about
    the offloaded layers' bytes, 8 x LAYER = 4.57 GB (the replay's peak is where it is, to a tenth)."""
    from dayzero.planner.memory.replay import simulate_step

    off = simulate_step(SPEC, P1, H100.memory_bytes, MemoryOptions())
    on = simulate_step(SPEC, P1, H100.memory_bytes, MemoryOptions(activation_offload_layers=8))
    assert off.peak_allocated - on.peak_allocated == pytest.approx(8 * LAYER, rel=0.1)


def test_remedy_is_the_fewest_layers_that_fit():
    """The bisection's N fits and N - 1 does not."""
    from dayzero.planner.search.remedies import fewest_offloaded_layers, single_changes

    p = P1.with_(seq=8192, gbs=8)  # 125 % of an H100 without offload, 80 % with 31 layers offloaded
    opts = MemoryOptions.for_run(H100.accelerator)
    base = estimate_memory(SPEC, p, H100.memory_bytes, opts)
    target = 0.85
    assert base.utilization > target
    n = fewest_offloaded_layers(SPEC, p, H100.memory_bytes, opts, target)
    assert 0 < n < 32

    def util(k):
        return estimate_memory(SPEC, p, H100.memory_bytes, opts.with_(activation_offload_layers=k)).utilization

    assert util(n) <= target < util(n - 1)
    fixes = {f.change: f for f in single_changes(SPEC, p, 8, H100.memory_bytes, opts, target)}
    assert fixes[("--activation-offload", str(n))].option
    assert fewest_offloaded_layers(SPEC, p.with_(pp=2, dp=4), H100.memory_bytes, opts, target) == 0  # no engine


def test_megatron_export_writes_the_flags():
    from dayzero.export.megatron import export

    out = export(SPEC, P1, activation_offload_layers=4)
    i = out.command.index("--cpu-offloading")
    assert out.command[i + 1:i + 3] == ["--cpu-offloading-num-layers", "4"]
    assert "--cpu-offloading" not in export(SPEC, P1).command
    with pytest.raises(LayoutError, match="pipeline parallelism"):
        export(SPEC, P1.with_(pp=2, dp=4), activation_offload_layers=4)


def test_cli_flag_round_trip(capsys):
    from dayzero.cli.app import main

    where = ["llama-3.1-8b", "--accelerator", "h100", "--devices", "8", "--dp", "8", "--gbs", "16", "--seq", "4096"]
    assert main(["predict", *where, "--activation-offload", "4", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["switches"] == {"activation_offload_layers": 4} and d["engines"] == ["megatron"]
    assert d["time"]["activation_offload_s"] == pytest.approx(4 * 2 * 6.053e-3, rel=2e-3)
    assert main(["predict", *where, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert "switches" not in d and "activation_offload_s" not in d["time"]
    assert main(["memory", *where, "--activation-offload", "4", "--no-simulate", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["options"]["activation_offload_layers"] == 4
    assert main(["memory", *where, "--activation-offload", "32", "--no-simulate"]) != 0
    err = capsys.readouterr().err
    assert "--activation-offload" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_batch_path_equals_one_layout_at_a_time():
    """peak_memory_batch reads the option as estimate_memory does, across pp, vpp and schedules."""
    import numpy as np

    from dayzero.planner.memory.memory import peak_memory_batch

    layouts = [P1, P1.with_(pp=2, dp=4, gbs=32), P1.with_(pp=4, dp=2, vpp=2, gbs=32),
               P1.with_(pp=2, dp=4, gbs=32, schedule="dualpipe"), P1.with_(pp=2, dp=4, gbs=32, recompute="full")]
    opts = MemoryOptions(activation_offload_layers=3)
    batch = peak_memory_batch(SPEC, encode(layouts), H100.memory_bytes, opts)
    one = np.array([estimate_memory(SPEC, p, H100.memory_bytes, opts).peak_bytes for p in layouts])
    assert np.allclose(batch, one, rtol=0, atol=2)
    assert (batch < peak_memory_batch(SPEC, encode(layouts), H100.memory_bytes, MemoryOptions())).all()


def test_plan_with_offload_keeps_to_layouts_an_engine_runs():
    """With the switch on, the search keeps the layouts some engine runs with it (Megatron: pp 1,
    no recompute), and the plan is labelled and timed with it."""
    from dayzero.planner.search.search import SearchSpace, plan

    opts = PerfOptions(activation_offload_layers=4)
    mem = MemoryOptions.for_run(H100.accelerator, activation_offload_layers=4)
    obj = plan(SPEC, H100, 64, 8192, "bf16", opts, 3, 0.85, SearchSpace(), memory_options=mem)
    for p in obj["plans"]:
        assert p["parallel"]["pp"] == 1 and p["parallel"]["recompute"] == "none", p["parallel"]
        assert p["engines"] == ["megatron"] and p["time"]["activation_offload_s"] > 0
    with pytest.raises(ConfigError, match="widen --recompute"):
        plan(SPEC, H100, 64, 8192, "bf16", opts, 3, 0.85, SearchSpace(engine="megatron", recompute=("full",)),
             memory_options=mem)


def test_a_grid_column_makes_it_a_per_row_choice():
    """The grid's ``activation_offload_layers`` column (what a search sets, planner.memory.activation_offload.COLUMN)
    prices each row as the option would: rows 0 and 4 of the same layout against two evaluations."""
    import numpy as np

    from dayzero.planner.engines import engine_mask
    from dayzero.planner.memory.activation_offload import COLUMN
    from dayzero.planner.memory.memory import peak_memory_batch

    g = encode([P1, P1])
    g[COLUMN] = np.array([0, 4])
    mem = peak_memory_batch(SPEC, g, H100.memory_bytes, MemoryOptions())
    want = [estimate_memory(SPEC, P1, H100.memory_bytes, MemoryOptions(activation_offload_layers=k)).peak_bytes
            for k in (0, 4)]
    assert np.allclose(mem, want, rtol=0, atol=2)
    ev = evaluate(SPEC, g, H100, PerfOptions())
    assert float(ev.offload_s[0]) == 0.0
    assert float(ev.offload_s[1]) == pytest.approx(float(evaluate(SPEC, encode([P1]), H100, PerfOptions(
        activation_offload_layers=4)).offload_s[0]), rel=1e-12)
    assert engine_mask("torchtitan", {**g, "zero": np.array([3, 3])}).tolist() == [True, False]


def test_vectorised_fewest_layers_agrees_with_the_one_layout_bisection():
    """The search-side bisection (all rows at once) gives each row the N the one-layout remedy
    finds: seq 8192 and 12288 need some offload on an H100 (125 % and 152 % without), seq 32768
    does not fit even at 31 layers (0)."""
    import numpy as np

    from dayzero.planner.memory.activation_offload import fewest_offloaded_layers as batch_fewest
    from dayzero.planner.memory.memory import peak_memory_batch
    from dayzero.planner.search.remedies import fewest_offloaded_layers

    opts = MemoryOptions.for_run(H100.accelerator)
    layouts = [P1.with_(seq=s, gbs=8) for s in (8192, 12288, 32768)]
    limit = 0.85 * H100.memory_bytes
    got = batch_fewest(lambda g: peak_memory_batch(SPEC, g, H100.memory_bytes, opts), encode(layouts), limit,
                       np.full(3, 32))
    want = [fewest_offloaded_layers(SPEC, p, H100.memory_bytes, opts, 0.85) for p in layouts]
    assert got.tolist() == want and want[0] > 0 and want[1] > want[0] and want[2] == 0
