"""File digests, computed once per process for a file that has not changed since.

A pipeline run meets the same files several times: a stage seals its outputs (hashing them), the
orchestrator keys and the next stage verifies that artifact (hashing them again), and a cached
artifact is verified before reuse. `sha256_file` hashes a file once and remembers the digest
under the file's identity and state, `(device, inode, size, mtime_ns, ctime_ns)`, next to its
absolute path; any later call re-stats the file and hashes it again unless all of these are the
same. A rewrite in place changes mtime and ctime, an atomic replace changes the inode, and ctime
cannot be set back from user space (`os.utime` that restores mtime bumps ctime), so a changed
file is never answered from the memo.

One residue is handled the way git's index handles "racy" entries: on a file system whose
timestamps tick coarsely (1-10 ms), a rewrite within the same tick as the write before it keeps
mtime and ctime. A digest is therefore only remembered if the file was last changed at least
`RACY_NS` before the hash started; a file hashed right after it was written is hashed again the
next time.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path
from typing import NamedTuple

_CHUNK = 1 << 20
# Coarse file-system clocks tick every 1-10 ms (HZ 1000-100); twice the slowest, to be safe.
RACY_NS = 20_000_000


class FileState(NamedTuple):
    """What identifies a file's content without reading it, for the memo's purposes."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int


def file_state(st: os.stat_result) -> FileState:
    """What this module trusts to say a file's content has not changed (see the docstring)."""
    return FileState(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


_memo: dict[str, tuple[FileState, str]] = {}
_lock = threading.Lock()
# How many files were read and hashed (not answered from the memo): for tests and benchmarks.
_hashed = 0


def hashed_count() -> int:
    """How many times this process has read and hashed a file (memo hits are not counted)."""
    return _hashed


def clear_digest_memo() -> None:
    """Forget every remembered digest (the next `sha256_file` of each file reads it again)."""
    with _lock:
        _memo.clear()


def _hash(path: Path) -> str:
    global _hashed
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            h.update(chunk)
    with _lock:
        _hashed += 1
    return h.hexdigest()


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's content, read and hashed only if it may have changed since the
    last time this process hashed it (see the module docstring)."""
    key = os.path.abspath(path)
    before = file_state(os.stat(path))
    with _lock:
        known = _memo.get(key)
    if known is not None and known[0] == before:
        return known[1]
    started = time.time_ns()
    digest = _hash(Path(path))
    after = file_state(os.stat(path))
    # Remember only a digest of a file that did not change while it was read, and whose last
    # change lies far enough back that a rewrite in the same clock tick cannot hide behind it.
    if after == before and started - max(after.mtime_ns, after.ctime_ns) >= RACY_NS:
        with _lock:
            _memo[key] = (after, digest)
    else:
        with _lock:
            _memo.pop(key, None)
    return digest
