"""The option groups of ``dayzero validate`` (:mod:`dayzero.cli.option_groups`): the proxy's size and
the calibration flags, as declared on the verb."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer


@dataclass(frozen=True)
class ProxySize:
    """--layers, --hidden, --experts, --vocab: the proxy's size asked for (validate.run.proxy_shrink
    fills what is not given to fit this machine)."""

    layers: Annotated[Optional[int], typer.Option("--layers", min=1, help="Proxy: this many layers.")] = None
    hidden: Annotated[Optional[int], typer.Option("--hidden", min=8, help="Proxy: this width (heads scale "
                                                                          "along).")] = None
    experts: Annotated[Optional[int], typer.Option("--experts", min=1, help="Proxy: this many routed experts.")] = None
    vocab: Annotated[Optional[int], typer.Option("--vocab", min=257, help="Proxy: this vocabulary (>= 257).")] = None

    def asked(self) -> dict:
        return dict(layers=self.layers, hidden=self.hidden, experts=self.experts, vocab=self.vocab)


@dataclass(frozen=True)
class CalibrationOptions:
    """--calibrate, --runs, --fit-keys, --profile-out: fit the profile's efficiency constants to stored
    runs (validate.calibration_store)."""

    calibrate: Annotated[bool, typer.Option("--calibrate", help="Fit the profile's efficiency constants to the stored "
                                                                "runs (this one included) and save them.")] = False
    runs: Annotated[Optional[list[Path]], typer.Option("--runs", help="With --calibrate: validation.json files to fit "
                                                                      "on (repeatable).")] = None
    fit_keys: Annotated[str, typer.Option("--fit-keys", help="With --calibrate: efficiency keys to fit, "
                                                             "comma-separated.")] = (
        "gemm_bf16,layer_overhead_s,intra,memory_scale")
    profile_out: Annotated[Optional[Path], typer.Option("--profile-out", help="With --calibrate: write the calibrated "
                                                                              "profile here (default: update "
                                                                              "--cluster in place).")] = None

    def keys(self) -> tuple[str, ...]:
        """The efficiency keys to fit (--fit-keys, comma-separated)."""
        return tuple(k.strip() for k in self.fit_keys.split(",") if k.strip())
