"""A copy of the checkout's build files and sources, for tests that run `./pants` in a build
root of their own (the README's commands, the release round trip)."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path


def copy_checkout(source: Path, root: Path, entries: Iterable[str]) -> Path:
    """Copy each of `entries` (files and directories of the checkout at `source`) to `root`,
    without bootstrap downloads and bytecode; `root`, with its `./pants` executable."""
    for entry in entries:
        src = source / entry
        if src.is_dir():
            shutil.copytree(src, root / entry, ignore=shutil.ignore_patterns(
                ".bootstrap", "__pycache__", "*.pyc"))
        else:
            root.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, root / entry)
    (root / "pants").chmod(0o755)
    return root
