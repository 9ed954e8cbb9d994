"""Rows read as written: what a row states in its notes, other columns or a remark is read, a
stated value beats the matched model's, and a row that publishes only MFU/HFU is scored."""

from __future__ import annotations

import time

import pytest

from dayzero.planner.backtest.backtest import predict_cases
from dayzero.planner.backtest.published import Unpredictable, case_of, read_rows
from dayzero.planner.backtest.row_arch import model_of
from dayzero.planner.backtest.row_metric import definition_of
from dayzero.planner.backtest.row_text import devices_in, mfu_in, tokens_per_batch_in
from dayzero.specs.counting import flops_per_token
from helpers.paths import data_file

THROUGHPUT = ("tokens_per_sec_per_gpu", "tokens_per_sec_total", "step_time_s", "tflops_per_gpu", "mfu_pct",
              "hfu_pct", "aggregate_pflops", "other_published_metric")


@pytest.fixture(scope="module")
def rows():
    return {r["id"]: r for r in read_rows(data_file("published_runs_dev.csv"))}


def edited(rows, rid, **cols):
    return {**rows[rid], **cols}


def assumed(case, kind):
    return [a.text for a in case.assumed if a.kind == kind]


def only(rows, rid, **cols):
    """Row ``rid`` with every throughput column blank, then ``cols``."""
    return edited(rows, rid, **{**{k: "" for k in THROUGHPUT}, **cols})


def test_batch_given_only_in_the_notes_as_tokens(rows):
    """R0383 runs gbs 128 x seq 8192 = 1,048,576 tokens: the same row with gbs blank and the notes
    saying 'tokens/batch = 1M' is priced with 128 sequences, not dp x mbs."""
    base = case_of(rows["R0383"])
    row = edited(rows, "R0383", gbs="", grad_accum="", notes="global batch: tokens/batch = 1M")
    case = case_of(row)
    assert case.parallel.gbs == 128 == base.parallel.gbs
    assert any("tokens/batch = 1M" in a for a in assumed(case, "batch"))
    assert predict_cases([case])[0] == pytest.approx(predict_cases([base])[0], rel=1e-12)
    blank = case_of(edited(rows, "R0383", gbs="", grad_accum="", notes=""))
    assert blank.parallel.gbs == 16  # dp 8 x mbs 2: what the notes' batch replaces


@pytest.mark.parametrize("text,tokens", [("4M tokens per batch", 4 * 2**20), ("tokens/batch = 16M", 16 * 2**20),
                                         ("a global batch of 2,048 tokens", 2048), ("lr 3e-4, no batch", None)])
def test_tokens_per_batch_phrases(text, tokens):
    found = tokens_per_batch_in(text)
    assert (found[0] if found else None) == tokens


def test_a_stated_vocab_beats_the_matched_model(rows):
    """A GPT-3 175B row stating vocab 51,200 (Megatron's padding) is priced with 51,200, not the
    preset's 50,257; a round label close to the model's ('128000' for 128,256) keeps the model's."""
    row = {"id": "x", "model": "GPT-3 175B", "vocab_size": "51200"}
    m = model_of(row)
    assert m.spec.vocab == 51200 and any("vocab_size 51200" in n for n in m.notes)
    assert model_of({"id": "x", "model": "GPT-3 175B"}).spec.vocab == 50257
    assert case_of(rows["R0383"]).spec.vocab == 128256  # the row says 128000
    remark = model_of({"id": "x", "model": "BLOOM 176B", "vocab_size": "250680 (padded to 250880)"})
    assert remark.spec.vocab == 250680


def test_public_architectures_resolve_by_name_with_a_source():
    for name, target, billions in (("Megatron-Turing NLG 530B", "MT-NLG 530B", 530), ("bigscience/bloom-176b",
                                   "BLOOM 176B", 176), ("OPT-175B", "OPT-175B", 175), ("PaLM 540B", "PaLM 540B", 540),
                                   ("Llama-2-70B", "Llama 2 70B", 69), ("LLaMA-65B", "LLaMA 65B", 65)):
        m = model_of({"id": "x", "model": name})
        assert m.name == target
        from dayzero.specs.counting import params_total
        assert params_total(m.spec) == pytest.approx(billions * 1e9, rel=0.03)


def test_blank_heads_are_hidden_over_128_and_listed():
    row = {"id": "x", "model": "GPT-ish 13B", "layers": "40", "hidden_size": "5120", "ffn_hidden_size": "20480"}
    m = model_of(row)
    assert m.spec.attention.heads == 40
    assert any("attention_heads blank" in n for n in m.notes)


def test_blank_width_from_the_parameter_count():
    """12 x 96 x 12288^2 = 174B: a 175B row stating only its depth gets GPT-3's width, stated."""
    m = model_of({"id": "x", "model": "Our LM", "total_params": "175B", "layers": "96"})
    assert m.spec.hidden == 12288 and m.spec.mlp.intermediate == 4 * 12288
    assert any("hidden_size blank" in n for n in m.notes)


def test_device_count_from_totals_and_from_the_notes(rows):
    r = rows["R0383"]  # 8 devices, 37556 tokens/s each
    by_total = case_of(edited(rows, "R0383", num_accelerators="", tokens_per_sec_total=str(37556 * 8)))
    assert by_total.cluster.devices == 8
    by_notes = case_of(edited(rows, "R0383", num_accelerators="", notes="trained on 1 node x 8 GPUs"))
    assert by_notes.cluster.devices == 8 and by_notes.published == pytest.approx(float(r["tokens_per_sec_per_gpu"]))
    with pytest.raises(Unpredictable) as e:
        case_of(edited(rows, "R0383", num_accelerators="", notes=""))
    assert e.value.kind == "no device count"


@pytest.mark.parametrize("text,n", [("on 1,024 GPUs", 1024), ("64 nodes x 8", 512), ("128 x 8 H100 GPUs", 1024),
                                    ("16 servers with 8 NPUs each", 128), ("H100 80GB GPUs", None)])
def test_device_phrases(text, n):
    found = devices_in(text)
    assert (found[0] if found else None) == n


def test_an_mfu_only_row_is_predicted_and_scored(rows):
    """R0383 with only 'MFU over 52 %' in its notes: tokens/s = 0.52 x BF16 peak / FLOPs per token
    (with attention, the default), and the row is predicted like any other."""
    row = only(rows, "R0383", notes="MFU over 52 %")
    case = case_of(row)
    spec, seq = case.spec, case.parallel.seq
    expected = 0.52 * case.cluster.accelerator.peak("bf16") / flops_per_token(spec, seq).train
    assert case.published == pytest.approx(expected, rel=1e-12)
    assert any("MFU over 52 %" in a for a in assumed(case, "throughput"))
    assert predict_cases([case])[0] > 0
    with pytest.raises(Unpredictable) as e:
        case_of(only(rows, "R0383", notes=""))
    assert e.value.kind == "no throughput"


def test_mfu_under_two_definitions(rows):
    """The same 40 % MFU means more tokens/s under a definition without attention (6N) than under
    PaLM's with attention; the ratio is exactly the attention term's share."""
    with_att = case_of(only(rows, "R0383", mfu_pct="40", mfu_definition="PaLM MFU (with attention)"))
    six_n = case_of(only(rows, "R0383", mfu_pct="40", mfu_definition="6N x tokens/s / peak (without attention)"))
    f = flops_per_token(with_att.spec, with_att.parallel.seq)
    assert six_n.published / with_att.published == pytest.approx(f.train / (f.train - 3 * f.attention_forward))
    hfu = case_of(only(rows, "R0383", hfu_pct="40", activation_recompute="full"))
    assert hfu.published == pytest.approx(with_att.published * 3 / 4, rel=1e-9)
    assert definition_of("MFU = 6N / peak").attention == "none"
    assert definition_of("6 x params + attention").attention == "full"
    assert definition_of("causal attention FLOPs").attention == "causal"


@pytest.mark.parametrize("text,mfu", [("MFU over 52 %", 0.52), ("69.0 % MFU", 0.69), ("41% model FLOPs utilization",
                                                                                       0.41), ("52 % faster", None)])
def test_mfu_phrases(text, mfu):
    found = mfu_in(text)
    assert (found[0] if found else None) == pytest.approx(mfu) if mfu else found is None


def test_text_patterns_are_linear():
    """Adversarial inputs of 20,000 characters read in well under a second (no backtracking blow-up)."""
    for s in ("1" * 20000, "1 " * 10000, "1 nodes " * 2500, "tokens per " * 2000, "mfu " * 5000 + "x",
              "1" * 10000 + " x" * 5000):
        t = time.perf_counter()
        devices_in(s), tokens_per_batch_in(s), mfu_in(s)
        assert time.perf_counter() - t < 1.0, s[:20]


def test_packed_documents_against_the_closed_form(rows):
    """Causal attention over documents of length d in a window of s costs s (d + 1) / 2 keys per
    head dimension instead of s (s + 1) / 2: the attention FLOPs shrink by (d + 1) / (s + 1)."""
    from dataclasses import replace

    from dayzero.specs.counting import attention_flops_per_token

    row = edited(rows, "R0383", notes="SFT, reset attention mask, mean document length 1024")
    case = case_of(row)
    s, d = case.parallel.seq, 1024
    assert case.spec.document_length == d and s == 8192
    assert any("1024 tokens" in a for a in assumed(case, "options"))
    window = replace(case.spec, document_length=None)
    for i in (0, case.spec.layers - 1):
        packed = attention_flops_per_token(case.spec, s, i, causal=True)
        full = attention_flops_per_token(window, s, i, causal=True)
        a = window.attention
        assert packed == pytest.approx(2 * (d + 1) / 2 * a.heads * (a.head_dim + a.v_head_dim))
        assert packed / full == pytest.approx((d + 1) / (s + 1))
    base = case_of(rows["R0383"])
    assert predict_cases([case])[0] > predict_cases([base])[0]
    no_len = case_of(edited(rows, "R0383", notes="reset attention mask"))
    assert no_len.spec.document_length is None
    assert any("without a document length" in a for a in assumed(no_len, "options"))
