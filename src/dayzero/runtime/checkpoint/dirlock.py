"""One writing job per checkpoint directory: an exclusive advisory lock.

Two jobs saving into one ``--ckpt-dir`` would fail each other's saves (the same ``.partial``
names, each other's retention). A job that writes holds ``fcntl.flock`` on ``<root>/.lock`` and
writes who it is into the file (pid, host, start time, command); a second job fails at once with
one line naming that holder. The kernel releases a flock when its holder dies, however it dies,
so a stale lock is taken over by the next job without anyone removing anything.

Who holds it: the process that owns the job. ``dayzero train --nproc N`` (the launcher, which
outlives restarts of its ranks) takes it before starting ranks and lends it to its child
processes; otherwise (one process, or ranks started by your own ``torchrun``) rank 0's
:class:`~dayzero.runtime.checkpoint.checkpointer.Checkpointer` takes it, and every rank's writes happen under
it. ``dayzero ckpt import`` takes it too; ``ckpt list|verify|export`` only read and do not.

A process that already holds the lock (another Checkpointer of the same process), or whose
launcher lent it, shares it. flock is advisory and per host: on a network file system it is as
good as that file system's flock (NFSv4 and Lustre mounted with ``-o flock`` honour it across
hosts); the recorded host then names the machine to look at.

Torch-free.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

from dayzero.runtime.checkpoint.manifest import CheckpointError, utc_now

LOCK_FILE = ".lock"


class CheckpointLocked(CheckpointError):
    """Another job holds the checkpoint directory's lock."""


@dataclass(frozen=True)
class Holder:
    pid: int
    host: str
    started: str  # UTC, when the lock was taken
    command: str
    lends: bool = False  # shared with the holder's child processes (a launcher's ranks)

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}, started {self.started} ({self.command})"


def read_holder(root: str | Path) -> Holder | None:
    """Who the lock file says holds the lock (None: no file, or no details written)."""
    try:
        from dayzero.inputs import read_text

        raw = json.loads(read_text(Path(root) / LOCK_FILE, limit=1 << 16) or "null")
        return Holder(**raw) if isinstance(raw, dict) else None
    except (OSError, ValueError, TypeError):
        return None


class DirLock:
    """The lock of one checkpoint root. ``acquire`` takes it (or joins this job's holder),
    ``ensure`` re-checks before a write, ``release`` gives it up; also a context manager."""

    def __init__(self, root: str | Path, *, lend_to_children: bool = False):
        self.root, self.lend = Path(root), lend_to_children
        self._file: IO[str] | None = None

    @property
    def owned(self) -> bool:
        return self._file is not None

    def acquire(self) -> "DirLock":
        if self.owned or self._take():
            return self
        holder = read_holder(self.root)
        if holder is not None and _ours(holder):
            return self
        who = holder.describe() if holder is not None else "a process that has not written its details yet"
        raise CheckpointLocked(f"{self.root} is in use by another job: {who}; wait for it to finish or use another "
                               f"--ckpt-dir (the lock, {self.root / LOCK_FILE}, is released when that process exits)")

    def ensure(self) -> None:
        """Before a write: take the lock if it was only shared and its holder has let go since."""
        if not self.owned:
            self.acquire()

    def release(self) -> None:
        f, self._file = self._file, None
        if f is None:
            return
        try:
            f.seek(0)
            f.truncate()  # no stale details for the next reader
            f.flush()
            fcntl.flock(f, fcntl.LOCK_UN)
        finally:
            f.close()

    def __enter__(self) -> "DirLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def _take(self) -> bool:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            f = open(self.root / LOCK_FILE, "a+")  # not "w": truncating before locking would erase the holder
        except OSError as e:
            raise CheckpointError(f"{self.root}: cannot create the lock file {LOCK_FILE} ({e}); --ckpt-dir must be "
                                  "a writable directory") from None
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # BlockingIOError: held elsewhere
            f.close()
            return False
        me = Holder(os.getpid(), socket.gethostname(), utc_now(), _command(), self.lend)
        f.seek(0)
        f.truncate()
        f.write(json.dumps(asdict(me)) + "\n")
        f.flush()
        os.fsync(f.fileno())
        self._file = f
        return True


def check_free(root: str | Path) -> None:
    """Raise CheckpointLocked when another job holds ``root``'s lock (a quick look before a job
    starts work; the job then takes the lock for real). Creates nothing."""
    if (Path(root) / LOCK_FILE).exists():
        DirLock(root).acquire().release()


def check_free_readonly(root: str | Path) -> None:
    """:func:`check_free` without touching the lock (``dayzero train --dry-run``): whether a process
    holds a flock on ``<root>/.lock``, read from the kernel's lock table (Linux ``/proc/locks``;
    elsewhere the lock is probed with a shared lock, taken and released at once). Writes nothing."""
    path = Path(root) / LOCK_FILE
    if not path.is_file():
        return
    if not _flocked(path):
        return
    holder = read_holder(root)
    who = holder.describe() if holder is not None else "a process that has not written its details yet"
    raise CheckpointLocked(f"{root} is in use by another job: {who}; wait for it to finish or use another "
                           f"--ckpt-dir (the lock, {path}, is released when that process exits)")


def _flocked(path: Path) -> bool:
    st = path.stat()
    try:
        table = Path("/proc/locks").read_text()
    except OSError:
        table = None
    if table is not None:
        # "1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF": device major:minor in hex, then the inode
        # (proc(5), /proc/locks)
        want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
        for line in table.splitlines():
            parts = line.split()
            if "FLOCK" not in parts or "->" in parts:  # "->": a waiter, not a holder
                continue
            try:
                major, minor, inode = next(p for p in parts if p.count(":") == 2).split(":")
                if (int(major, 16), int(minor, 16), int(inode)) == want:
                    return True
            except (StopIteration, ValueError):
                continue
        return False
    with open(path) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


def _ours(h: Holder) -> bool:
    """The holder is this job: this process, or the launcher that started it (and lends it)."""
    if h.host != socket.gethostname():
        return False
    return h.pid == os.getpid() or (h.lends and h.pid in _ancestors())


def _ancestors() -> list[int]:
    out, pid = [], os.getppid()
    for _ in range(64):  # parent links, up to init
        if pid <= 1:
            break
        out.append(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rsplit(")", 1)[1].split()[1])  # "pid (comm) state ppid ...": comm may hold spaces
        except (OSError, ValueError, IndexError):
            break
    return out


def _command() -> str:
    argv = list(getattr(sys, "orig_argv", sys.argv)) or ["python"]
    return " ".join([Path(argv[0]).name, *argv[1:]])[:200]
