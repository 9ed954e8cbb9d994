"""Train a 2-step proxy of every causal-LM type transformers ships (the derive sweep's list): the
type's default config written to a directory, then ``dayzero train DIR --layers 2 --hidden 256
--vocab 512 --steps 2`` (4 sequences of 32 tokens, fp32, one CPU process). One line per type: ok
(the two losses) or the error's one line, after whether transformers alone builds the type's
default config on the meta device; the count at the end.

    PYTHONPATH=src nice python benchmarks/derived_sweep_train.py OUT.txt [--every K [--offset I]] [--types a,b]
        [--layout "--pp 2 --nproc 2"]

``--every K`` trains every K-th type of the sorted list (a sample when the whole list takes too long),
starting at index ``--offset I`` (``--every 2 --offset 1`` is the half that ``--every 2`` leaves out).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

RUN = ["--layers", "2", "--hidden", "256", "--vocab", "512", "--steps", "2", "--seq", "32", "--gbs", "4",
       "--compute-dtype", "fp32", "--quiet", "--json"]


def causal_lm_types() -> list[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(mt for mt in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if mt in CONFIG_MAPPING)


def train_type(mt: str, work: Path, timeout: int, extra: tuple[str, ...] = ()) -> tuple[bool, str]:
    """(trained, the losses or the error's last line)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    d = work / mt
    d.mkdir()
    try:
        (d / "config.json").write_text(json.dumps(CONFIG_MAPPING[mt]().to_dict(), default=str))
    except Exception as e:  # noqa: BLE001 - a default config that does not serialise is the type's line
        return False, f"default config: {type(e).__name__} {str(e)[:120]}"
    try:
        p = subprocess.run([sys.executable, "-m", "dayzero", "train", str(d), *RUN, *extra], capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout} s"
    if p.returncode:
        lines = [x for x in p.stderr.splitlines() if x.strip() and "Warning" not in x]
        return False, (lines[-1] if lines else f"exit {p.returncode}")[:300]
    steps = json.loads(p.stdout)["steps"]
    return True, " ".join(f"{s['loss']:.3f}" for s in steps)


def transformers_builds(mt: str) -> str:
    """Whether transformers itself builds the type's default config as a causal LM on the meta device:
    a failure where it does not is the default config's, not dayzero's."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        with torch.device("meta"):
            AutoModelForCausalLM.from_config(CONFIG_MAPPING[mt]())
    except Exception as e:  # noqa: BLE001 - any failure of the modeling code is the answer
        return f"[transformers alone cannot build its default config: {type(e).__name__}: {str(e)[:100]}]"
    return "[transformers alone builds its default config]"


def main() -> None:
    warnings.filterwarnings("ignore")
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--types", default="")
    ap.add_argument("--timeout", type=int, default=240)
    ap.add_argument("--layout", default="", help="layout flags added to each run, e.g. '--pp 2 --nproc 2'")
    a = ap.parse_args()
    types = a.types.split(",") if a.types else causal_lm_types()[a.offset::a.every]
    ok = 0
    with tempfile.TemporaryDirectory() as tmp, open(a.out, "w") as out:
        for mt in types:
            t0 = time.perf_counter()
            good, text = train_type(mt, Path(tmp), a.timeout, tuple(a.layout.split()))
            ok += good
            seconds = time.perf_counter() - t0
            if not good:
                text = f"{transformers_builds(mt)} {text}"
            print(f"{mt}: {'ok' if good else 'FAIL'} ({seconds:.0f} s) {text}", file=out, flush=True)
        print(f"trained {ok} of {len(types)}", file=out, flush=True)


if __name__ == "__main__":
    main()
