"""A measured profile of this host, made once and reused: ``dayzero validate`` without
``--cluster`` on a machine the catalog does not describe (a CPU host) runs the quick calibration
(``dayzero calibrate --quick``) and keeps the profile in the user's cache directory, keyed by what
changes the measurement: host name, processor, core count, memory, torch version and rank count.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

CACHE_ENV = "DAYZERO_CACHE_DIR"


@dataclass(frozen=True)
class HostKey:
    """What a measured profile depends on."""

    host: str
    processor: str
    cores: int
    memory_bytes: int
    torch: str
    nproc: int

    @classmethod
    def here(cls, nproc: int) -> "HostKey":
        import torch

        try:
            mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            mem = 0
        return cls(host=platform.node(), processor=platform.processor() or platform.machine(),
                   cores=os.cpu_count() or 1, memory_bytes=int(mem), torch=torch.__version__, nproc=nproc)

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def cache_dir() -> Path:
    """``$DAYZERO_CACHE_DIR``, else ``$XDG_CACHE_HOME/dayzero``, else ``~/.cache/dayzero``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dayzero"


def profile_path(key: HostKey) -> Path:
    return cache_dir() / "profiles" / f"host-{key.nproc}r-{key.digest()}.yaml"


def cached_profile(nproc: int, announce: Callable[[str], None] = lambda _: None,
                   measure: Callable[..., dict] | None = None) -> Path:
    """The cached profile of this host for ``nproc`` ranks, measured first when there is none
    (``measure`` defaults to :func:`dayzero.validate.calibrate.calibrate`)."""
    from dayzero.errors import ConfigError

    key = HostKey.here(nproc)
    path = profile_path(key)
    if path.exists():
        announce(f"profile of this host: {path} (cached; --cluster FILE to use another)")
        return path
    if measure is None:
        from dayzero.validate.calibrate import calibrate as measure
    announce(f"no profile of this host for {nproc} rank(s): measuring one (dayzero calibrate --quick --nproc {nproc}, "
             f"about a minute), kept at {path}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(str(path.parent), None, f"cannot create the profile cache ({e.strerror}); set "
                          f"{CACHE_ENV} to a writable directory or pass --cluster FILE") from None
    tmp = path.with_suffix(f".tmp{os.getpid()}.yaml")
    measure(nproc, tmp, True, f"host-{nproc}r")
    os.replace(tmp, path)  # whole or absent: a killed measurement leaves no half profile behind
    return path
