"""The release tooling tests' repos: two packages at 0.1.0 (`repo`), and released (`released`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from releasing.throwaway import API, commit, git, set_version, write


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """Two packages at 0.1.0, committed; no release yet."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "ci@example.invalid")
    git(repo, "config", "user.name", "CI")
    for pkg, api in API.items():
        set_version(repo, pkg, "0.1.0")
        write(repo, f"src/python/{pkg}/api.py", api)
        write(repo, f"src/python/{pkg}/api_test.py", "def test_nothing() -> None:\n    pass\n")
    commit(repo, "packages at 0.1.0")
    return repo


@pytest.fixture
def released(repo: Path) -> Path:
    git(repo, "tag", "qnn-common-v0.1.0")
    git(repo, "tag", "qnn-quant-v0.1.0")
    return repo
