"""Shared fixtures: the reference data the package ships (no file outside the repository)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dayzero.specs.presets import reference_data

ROOT = Path(__file__).resolve().parents[1]


def data_file(name: str) -> Path:
    """A shipped reference file (``src/dayzero/specs/presets/data``)."""
    return reference_data(name)


@pytest.fixture(scope="session")
def model_catalog() -> dict:
    return json.loads(data_file("model_configs.json").read_text())
