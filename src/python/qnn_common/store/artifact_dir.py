"""Where a stage writes: a fresh hidden sibling of its output directory, renamed into place.

`begin_artifact(out)` locks `out` (see artifact_lock), refuses an `out` that would destroy data (the
input itself, a directory containing or inside it, a non-empty directory that is not one of our
artifacts), sweeps what interrupted runs left beside it, and returns a new empty staging directory
`.<name>.staging-XXXX` next to `out`. The stage writes its files there; `write_manifest` seals the
staging directory and calls `publish_artifact`, which renames it to `out` (replacing an older
artifact of ours) and releases the lock. So `out` is either absent, the previous sealed artifact
or the new sealed one: never a half-written directory, whatever kills the run.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import ParamSpec, TypeVar

from qnn_common.errors import ArtifactError
from qnn_common.store.artifact_lock import (
    acquire_artifact_lock,
    held_artifact_locks,
    is_locked_here,
    release_artifact_lock,
)

MANIFEST_NAME = "manifest.json"
# Far above any manifest a stage writes (a file list, configs and metrics: kilobytes); a file
# past it is not read.
MAX_MANIFEST_BYTES = 16 * 2**20
FORMAT = "qnn-pipeline-artifact"
_STAGING = ".staging-"
_REPLACED = ".replaced-"

log = logging.getLogger(__name__)

# Staging directory -> the output directory it becomes when sealed (this process's runs only).
_PENDING: dict[Path, Path] = {}


def _absolute(path: Path) -> Path:
    path = Path(path).expanduser()
    return path.parent.resolve() / path.name if path.name else path.resolve()


def is_our_artifact(directory: Path) -> bool:
    """Whether `directory` holds a manifest.json of this pipeline (verified or not)."""
    path = Path(directory) / MANIFEST_NAME
    try:
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            return False
        # Its numbers are not looked at: a manifest of ours whose numbers no reader takes (an
        # integer past Python's 4,300 digits) is still ours, made again rather than a wedge.
        raw = json.loads(path.read_text(encoding="utf-8"), parse_int=str, parse_float=str,
                         parse_constant=str)
    except (OSError, ValueError, RecursionError):  # unreadable, not JSON, nested past parsing
        return False
    return isinstance(raw, dict) and raw.get("format") == FORMAT


def check_output_dir(out_dir: Path, inputs: Iterable[Path | None] = ()) -> None:
    """Raise ArtifactError if writing the artifact `out_dir` could destroy data.

    Refused: `out_dir` is one of `inputs`, contains one, or lies inside an input directory; or it
    exists and is a file, or a non-empty directory without a manifest of ours. An existing
    artifact of ours is replaced (it is regenerated output).
    """
    out = _absolute(out_dir)
    for given in inputs:
        if given is None or not Path(given).exists():
            continue  # e.g. a built-in model's name: not a path
        src = _absolute(given)
        if out == src:
            raise ArtifactError(
                out_dir,
                f"is the input {given}; writing there would destroy it: "
                "choose another output directory (-o)",
            )
        if out in src.parents:
            raise ArtifactError(
                out_dir,
                f"contains the input {given}; replacing it would delete "
                "the input: choose another output directory (-o)",
            )
        if src in out.parents and src.is_dir():
            raise ArtifactError(
                out_dir,
                f"lies inside the input directory {given}; writing there "
                "would change the input: choose a directory outside it (-o)",
            )
    if out.is_symlink():
        target = "a directory" if out.is_dir() else "a file" if out.exists() else "nothing"
        raise ArtifactError(
            out_dir,
            f"is a symbolic link (to {target}); an artifact is published by renaming a new "
            "directory to this name, which would replace the link, not fill what it points to: "
            f"give the real path (-o {os.path.realpath(out)}) or another output directory",
        )
    if out.exists() and not out.is_dir():
        raise ArtifactError(
            out_dir,
            "exists and is not a directory: choose another output directory (-o), or remove it",
        )
    if out.is_dir() and any(out.iterdir()) and not is_our_artifact(out):
        raise ArtifactError(
            out_dir,
            f"is a non-empty directory that is not an artifact of this pipeline (no {MANIFEST_NAME}"
            " of ours); refusing to replace its files: choose a new or empty output directory "
            "(-o), or remove this one yourself",
        )


def begin_artifact(out_dir: Path, *, inputs: Iterable[Path | None] = ()) -> Path:
    """Lock `out_dir`, check it is safe to write (see check_output_dir) and return a new, empty
    staging directory beside it; the stage writes there, and `write_manifest` publishes it.

    `inputs` are the files and directories the stage reads (its source artifact, user files).
    """
    out_dir = Path(out_dir)
    held_before = is_locked_here(out_dir)
    acquire_artifact_lock(out_dir)
    try:
        check_output_dir(out_dir, inputs)
        final = _absolute(out_dir)
        _sweep_beside(final)
        staging = Path(tempfile.mkdtemp(prefix=f".{final.name}{_STAGING}", dir=final.parent))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp makes 0700; artifacts are shared
    except BaseException:
        if not held_before:
            release_artifact_lock(out_dir)
        raise
    _PENDING[staging] = final
    return staging


def _sweep_beside(final: Path) -> None:
    """Delete staging / replaced directories that runs interrupted while writing `final` left.

    Only called with `final`'s lock held, so no live run is writing any of them.
    """
    prefixes = (f".{final.name}{_STAGING}", f".{final.name}{_REPLACED}")
    for leftover in final.parent.iterdir():
        if leftover.name.startswith(prefixes) and leftover not in _PENDING:
            log.debug("removing %s, left by an interrupted run", leftover)
            shutil.rmtree(leftover, ignore_errors=True)


def is_staging(directory: Path) -> bool:
    """Whether `directory` is a staging directory this process is writing."""
    return _absolute(directory) in _PENDING


def publish_artifact(staging: Path) -> Path:
    """Rename a sealed staging directory to its output directory and release the lock.

    An older artifact there is moved aside first and deleted after; a run killed in between leaves
    no output directory (the next run redoes the stage) and a `.replaced-` sibling it sweeps.
    """
    staging = _absolute(staging)
    final = _PENDING.pop(staging)
    try:
        if final.exists():
            aside = Path(tempfile.mkdtemp(prefix=f".{final.name}{_REPLACED}", dir=final.parent))
            os.replace(final, aside / final.name)
            os.replace(staging, final)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.replace(staging, final)
        _fsync_dir(final.parent)
    finally:
        release_artifact_lock(final)
    return final


def _fsync_dir(directory: Path) -> None:
    # The rename is durable only once the directory entry is on disk.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def discard_pending(since: set[Path] | None = None) -> None:
    """Delete this process's unsealed staging directories and release its artifact locks.

    With `since`, keep the locks that were already held then (taken by an outer caller).
    """
    keep = since or set()
    for staging, final in list(_PENDING.items()):
        if final not in keep:
            del _PENDING[staging]
            shutil.rmtree(staging, ignore_errors=True)
            release_artifact_lock(final)
    for held in held_artifact_locks() - keep:
        release_artifact_lock(held)


P = ParamSpec("P")
R = TypeVar("R")


def cleans_up_artifacts(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorate a function that runs stages: whichever way it exits (an error, Ctrl-C), staging
    directories it left unsealed are deleted and the artifact locks it took are released."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        held = held_artifact_locks()
        try:
            return fn(*args, **kwargs)
        finally:
            discard_pending(since=held)

    return wrapper


# A stage CLI that fails exits through here; kill -9 cannot, and the next run sweeps instead.
atexit.register(discard_pending)
