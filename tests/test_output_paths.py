"""Every verb that writes refuses an unwritable output path up front: one line, exit 2, no
traceback, nothing computed first."""

import os

import pytest

from dayzero.cli.app import main
from dayzero.outputs import prepare_output

VERBS = [
    (["calibrate", "--nproc", "1", "--quick", "--out", "{bad}/h.yaml"], "--out"),
    (["memory", "tiny-llama", "--accelerator", "h100", "--devices", "8", "--timeline", "{bad}/t.png"], "--timeline"),
    (["train", "tiny-llama", "--steps", "1", "--metrics", "{bad}/m.jsonl"], "--metrics"),
    (["validate", "tiny-llama", "--nproc", "1", "--steps", "4", "--out", "{bad}/v"], "--out"),
    (["day0", "tiny-llama", "--accelerator", "h100", "--devices", "8", "--out", "{bad}/r"], "--out"),
    (["ops", "--emit-manifest", "core", "--out", "{bad}/m.yaml"], "--out"),
]


@pytest.mark.parametrize("argv, flag", VERBS, ids=[v[0][0] for v in VERBS])
def test_an_output_under_a_file_is_one_line(argv, flag, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code = main([a.replace("{bad}", str(blocker)) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert lines[-1].startswith("dayzero: error: ") and flag in lines[-1] and "Traceback" not in err, err


def test_a_read_only_directory_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as root: permission bits do not stop writes")
        with pytest.raises(Exception, match="cannot write in"):
            prepare_output(ro / "x.json", "--out")
    finally:
        ro.chmod(0o755)


def test_a_read_only_file_system_is_refused(tmp_path, monkeypatch):
    import errno
    import tempfile

    def erofs(*a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(tmp_path))

    monkeypatch.setattr(tempfile, "mkstemp", erofs)
    with pytest.raises(Exception, match="Read-only file system"):
        prepare_output(tmp_path / "x.json", "--out")


def test_kinds_are_checked(tmp_path):
    f = tmp_path / "f"
    f.write_text("")
    with pytest.raises(Exception, match="is a file"):
        prepare_output(f, "--out", "dir")
    with pytest.raises(Exception, match="is a directory"):
        prepare_output(tmp_path, "--out", "file")
    assert prepare_output(tmp_path / "new" / "deep" / "x.yaml", "--out").parent.is_dir()
