"""Where a verb writes: checked before any work, so an unwritable ``--out`` costs one line, not a
traceback after minutes of computation."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Literal

from dayzero.errors import ConfigError


def prepare_output(path: str | Path, flag: str, kind: Literal["file", "dir"] = "file", dry: bool = False) -> Path:
    """Make sure ``path`` can be written as a ``kind`` (creating the directories it needs) or raise
    one ConfigError naming ``flag``, the path and what to do. ``dry`` (a pre-flight such as
    ``dayzero train --dry-run``): create and write nothing; the nearest existing folder must be a
    directory this process may write in (``os.access``, which also sees read-only mounts)."""
    p = Path(path)
    folder = p if kind == "dir" else p.parent
    if kind == "file" and p.is_dir():
        raise ConfigError(flag, None, f"{p} is a directory; give a file path")
    if kind == "dir" and p.exists() and not p.is_dir():
        raise ConfigError(flag, None, f"{p} is a file; give a directory path")
    if dry:
        _check_writable(folder, flag)
        return p
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # a real probe: permissions, read-only mounts and quotas all show up here
        fd, probe = tempfile.mkstemp(prefix=".dayzero-write-test-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        where = e.filename or folder
        raise ConfigError(flag, None, f"cannot write in {folder} ({where}: {e.strerror or e}); "
                          "choose a writable location") from None
    return p


def _check_writable(folder: Path, flag: str) -> None:
    """Without writing: the first existing folder on the way to ``folder`` is a directory that
    this process can write in (and search); the refusal reads as the one the real write would give."""
    import errno

    here = folder.absolute()
    while not here.exists() and here != here.parent:
        here = here.parent
    if not here.is_dir():
        code = errno.ENOTDIR
    elif not os.access(here, os.W_OK | os.X_OK):
        readonly = bool(os.statvfs(here).f_flag & os.ST_RDONLY) if hasattr(os, "statvfs") else False
        code = errno.EROFS if readonly else errno.EACCES
    else:
        return
    raise ConfigError(flag, None, f"cannot write in {folder} ({folder}: {os.strerror(code)}); choose a writable "
                                  "location")
