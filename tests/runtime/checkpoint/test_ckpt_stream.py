"""The shard writer's stream: checksums every byte, starts writeback early, never loses a byte."""

from __future__ import annotations

import os

import pytest
import xxhash

from dayzero.runtime.checkpoint import dcp_io
from dayzero.runtime.checkpoint.dcp_io import _HashingStream


def _chunks():
    # small headers between large tensor-like buffers, as torch.save writes them
    out = []
    for i in range(6):
        out.append(bytes([i]) * 100)
        out.append(os.urandom(1 << 10) * (12 << 10))  # 12 MiB
    return out


def _write(path, chunks, algo="xxh3-128"):
    with open(path, "wb") as raw:
        s = _HashingStream(raw, algo)
        for c in chunks:
            assert s.write(memoryview(c)) == len(c)
        size, digest = s.finish()
        s.flush()
    return size, digest


def test_stream_hashes_every_byte_and_starts_writeback_over_contiguous_ranges(tmp_path, monkeypatch):
    calls = []
    real = os.posix_fadvise
    monkeypatch.setattr(dcp_io.os, "posix_fadvise", lambda fd, off, n, advice: (calls.append((off, n, advice)),
                                                                                 real(fd, off, n, advice)))
    chunks = _chunks()
    size, digest = _write(tmp_path / "f", chunks)
    data = b"".join(chunks)
    assert (tmp_path / "f").read_bytes() == data and size == len(data)
    assert digest == "xxh3-128:" + xxhash.xxh3_128(data).hexdigest()
    assert len(calls) >= 2 and all(a == os.POSIX_FADV_DONTNEED for _, _, a in calls)
    assert calls[0][0] == 0 and all(o2 == o1 + n1 for (o1, n1, _), (o2, _, _) in zip(calls, calls[1:]))
    assert all(n >= _HashingStream.WRITEBACK for _, n, _ in calls)


def test_stream_keeps_writing_when_the_file_system_refuses_advice(tmp_path, monkeypatch):
    calls = []

    def refuse(*args):
        calls.append(args)
        raise OSError(95, "Operation not supported")

    monkeypatch.setattr(dcp_io.os, "posix_fadvise", refuse)
    chunks = _chunks()
    size, digest = _write(tmp_path / "f", chunks, "sha256")
    assert len(calls) == 1  # tried once, then off for this file
    import hashlib

    data = b"".join(chunks)
    assert (tmp_path / "f").read_bytes() == data and digest == "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise on this platform")
def test_writeback_is_skipped_below_the_threshold(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(dcp_io.os, "posix_fadvise", lambda *a: calls.append(a))
    _write(tmp_path / "f", [os.urandom(1 << 20) * 4, b"tail"])
    assert calls == []
