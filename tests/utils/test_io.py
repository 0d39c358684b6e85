"""Tests for smalltrain.utils.io.atomic_write: all or nothing, the umask's permissions, stale temporaries cleaned."""
import fcntl
import os
import subprocess
import sys
import warnings

import pytest

from smalltrain.utils.io import atomic_write

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def temps(directory):
    return sorted(n for n in os.listdir(directory) if n.endswith(".tmp"))


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_new_file_gets_the_umask_permissions(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        with atomic_write(tmp_path / "out.bin") as f:
            f.write(b"data")
    finally:
        os.umask(old)
    assert (tmp_path / "out.bin").stat().st_mode & 0o777 == mode


def test_text_mode_and_replacement(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text("old\n")
    with atomic_write(path, "w") as f:
        f.write("new\n")
    assert path.read_text() == "new\n" and os.listdir(tmp_path) == ["log.jsonl"]


def test_error_keeps_the_old_file_and_removes_the_temp(tmp_path):
    path = tmp_path / "out.bin"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_write(path) as f:
            f.write(b"half")
            assert len(temps(tmp_path)) == 1    # the temporary exists while writing
            raise RuntimeError("boom")
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["out.bin"]


def test_missing_directory_is_created_or_refused(tmp_path):
    with atomic_write(tmp_path / "a" / "b" / "out.bin") as f:
        f.write(b"x")
    assert (tmp_path / "a" / "b" / "out.bin").read_bytes() == b"x"
    with pytest.raises(FileNotFoundError):
        with atomic_write(tmp_path / "c" / "out.bin", make_dirs=False) as f:
            f.write(b"x")
    assert not (tmp_path / "c").exists()


def test_temp_of_a_killed_writer_is_removed_by_the_next_write(tmp_path):
    path = tmp_path / "ckpt.bin"
    path.write_bytes(b"old")
    code = ("import os, signal, sys; from smalltrain.utils.io import atomic_write\n"
            "with atomic_write(sys.argv[1]) as f:\n"
            "    f.write(b'partial'); f.flush(); os.kill(os.getpid(), signal.SIGKILL)\n")
    run = subprocess.run([sys.executable, "-c", code, str(path)], cwd=REPO, capture_output=True)
    assert run.returncode == -9
    assert path.read_bytes() == b"old"          # the killed writer never touched the file
    stale = temps(tmp_path)
    assert len(stale) == 1 and stale[0].startswith(".ckpt.bin.")
    (tmp_path / "unrelated.txt").write_bytes(b"keep")
    (tmp_path / ".other.bin.0123abcd.tmp").write_bytes(b"another target's temp")
    with pytest.warns(RuntimeWarning, match=f"removed .*{stale[0]}.*interrupted write of .*ckpt.bin"):
        with atomic_write(path) as f:
            f.write(b"new")
    assert path.read_bytes() == b"new"
    assert sorted(os.listdir(tmp_path)) == [".other.bin.0123abcd.tmp", "ckpt.bin", "unrelated.txt"]


def test_temp_of_a_live_writer_is_left_alone(tmp_path):
    path = tmp_path / "ckpt.bin"
    busy = tmp_path / ".ckpt.bin.89abcdef.tmp"
    busy.write_bytes(b"being written")
    with open(busy, "rb") as other:
        fcntl.flock(other.fileno(), fcntl.LOCK_EX)   # as a writer in another process holds it
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with atomic_write(path) as f:
                f.write(b"new")
    assert busy.read_bytes() == b"being written" and path.read_bytes() == b"new"
