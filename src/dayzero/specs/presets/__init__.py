"""Shipped presets: model configs (``models/``), cluster files (``clusters/``) and the reference
data they come from (``data/``: accelerator catalog, model configs with exact counts, published
training runs; sources in ``data/README.md``)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from dayzero.errors import ConfigError

REFERENCE_FILES = ("hardware_catalog.json", "model_configs.json", "published_runs_dev.csv", "backtest_error.json",
                   "host_systems.json", "facility.json", "device_prices.json")


def reference_data(name: str) -> Path:
    """Path of a shipped reference file (one of ``REFERENCE_FILES``)."""
    if name not in REFERENCE_FILES:
        raise ConfigError(name, None, f"not a shipped reference file; one of: {', '.join(REFERENCE_FILES)}")
    return Path(str(resources.files("dayzero.specs.presets") / "data" / name))
