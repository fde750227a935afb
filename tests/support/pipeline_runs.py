"""Running the pipeline in child processes, and checking what runs leave in an output directory."""

from __future__ import annotations

import sys
from pathlib import Path

from qnn_common.cli.child_env import python_child_env
from qnn_common.sealing import load_manifest, manifest_digest

# tiny-cnn, kept small: every stage runs in seconds.
TINY_CNN = ("--model", "tiny-cnn", "--calibration-samples", "4", "--runs", "3")


def child_env() -> dict[str, str]:
    """The environment for a child Python that imports what this process imports, unbuffered
    (tests read its log as it comes)."""
    return {**python_child_env(), "PYTHONUNBUFFERED": "1"}


def pipeline_command(out: Path, *extra: str) -> list[str]:
    """`qnn-pipeline` on tiny-cnn into `out`, as a child process's argv."""
    from qnn_pipeline import cli  # the CLI module: a dependency of the calling test

    return [sys.executable, "-m", cli.__name__, *TINY_CNN, "--out", str(out), *extra]


def sealed_artifacts(out: Path) -> dict[str, str]:
    """Stage directory name -> identity digest, for every visible directory under `out`.

    Each must load with every check (hashes, no unlisted file, the manifest's own digest): a
    directory that does not is a partial artifact someone could trust, and fails the caller.
    """
    found = {}
    for directory in sorted(p for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")):
        load_manifest(directory)
        found[directory.name] = manifest_digest(directory)
    return found


def leftovers(out: Path) -> list[str]:
    """Hidden files and directories under `out` (staging directories, temp and lock files)."""
    return sorted(str(p.relative_to(out)) for p in out.rglob(".*"))


def file_digests(out: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file that is an artifact's content (not manifest.json,
    whose timings and creation time differ between runs, nor summary.json)."""
    from qnn_common.store.hashing import sha256_file

    return {
        str(p.relative_to(out)): sha256_file(p)
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.name not in ("manifest.json", "summary.json")
    }
