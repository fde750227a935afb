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

import fcntl
import logging
import os
import threading
from pathlib import Path

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

    Creates the parent directory if needed (the lock file lives there).
    """
    key = _key(directory)
    with _REGISTRY:
        if key in _HELD:
            return
    path = lock_path(directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    waited = False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
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
