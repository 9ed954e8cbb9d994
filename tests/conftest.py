"""Shared fixtures: paths to the reference data beside the checkout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
PACKAGED = ROOT / "src" / "dayzero" / "specs" / "presets" / "data"


def data_file(name: str) -> Path:
    """The shared reference file, or the package's copy when shared/ is not beside the checkout."""
    p = SHARED / name
    return p if p.exists() else PACKAGED / name


@pytest.fixture(scope="session")
def model_catalog() -> dict:
    return json.loads(data_file("model_configs.json").read_text())
