"""Shared fixtures: the reference data the package ships (no file outside the repository)."""

from __future__ import annotations

import json

import pytest

from helpers.paths import data_file


@pytest.fixture(scope="session")
def model_catalog() -> dict:
    return json.loads(data_file("model_configs.json").read_text())
