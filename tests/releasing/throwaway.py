"""Throwaway git repos shaped like this one, for the release tooling's tests: src/python/<pkg>/
with a BUILD holding a python_artifact, __init__.py with __version__, CHANGELOG.md, and a stage
(qnn_quant) importing qnn_common."""

from __future__ import annotations

import subprocess
from pathlib import Path

BUILD = """\
python_sources()

python_distribution(
    name="dist",
    dependencies=[":{pkg}"],
    provides=python_artifact(name="{dist}", version="{version}"),
)
"""
API = {
    "qnn_common": "def load(path: str) -> str:\n    return path\n",
    "qnn_quant": "from qnn_common.api import load\n\n\n"
    "def quantize(path: str) -> str:\n    return load(path)\n",
}


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def write(repo: Path, rel: str, text: str) -> None:
    path = repo / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def set_version(repo: Path, pkg: str, version: str, *, changelog: bool = True) -> None:
    dist = pkg.replace("_", "-")
    base = f"src/python/{pkg}"
    write(repo, f"{base}/BUILD", BUILD.format(pkg=pkg, dist=dist, version=version))
    write(repo, f"{base}/__init__.py", f'__version__ = "{version}"\n')
    if changelog:
        log = repo / base / "CHANGELOG.md"
        old = log.read_text().split("\n", 2)[2] if log.exists() else ""
        write(repo, f"{base}/CHANGELOG.md", f"# {dist}\n\n## {version}\n\n- changes\n\n{old}")


def commit(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)
