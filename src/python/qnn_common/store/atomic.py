"""Atomic file writes: a temp file beside the target, renamed over it once complete.

A reader sees the old file or the complete new one, never a partial write. The temp names follow
one pattern (`is_temp_name`), so a temp file orphaned by kill -9 is recognised and swept before an
artifact is sealed instead of being sealed inside it. The name carries the writer's process id, so
a file in a directory that several runs share (the pipeline's output root) is swept only once its
writer is gone (`remove_orphaned_temps`), never under a live writer's feet.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

# mkstemp's names: prefix + 8 random characters + suffix; ours are
# ".<stem>.<pid>.XXXXXXXX.tmp<suffix>" (older releases wrote no pid).
_TEMP_NAME = re.compile(r"\..*\.[a-z0-9_]{8}\.tmp(\.[^/]*)?")


def is_temp_name(name: str) -> bool:
    """True for a file name `atomic_path` creates (and would have renamed or deleted)."""
    return _TEMP_NAME.fullmatch(name) is not None


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temp path beside `path`; on success rename it over `path`, on failure delete it.

    The temp file lives in the same directory so the final `os.replace` is an atomic rename: a
    reader sees the old file or the complete new one, never a partial write.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    # Keep the real suffix last: torch.export.save warns about archives not ending in .pt2.
    fd, tmp_name = tempfile.mkstemp(
        prefix=f".{path.stem}.{os.getpid()}.", suffix=f".tmp{path.suffix}", dir=path.parent
    )
    os.close(fd)
    # mkstemp creates 0600; artifacts are shared files, so honour the umask like open() does.
    os.chmod(tmp_name, 0o666 & ~_umask())
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as err:
        if err.filename is not None:
            raise
        # A failed write() or fsync() (a full disk, a quota) carries no file name, and the
        # user's error line would name no path: it is the file being written.
        raise OSError(err.errno, err.strerror or str(err), str(path)) from err
    finally:
        tmp.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive
    return True


def remove_orphaned_temps(path: Path) -> list[Path]:
    """Delete the temp files `atomic_path(path)` left behind in writers that no longer run.

    For a file several processes may write in turn (a summary in a shared output directory): a
    temp file whose writer is alive is its write in progress and is kept; one without a pid in its
    name (an older release's) is kept too. A process id reused since is taken as alive: the safe
    side (a file left over, never one deleted under a writer). Returns what was deleted.
    """
    own = re.compile(
        re.escape(f".{path.stem}.") + r"(\d+)\.[a-z0-9_]{8}" + re.escape(f".tmp{path.suffix}")
    )
    removed: list[Path] = []
    if not path.parent.is_dir():
        return removed
    for entry in path.parent.iterdir():
        match = own.fullmatch(entry.name)
        if match is None or _alive(int(match[1])):
            continue
        with contextlib.suppress(FileNotFoundError):
            entry.unlink()
            removed.append(entry)
    return removed


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_save(path: Path, writer: Callable[[Path], None]) -> None:
    """Let `writer` write to a temp path, then rename it to `path`.

    The writer sees the temp file's name: a serializer that embeds the file name in its output
    (torch.save / torch.export.save name the zip's folder after it) makes the bytes depend on a
    random name; write such files to memory and use `atomic_write_bytes` instead.
    """
    with atomic_path(path) as tmp:
        writer(tmp)


def atomic_copy(src: Path, dst: Path) -> None:
    """Copy a file atomically (for files carried forward from an upstream artifact)."""
    with atomic_path(dst) as tmp:
        shutil.copyfile(src, tmp)
