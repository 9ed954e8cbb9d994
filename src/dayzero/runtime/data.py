"""A deterministic, resumable token stream over text files, sharded across data parallelism.

Tokenizer: bytes. Token ``b`` is the byte value 0-255 and 256 ends a document (file), so any
model with vocab >= 257 can train on any text with no tokenizer files. The files are one virtual
sequence ``file0 <eos> file1 <eos> ...`` read through memory maps (nothing is loaded whole),
cut into non-overlapping windows of ``seq + 1`` tokens (inputs and shifted labels share the
boundary token). Sample ``k`` of the run is window ``perm_e[k mod n]`` with ``e = k div n`` and
``perm_e`` a permutation seeded by (seed, e): the stream is a pure function of (files, seq, seed),
so resuming needs only the number of samples consumed.

Step ``s`` reads global samples ``[s * gbs, (s + 1) * gbs)``; data-parallel rank ``d`` takes the
contiguous ``gbs / dp`` of them starting at ``d * gbs / dp`` and splits them into micro-batches, so
every layout sees the same micro-batches as a single process with the same ``mbs``. Under context
parallelism each of the cp ranks of a dp rank reads the same samples and keeps one contiguous
``seq / cp`` slice of each (inputs and their labels).
"""

from __future__ import annotations

import glob
import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from dayzero.errors import ConfigError, DayzeroError
from dayzero.inputs import check_regular

EOS = 256
VOCAB = 257  # 256 byte values + end of document


def document_context(window: np.ndarray, separator: int = EOS) -> float:
    """The document length ``d`` at which the planner's causal attention over packed documents
    (``specs.counting.attention_context``: (d + 1) / 2 keys per query) equals this window's: documents
    end at (and include) ``separator``; a window of documents of lengths l_i attends
    sum l_i (l_i + 1) / 2 keys, so d = sum l_i (l_i + 1) / s - 1 (s = the window's length). One
    document fills the window: d = s."""
    s = len(window)
    cuts = np.flatnonzero(window[:-1] == separator) + 1
    lengths = np.diff(np.concatenate([[0], cuts, [s]]))
    return float((lengths * (lengths + 1)).sum() / s - 1)


class DataError(DayzeroError):
    """The training data cannot be used."""


def default_corpus() -> list[Path]:
    """The offline corpus shipped with the package (original prose, see corpus/README.md)."""
    base = resources.files("dayzero.runtime") / "corpus"
    return sorted(Path(str(p)) for p in base.iterdir() if p.name.endswith(".txt"))


def resolve_data(data: str | None) -> list[Path]:
    """``--data`` (a file, a directory of files, or a glob) -> the sorted files to read."""
    if data is None:
        return default_corpus()
    p = Path(data).expanduser()
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and not f.name.startswith("."))
    elif p.is_file():
        files = [p]
    else:
        files = sorted(Path(f) for f in glob.glob(str(p), recursive=True) if Path(f).is_file())
    if not files:
        raise DataError(f"--data {data}: no such file, and no files match it as a directory or glob; "
                        "pass text files (e.g. --data 'corpus/*.txt') or omit --data for the built-in corpus")
    return files


@dataclass(frozen=True)
class DataPosition:
    """What a checkpoint must save to resume the stream exactly."""

    samples: int  # global samples consumed
    seed: int
    seq: int
    fingerprint: str  # the files' names and sizes

    def to_dict(self) -> dict:
        return {"samples": self.samples, "seed": self.seed, "seq": self.seq, "fingerprint": self.fingerprint}

    @classmethod
    def from_dict(cls, d: object) -> DataPosition:
        """A saved position, checked: a checkpoint's data position is read back only through this."""
        fields = {"samples": int, "seed": int, "seq": int, "fingerprint": str}
        if not isinstance(d, dict) or set(d) != set(fields):
            raise DataError(f"the checkpoint's data position {str(d)[:120]!r} is not an object with "
                            f"{', '.join(fields)}; resume from another version (--resume STEP)")
        for k, t in fields.items():
            v = d[k]
            if not isinstance(v, t) or isinstance(v, bool) or (t is int and (v < 0 or (k == "seq" and v == 0))):
                raise DataError(f"the checkpoint's data position has {k} = {v!r}; resume from another version "
                                "(--resume STEP)")
        return cls(**d)


class TokenStream:
    def __init__(self, files: list[Path], seq: int, seed: int, vocab: int):
        if vocab < VOCAB:
            raise DataError(f"the byte tokenizer needs vocab >= {VOCAB} (256 bytes + end of document); "
                            f"the model has {vocab}: pass a model with a larger vocab (or --vocab {VOCAB})")
        self.files, self.seq, self.seed = list(files), seq, seed
        self._maps = []
        for f in self.files:
            try:
                check_regular(f, "--data takes text files or directories of them")
            except ConfigError as e:  # a FIFO or /dev/zero read as an empty file would be a silent wrong answer
                raise DataError(f"--data: {e}") from None
            try:
                self._maps.append(np.memmap(f, dtype=np.uint8, mode="r") if f.stat().st_size else np.zeros(0, np.uint8))
            except OSError as e:
                raise DataError(f"--data: cannot read {f}: {e.strerror or e}") from None
        sizes = np.array([len(m) + 1 for m in self._maps], dtype=np.int64)  # + <eos> after each file
        self._starts = np.concatenate([[0], np.cumsum(sizes)])
        self.total = int(self._starts[-1])
        self.windows = (self.total - 1) // seq
        if self.windows < 1:
            raise DataError(f"the data has {self.total} tokens, fewer than one sequence of {seq + 1}; "
                            "use more text or a smaller --seq")
        self.samples = 0  # global samples consumed so far
        self._perm_epoch, self._perm = -1, None
        h = hashlib.sha256()
        for f, m in zip(self.files, self._maps):
            h.update(f"{f.name}:{len(m)};".encode())
        self.fingerprint = h.hexdigest()[:16]

    # -- reading -------------------------------------------------------------------------
    def _window(self, j: int) -> np.ndarray:
        """Tokens [j*seq, j*seq + seq + 1) of the virtual concatenation, as int64."""
        a, b = j * self.seq, j * self.seq + self.seq + 1
        out = np.empty(b - a, dtype=np.int64)
        i = int(np.searchsorted(self._starts, a, side="right") - 1)
        pos = a
        while pos < b:
            start, m = int(self._starts[i]), self._maps[i]
            lo, hi = pos - start, min(b - start, len(m) + 1)
            n_bytes = max(0, min(hi, len(m)) - lo)
            out[pos - a:pos - a + n_bytes] = m[lo:lo + n_bytes]
            if hi == len(m) + 1:
                out[pos - a + n_bytes] = EOS
            pos = start + hi
            i += 1
        return out

    def _sample(self, k: int) -> np.ndarray:
        epoch, r = divmod(k, self.windows)
        if epoch != self._perm_epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.windows)
            self._perm_epoch = epoch
        return self._window(int(self._perm[r]))

    def batch(self, gbs: int, dp_rank: int = 0, dp: int = 1, cp_rank: int = 0,
              cp: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """The next global batch's share for ``dp_rank``: inputs, labels of shape (gbs/dp, seq/cp),
        context-parallel rank ``cp_rank`` taking the contiguous slice ``cp_rank`` of every sequence
        (its labels are the same positions' next tokens). Advances the stream by ``gbs`` samples
        on every rank."""
        local = gbs // dp
        first = self.samples + dp_rank * local
        rows = np.stack([self._sample(first + i) for i in range(local)])  # (local, seq + 1)
        self.samples += gbs
        part = self.seq // cp
        cut = slice(cp_rank * part, (cp_rank + 1) * part)
        return rows[:, :-1][:, cut], rows[:, 1:][:, cut]

    def document_length(self, samples: int, first: int = 0) -> float:
        """The packed-document length the planner prices (``ModelSpec.document_length``) of samples
        ``[first, first + samples)`` trained with per-document attention: each window's documents end at
        EOS (:func:`document_context`), averaged over the windows. The stream's position is unchanged."""
        keep = (self._perm_epoch, self._perm)
        try:
            return float(np.mean([document_context(self._sample(first + i)[:-1]) for i in range(samples)]))
        finally:
            self._perm_epoch, self._perm = keep

    # -- resume --------------------------------------------------------------------------
    def position(self) -> DataPosition:
        return DataPosition(self.samples, self.seed, self.seq, self.fingerprint)

    def restore(self, pos: DataPosition | dict) -> None:
        pos = pos if isinstance(pos, DataPosition) else DataPosition.from_dict(pos)
        if (pos.seed, pos.seq, pos.fingerprint) != (self.seed, self.seq, self.fingerprint):
            raise DataError(f"cannot resume the data stream: saved with seed {pos.seed}, seq {pos.seq}, data "
                            f"{pos.fingerprint}; now seed {self.seed}, seq {self.seq}, data {self.fingerprint}; "
                            "resume with the same --data, --seq and --seed")
        self.samples = pos.samples
