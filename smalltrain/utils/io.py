"""File helpers shared by downloads, checkpoints and logs: atomic writes that never leave a half-written file."""
import contextlib
import fcntl
import os
import re
import secrets
import warnings


def _temp_name(path):
    """`.<name>.<8 hex>.tmp` beside `path`: hidden, unique, and recognisable as a temporary of `path`."""
    directory, name = os.path.split(path)
    return os.path.join(directory, f".{name}.{secrets.token_hex(4)}.tmp")


def _remove_stale_temps(path):
    """Delete temporaries of `path` left by a writer that was killed; a live writer's temp is locked and kept."""
    directory, name = os.path.split(path)
    pattern = re.compile(rf"\.{re.escape(name)}\.[0-9a-f]{{8}}\.tmp")
    try:
        entries = [e for e in os.scandir(directory) if pattern.fullmatch(e.name) and e.is_file(follow_symlinks=False)]
    except OSError:
        return
    for entry in entries:
        try:
            fd = os.open(entry.path, os.O_RDONLY)
        except OSError:
            continue    # gone already (another cleaner, or its writer finished)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # fails while its writer is alive (it holds the lock)
            os.unlink(entry.path)
            warnings.warn(f"removed {entry.path}, a temporary left by an interrupted write of {path}",
                          RuntimeWarning, stacklevel=4)
        except OSError:
            pass
        finally:
            os.close(fd)


def _fsync_directory(directory):
    """Make the rename itself durable; some file systems cannot open or sync a directory, which is fine."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_write(path, mode="wb", make_dirs=True):
    """Open a temporary file beside `path`; on success flush, fsync and rename it over `path`, on error delete it.

    The rename is atomic on POSIX, so readers see either the old file or the complete new one. The temporary is
    created with mode 0o666 less the umask, as `open` would create `path` (mkstemp's 0o600 would leak into the
    result). Temporaries of the same `path` left by a killed writer are removed first, with a RuntimeWarning.
    `make_dirs=False` raises FileNotFoundError when the directory is missing instead of creating it.
    """
    path = os.path.abspath(os.fspath(path))
    directory = os.path.dirname(path)
    if make_dirs:
        os.makedirs(directory, exist_ok=True)
    _remove_stale_temps(path)
    tmp = _temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)   # marks the temp as in use until this process closes it or dies
        with os.fdopen(fd, mode) as f:
            fd = None   # the file object owns it now
            yield f
            f.flush()
            os.fsync(f.fileno())
            os.replace(tmp, path)
        _fsync_directory(directory)
    except BaseException:
        if fd is not None:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
