"""One writer per artifact directory across processes: an flock on a hidden sibling lock file.

Two runs into one `--out` compute the same stage directories. The first to lock a directory checks
the cache, runs the stage and seals; the second waits, then finds the sealed artifact and reuses
it, instead of both writing the same files at once.

The lock file (`.<dir name>.lock` beside the directory) is deleted on release, so no lock files
are left behind. That is safe with the usual protocol: a waiter that was blocked on a lock file
which has since been deleted (or replaced) finds, once it holds the lock, that the path no longer
names the file it locked, and starts over. The kernel drops an flock when its process dies
(kill -9 included), so a crashed run never leaves a directory locked.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import threading
from pathlib import Path

from qnn_common.errors import ArtifactError

log = logging.getLogger(__name__)

# Final directory -> the fd of its held lock file. Re-entrant per process: the orchestrator locks
# a stage directory before its cache check and the stage's begin_artifact asks again.
_HELD: dict[Path, int] = {}
_REGISTRY = threading.Lock()


def _key(directory: Path) -> Path:
    # Parents resolved (symlinks, ..) so that two spellings of one directory share one lock.
    directory = Path(directory)
    return directory.parent.resolve() / directory.name


def lock_path(directory: Path) -> Path:
    """The lock file that guards `directory`."""
    key = _key(directory)
    return key.parent / f".{key.name}.lock"


def is_locked_here(directory: Path) -> bool:
    """Whether this process holds the lock of `directory`."""
    with _REGISTRY:
        return _key(directory) in _HELD


def acquire_artifact_lock(directory: Path) -> None:
    """Block until this process holds the write lock of `directory` (a no-op if it already does).

    Creates the parent directory if needed (the lock file lives there). Raises ArtifactError if
    something other than a regular file of its own stands at the lock file's name (a symlink, a
    directory, a FIFO, a hard link to another file): it is refused, never written through.
    """
    key = _key(directory)
    with _REGISTRY:
        if key in _HELD:
            return
    path = lock_path(directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    waited = False
    while True:
        fd = _open_lock_file(path)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not waited:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                    log.info("%s: another run (pid %s) is writing it; waiting", directory, holder)
                    waited = True
                fcntl.flock(fd, fcntl.LOCK_EX)
            if _names_same_file(path, fd):
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(os.getpid()).encode(), 0)
                with _REGISTRY:
                    _HELD[key] = fd
                return
        except BaseException:
            os.close(fd)
            raise
        # The previous holder deleted (or replaced) the file while we waited: our lock guards
        # nothing, start over on whatever the path names now.
        os.close(fd)


# O_NOFOLLOW: a symlink planted at the lock's name fails the open (ELOOP) instead of having its
# target truncated to our PID, or created when it dangles. O_NONBLOCK: a FIFO planted there must
# not hang the open (it has no effect on a regular file).
_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _open_lock_file(path: Path) -> int:
    """Open (creating it) the lock file at `path`: only a regular file we may own, never a link.

    Raises ArtifactError for a symlink, a non-regular file or a file with other hard links: that
    name is ours to create and delete, so whatever stands there was put there by someone else,
    and writing our PID into it would destroy it.
    """
    try:
        fd = os.open(path, _OPEN_FLAGS, 0o666)
    except OSError as err:
        if err.errno == errno.EISDIR:
            raise ArtifactError(
                path,
                "is a directory, where this pipeline keeps a lock file it creates and deletes "
                "itself: remove or rename that directory and rerun",
            ) from None
        if err.errno != errno.ELOOP:
            raise
        raise ArtifactError(
            path,
            "is a symbolic link where this pipeline keeps a lock file; refusing to follow it "
            "(locking would overwrite or create the file it points to): remove the link and "
            "rerun",
        ) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        os.close(fd)
        what = "has other hard links" if stat.S_ISREG(st.st_mode) else "is not a regular file"
        raise ArtifactError(
            path,
            f"{what}, where this pipeline keeps a lock file it creates and deletes itself; "
            "refusing to write into it: remove it (it is not one of ours) and rerun",
        )
    return fd


def _names_same_file(path: Path, fd: int) -> bool:
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino)


def release_artifact_lock(directory: Path) -> None:
    """Release this process's lock of `directory` and delete the lock file (no-op if not held)."""
    key = _key(directory)
    with _REGISTRY:
        fd = _HELD.pop(key, None)
    if fd is None:
        return
    try:
        # Deleted while still locked: a waiter that wakes on this inode sees it is gone.
        lock_path(directory).unlink(missing_ok=True)
    finally:
        os.close(fd)


def held_artifact_locks() -> set[Path]:
    """The directories whose locks this process holds."""
    with _REGISTRY:
        return set(_HELD)
