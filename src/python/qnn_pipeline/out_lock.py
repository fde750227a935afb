"""One sweep at a time per `--out`: an flock on `OUT/.sweep.lock`, refused at once when held.

A sweep's tables (`sweep.md`, `sweep.json`) describe its own matrix: two sweeps into one `--out`
each wrote theirs at the end, and the last writer's was all that was left (issue 49). Their
artifacts are another matter: runs share those by design (the per-artifact locks make a second
run wait and reuse), and two sweeps with their own `--out` may share one `--artifacts`.

The second sweep is refused rather than made to wait: it has done no work yet, and waiting
hours for another sweep's end is rarely what its caller meant. The kernel drops an flock when
its holder dies (kill -9 included), so a killed sweep never leaves its `--out` locked; the lock
file is deleted on release.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from qnn_common.errors import ArtifactError

LOCK_NAME = ".sweep.lock"


@contextlib.contextmanager
def sole_sweep(out: Path) -> Iterator[None]:
    """Hold `out`'s sweep lock while inside; ArtifactError naming the holder if another has it."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_NAME
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            raise ArtifactError(
                out,
                f"another sweep (pid {holder}) is writing its tables here; wait for it to end, "
                "or give this sweep another --out (--artifacts DIR lets sweeps share artifacts)",
            ) from None
        try:
            same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # its holder deleted the file we locked as it released it: lock the new one
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # still ours: deleted before the lock is let go
        os.close(fd)
