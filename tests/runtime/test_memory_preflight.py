"""train and validate refuse, before any rank starts, a run whose predicted peak exceeds this
machine's free memory: one line with the numbers and proxy flags that would fit."""

import pytest

pytest.importorskip("torch")

from dayzero.cli.app import main  # noqa: E402
from dayzero.runtime import memory_check as mc  # noqa: E402
from dayzero.specs.parallel import ParallelConfig  # noqa: E402
from dayzero.specs.registry import load_model  # noqa: E402

GiB = 2**30


@pytest.fixture
def host_gib(monkeypatch):
    def set_(gib):
        monkeypatch.setattr(mc, "host_available_bytes", lambda: int(gib * GiB))
        monkeypatch.setattr(mc, "device_available_bytes", lambda: None)
    return set_


def test_ranks_on_one_host_add_up(host_gib):
    host_gib(16)
    spec, p = load_model("tiny-llama"), ParallelConfig(dp=4, gbs=8, seq=128)
    need = mc.memory_need(spec, p, 4, "fp32")
    assert need.ranks_sharing == 4 and need.where == "host"
    assert need.need_bytes == 4 * need.per_rank_bytes and need.fits
    # the CPU rank's fixed cost is the measured torch runtime, not a CUDA context
    assert need.per_rank_bytes > mc.CPU_RANK_CONTEXT_BYTES


def test_a_model_too_large_is_refused_with_a_proxy_that_fits(host_gib):
    host_gib(20)
    spec, p = load_model("llama-3.1-8b"), ParallelConfig(gbs=8, seq=256)
    with pytest.raises(mc.InsufficientMemory) as e:
        mc.check_memory(spec, p, 1, "fp32")
    msg = str(e.value)
    assert "GiB" in msg and "20.00 GiB available" in msg and "--skip-memory-check" in msg
    flags = msg.split("train a proxy of the same architecture: ")[1].split(" (or")[0].split()
    kw = {flags[i].lstrip("-"): int(flags[i + 1]) for i in range(0, len(flags), 2)}
    proxy = spec.shrink(**kw)
    assert mc.memory_need(proxy, p, 1, "fp32").fits  # the suggested proxy really fits


def test_train_refuses_before_starting_ranks(host_gib, capsys):
    host_gib(1)
    assert main(["train", "tiny-llama", "--nproc", "8", "--steps", "2", "--seq", "64"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dayzero: error: tiny-llama") and "8 rank(s) x" in err and "Traceback" not in err


def test_train_llama_8b_without_proxy_flags_is_refused(capsys):
    """The reported case: a full-size model and no proxy flags on this machine (24 GiB)."""
    assert main(["train", "llama-3.1-8b", "--steps", "10"]) == 2
    err = capsys.readouterr().err
    assert "needs about" in err and "--layers" in err


def test_validate_refuses_too(host_gib, capsys):
    host_gib(0.5)
    code = main(["validate", "tiny-llama", "--nproc", "4", "--dp", "4", "--steps", "6", "--cluster",
                 "ascend910b-8192"])
    assert code == 2
    err = capsys.readouterr().err
    assert "needs about 4 rank(s) x" in err and "0.50 GiB available" in err
