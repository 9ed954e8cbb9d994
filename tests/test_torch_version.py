"""One torch floor for every torch-using layer (runtime, checkpoints, ops, memory --exact)."""

import pytest

torch = pytest.importorskip("torch")

from dayzero.errors import DayzeroError  # noqa: E402
from dayzero.torch_version import MIN_TORCH, require_torch, torch_version  # noqa: E402


@pytest.mark.parametrize("text,expected", [("2.13.0+cpu", (2, 13)), ("2.10.0a0+git1234", (2, 10)),
                                           ("2.9.1", (2, 9)), ("3.0.0.dev20270101", (3, 0))])
def test_versions_parse_with_local_and_pre_release_tags(text, expected):
    assert torch_version(text) == expected


def test_an_old_torch_is_refused_with_the_floor_and_the_install_command(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.9.1+cpu")
    with pytest.raises(KeyError, match=r"too old for dayzero checkpoints: need torch >= 2\.10.*pip install"):
        require_torch("dayzero checkpoints", KeyError)
    with pytest.raises(DayzeroError, match="the runtime"):
        require_torch("the runtime")
    monkeypatch.setattr(torch, "__version__", f"{MIN_TORCH[0]}.{MIN_TORCH[1]}.0")
    require_torch("the runtime")
