"""Programs this process compiled itself, recognised by the sha256 of their bytes.

The infer stage rehearses an ExecuTorch program it did not make in a child process first
(`qnn_infer.isolation`), because a corrupt or crafted `.pte` can abort the runtime and with it
the process. A program whose bytes this very process produced (compile just ran, as in a chained
pipeline run) was written by ExecuTorch's own serializer from a graph our checks accepted: it
runs in-process directly, so a normal run pays nothing. Identity is the content's sha256, so a
file that was edited, swapped or re-sealed since is not recognised, wherever it lies.

What this does not cover: a file replaced between the check and the runtime's load of it (a race
only someone who can already write the artifact directory can run).
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from qnn_common.store.hashing import sha256_file

_own: set[str] = set()
_lock = threading.Lock()


def remember(data: bytes) -> None:
    """Record `data` as the bytes of a program this process compiled."""
    remember_digest(hashlib.sha256(data).hexdigest())


def remember_digest(sha256: str) -> None:
    """Record the sha256 (hex) of the bytes of a program this process compiled, as it wrote
    them (a program streamed to its file, never whole in memory)."""
    with _lock:
        _own.add(sha256)


def is_own(path: Path) -> bool:
    """Whether the file at `path` holds exactly the bytes of a program this process compiled."""
    with _lock:
        if not _own:
            return False  # nothing compiled here: no need to hash the file
    try:
        digest = sha256_file(path)  # memoized: the stage's manifest check has just hashed it
    except OSError:
        return False
    with _lock:
        return digest in _own


def forget_all() -> None:
    """Forget every program recorded (for tests: make this process a stranger to its output)."""
    with _lock:
        _own.clear()
