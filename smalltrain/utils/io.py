"""File helpers shared by downloads, checkpoints and logs: atomic writes that never leave a half-written file."""
import contextlib
import os
import tempfile


@contextlib.contextmanager
def atomic_write(path, mode="wb"):
    """Open a temporary file beside `path`; on success rename it over `path`, on error delete it.

    The rename is atomic on POSIX, so readers see either the old file or the complete new one.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
