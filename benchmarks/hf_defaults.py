"""Shared by the derivation benchmarks (traced_flops.py, traced_act_bytes.py): each model type's
transformers default config written to its own directory and loaded by ``dayzero`` as a user's
never-seen config would be, with the load's wall time."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from pathlib import Path

# the never-seen model types the derivation benchmarks trace (approximated layers of each kind, and
# olmo2 as the exact control)
TYPES = ("minimax", "deepseek_v32", "granitemoehybrid", "recurrent_gemma", "qwen3_next", "jamba", "olmo2")


def parse_args() -> argparse.Namespace:
    """--seq (the length the trace is checked at, not a fitted one) and --types (comma-separated)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--types", default=",".join(TYPES))
    return ap.parse_args()


def default_config_models(types: list[str], tmp: str) -> Iterator[tuple[str, Path, object, float]]:
    """(model_type, its config directory, the loaded ModelSpec, load seconds) per type."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from dayzero.specs.registry import load_model

    for mt in types:
        d = Path(tmp) / mt
        d.mkdir()
        (d / "config.json").write_text(json.dumps(CONFIG_MAPPING[mt]().to_dict()))
        t = time.perf_counter()
        spec = load_model(str(d))
        yield mt, d, spec, time.perf_counter() - t
