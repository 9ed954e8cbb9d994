"""Manifests, verification and versions on disk (torch-free modules)."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dayzero.runtime.checkpoint.manifest import (
    MANIFEST,
    MARKER,
    CheckpointError,
    CheckpointManifest,
    FileEntry,
    check_relpath,
    checksum_file,
    describe_file,
    read_manifest,
    safe_join,
    utc_now,
    verify_version,
    write_marker,
)
from dayzero.runtime.checkpoint.versions import (
    Version,
    apply_retention,
    commit,
    partial_name,
    prepare_partial,
    retention,
    scan,
    select_newest,
    version_name,
)


def make_version(root, step, files=None, complete=True, algo="xxh3-128"):
    """A committed version with a few payload files (no DCP: the torch-free checks only)."""
    files = files or {"__0_0.distcp": b"a" * 100, "__1_0.distcp": b"b" * 80, "train_state.json": b"{}"}
    partial = prepare_partial(root, step)
    for name, data in files.items():
        (partial / name).write_bytes(data)
    m = CheckpointManifest(step=step, created=utc_now(), dayzero_version="test", world=2,
                 files=[describe_file(partial, n, algo) for n in sorted(files)])
    (partial / MANIFEST).write_text(m.to_json())
    if not complete:
        final = root / version_name(step)
        partial.rename(final)
        return final
    return commit(partial, step)


# -- paths ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["", "/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a\\b", "a/..", "x\x00y"])
def test_unsafe_relpaths_are_refused(bad):
    with pytest.raises(CheckpointError):
        check_relpath(bad)


@given(st.lists(st.sampled_from(["a", "b", "..", ".", "", "c.distcp"]), min_size=1, max_size=5))
@settings(max_examples=200, deadline=None)
def test_relpath_check_never_lets_a_path_escape(parts):
    rel = "/".join(parts)
    try:
        check_relpath(rel)
    except CheckpointError:
        return
    assert ".." not in parts and "" not in parts and "." not in parts


def test_symlink_out_of_the_directory_is_refused(tmp_path):
    root = tmp_path / "v"
    root.mkdir()
    (tmp_path / "secret").write_text("x")
    os.symlink(tmp_path / "secret", root / "link")
    with pytest.raises(CheckpointError, match="outside"):
        safe_join(root, "link")


# -- manifest ------------------------------------------------------------------------------------

def test_manifest_rejects_escaping_paths_duplicates_and_unknown_fields(tmp_path):
    base = dict(step=1, created=utc_now(), dayzero_version="t")
    good = {"path": "a", "bytes": 1, "checksum": "xxh3-128:" + "0" * 32}
    for files, extra in ([{**good, "path": "../a"}], {}), ([good, good], {}), ([good], {"evil": 1}):
        (tmp_path / MANIFEST).write_text(json.dumps({**base, "files": files, **extra}))
        with pytest.raises(CheckpointError, match="invalid manifest"):
            read_manifest(tmp_path)
    (tmp_path / MANIFEST).write_text(json.dumps({**base, "format": "other/9"}))
    with pytest.raises(CheckpointError, match="format"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST).write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable"):
        read_manifest(tmp_path)


def test_verify_detects_truncation_bitflip_missing_file_and_edited_manifest(tmp_path):
    v = make_version(tmp_path, 5)
    assert verify_version(v).ok

    shard = v / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[40] ^= 0x01
    shard.write_bytes(bytes(data))
    problems = verify_version(v).problems
    assert problems == ("__1_0.distcp: xxh3-128 checksum mismatch (corrupt: bit flip or partial overwrite)",)
    assert verify_version(v, checksums=False).ok  # a flipped bit keeps the size

    shard.write_bytes(bytes(data[:10]))
    assert "truncated" in verify_version(v).summary() and "__1_0.distcp" in verify_version(v).summary()
    shard.unlink()
    assert verify_version(v).problems == ("__1_0.distcp: missing",)

    w = make_version(tmp_path, 10)
    m = json.loads((w / MANIFEST).read_text())
    m["step"] = 11
    (w / MANIFEST).write_text(json.dumps(m))
    assert "changed after commit" in verify_version(w).summary()


def test_checksums_match_reference_digests_and_sha256_versions_verify(tmp_path):
    import hashlib

    import xxhash

    (tmp_path / "f").write_bytes(b"dayzero" * 3_000_000)  # 21 MB: several 8 MiB reads
    data = (tmp_path / "f").read_bytes()
    assert checksum_file(tmp_path / "f") == "xxh3-128:" + xxhash.xxh3_128(data).hexdigest()
    assert checksum_file(tmp_path / "f", "sha256") == "sha256:" + hashlib.sha256(data).hexdigest()
    with pytest.raises(CheckpointError, match="unknown checksum 'md5'"):
        checksum_file(tmp_path / "f", "md5")
    v = make_version(tmp_path / "root", 4, algo="sha256")
    assert all(f.algorithm == "sha256" for f in read_manifest(v).files) and verify_version(v).ok
    (v / "__0_0.distcp").write_bytes(b"A" + b"a" * 99)
    assert verify_version(v).problems == ("__0_0.distcp: sha256 checksum mismatch (corrupt: bit flip or partial "
                                          "overwrite)",)


def test_format_1_manifests_with_sha256_fields_are_still_read_and_verified(tmp_path):
    import hashlib

    v = make_version(tmp_path, 6, complete=False)
    m = json.loads((v / MANIFEST).read_text())
    m["format"] = "dayzero-checkpoint/1"
    for f in m["files"]:  # what dayzero wrote before checksums named their algorithm
        del f["checksum"]
        f["sha256"] = hashlib.sha256((v / f["path"]).read_bytes()).hexdigest()
    (v / MANIFEST).write_text(json.dumps(m))
    write_marker(v)
    assert verify_version(v).ok
    assert {f.algorithm for f in read_manifest(v).files} == {"sha256"}
    (v / "__1_0.distcp").write_bytes(b"c" * 80)
    assert verify_version(v).problems == ("__1_0.distcp: sha256 checksum mismatch (corrupt: bit flip or partial "
                                          "overwrite)",)


def test_a_newer_format_is_refused_with_an_upgrade_hint(tmp_path):
    (tmp_path / MANIFEST).write_text(json.dumps({"format": "dayzero-checkpoint/3", "step": 1, "created": utc_now(),
                                                 "dayzero_version": "9"}))
    with pytest.raises(CheckpointError, match="upgrade dayzero"):
        read_manifest(tmp_path)


def test_marker_is_written_last_and_names_the_manifest(tmp_path):
    v = make_version(tmp_path, 3, complete=False)
    assert "no COMPLETE marker" in verify_version(v).summary()
    write_marker(v)
    assert verify_version(v).ok
    assert json.loads((v / MARKER).read_text())["manifest_sha256"]


# -- versions ------------------------------------------------------------------------------------

def test_scan_states_and_retention_never_touch_partials_or_the_newest(tmp_path):
    for s in (5, 10, 15, 20):
        make_version(tmp_path, s)
    make_version(tmp_path, 25, complete=False)  # renamed, marker never written
    prepare_partial(tmp_path, 30)  # a save in flight
    (tmp_path / "notes.txt").write_text("ignored")
    states = {(v.step, v.state) for v in scan(tmp_path)}
    assert states == {(5, "complete"), (10, "complete"), (15, "complete"), (20, "complete"),
                      (25, "incomplete"), (30, "partial")}
    assert [v.step for v in retention(scan(tmp_path), keep=2)] == [10, 5]
    deleted = apply_retention(tmp_path, keep=1)
    assert [v.step for v in deleted] == [15, 10, 5]
    left = {(v.step, v.state) for v in scan(tmp_path)}
    assert left == {(20, "complete"), (25, "incomplete"), (30, "partial")}
    with pytest.raises(CheckpointError, match="keep 0"):
        retention(scan(tmp_path), keep=0)


def test_select_newest_skips_partial_incomplete_and_corrupt_ones_naming_them(tmp_path):
    make_version(tmp_path, 5)
    bad = make_version(tmp_path, 10)
    (bad / "__0_0.distcp").write_bytes(b"a" * 99)
    make_version(tmp_path, 15, complete=False)
    prepare_partial(tmp_path, 20)
    chosen, skipped = select_newest(scan(tmp_path), lambda v: verify_version(v.path))
    assert chosen.path.name == version_name(5)
    assert [s.path.name for s in skipped] == [partial_name(20), version_name(15), version_name(10)]
    assert "truncated" in skipped[-1].summary()


def test_commit_replaces_an_existing_version_of_the_same_step(tmp_path):
    old = make_version(tmp_path, 5, files={"a": b"old"})
    new = make_version(tmp_path, 5, files={"a": b"new!"})
    assert old == new and (new / "a").read_bytes() == b"new!"
    assert [v.state for v in scan(tmp_path)] == ["complete"]
    assert verify_version(new).ok


def test_prepare_partial_clears_a_stale_attempt(tmp_path):
    p = prepare_partial(tmp_path, 7)
    (p / "junk").write_text("left by a crash")
    p = prepare_partial(tmp_path, 7)
    assert list(p.iterdir()) == []


def test_file_entry_validation():
    with pytest.raises(ValueError):
        FileEntry(path="a", bytes=-1, checksum="sha256:" + "0" * 64)
    for bad in ("xyz", "sha256:" + "0" * 32, "xxh3-128:" + "0" * 64, "md5:" + "0" * 32, "xxh3-128:" + "G" * 32):
        with pytest.raises(ValueError, match="checksum"):
            FileEntry(path="a", bytes=1, checksum=bad)
    assert FileEntry(path="a", bytes=1, checksum="sha256:" + "0" * 64).algorithm == "sha256"
    assert Version(path=__import__("pathlib").Path("step-00000001"), step=1, state="complete").name == "step-00000001"


def test_retire_renames_without_marker_and_purge_deletes(tmp_path):
    from dayzero.runtime.checkpoint.versions import purge, retire

    for s in (1, 2, 3):
        make_version(tmp_path, s)
    gone = retire(tmp_path, keep=1)
    assert [v.step for v in gone] == [2, 1]
    states = {(v.step, v.state) for v in scan(tmp_path)}
    assert states == {(3, "complete"), (2, "deleting"), (1, "deleting")}
    assert not (tmp_path / "step-00000002.deleting" / "COMPLETE").exists()
    chosen, skipped = select_newest(scan(tmp_path), lambda v: verify_version(v.path))
    assert chosen.path.name == version_name(3) and skipped == []
    purge(tmp_path)
    assert [v.name for v in scan(tmp_path)] == [version_name(3)]
