"""build-support/version_policy.py on a throwaway git repo: it fails a change that ships without a
version bump (naming the package and the version to bump to), and passes once it is bumped.

The repo mirrors this one's shape (src/python/<pkg>/BUILD with a python_artifact, __init__ with
__version__, CHANGELOG.md; a stage importing qnn_common), with release tags as a maintainer
makes them. The real script runs in a child process, as CI runs it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from releasing.throwaway import API, commit, git, set_version, write

SCRIPT = Path(__file__).resolve().parents[2] / "build-support" / "version_policy.py"


def policy(repo: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--repo", str(repo)], capture_output=True, text=True
    )


def test_unreleased_packages_pass_and_say_how_the_first_release_is_tagged(repo: Path) -> None:
    run = policy(repo)
    assert run.returncode == 0, run.stderr
    assert "its first release is the tag qnn-quant-v0.1.0" in run.stdout


def test_a_shipped_change_without_a_bump_fails_naming_package_and_version(released: Path) -> None:
    write(released, "src/python/qnn_quant/api.py", API["qnn_quant"] + "\n# faster\n")
    commit(released, "a fix")
    run = policy(released)
    assert run.returncode == 1
    assert (
        "ERROR qnn-quant: 1 shipped file(s) changed since qnn-quant-v0.1.0 "
        "(src/python/qnn_quant/api.py) but the version is still 0.1.0: bump it to 0.1.1"
    ) in run.stderr
    assert "qnn-common" not in run.stderr  # the dependency did not change

    set_version(released, "qnn_quant", "0.1.1")
    commit(released, "qnn-quant 0.1.1")
    run = policy(released)
    assert run.returncode == 0, run.stderr
    assert "qnn-quant 0.1.1: changed since qnn-quant-v0.1.0, version bumped: ok" in run.stdout


def test_uncommitted_changes_count(released: Path) -> None:
    write(released, "src/python/qnn_quant/extra.py", "X = 1\n")  # untracked
    run = policy(released)
    assert run.returncode == 1
    assert "src/python/qnn_quant/extra.py" in run.stderr


def test_tests_and_changelog_do_not_ship(released: Path) -> None:
    write(released, "src/python/qnn_quant/api_test.py", "def test_more() -> None:\n    pass\n")
    write(released, "src/python/qnn_quant/CHANGELOG.md", "# qnn-quant\n\n## 0.1.0\n\n- typo\n")
    commit(released, "tests only")
    run = policy(released)
    assert run.returncode == 0, run.stderr


def test_a_bump_needs_a_changelog_entry(released: Path) -> None:
    write(released, "src/python/qnn_quant/api.py", API["qnn_quant"] + "\n# faster\n")
    set_version(released, "qnn_quant", "0.1.1", changelog=False)
    commit(released, "bump without changelog")
    run = policy(released)
    assert run.returncode == 1
    assert "src/python/qnn_quant/CHANGELOG.md has no `## 0.1.1` section" in run.stderr


def test_a_breaking_change_needs_a_new_minor(released: Path) -> None:
    write(released, "src/python/qnn_quant/api.py", API["qnn_quant"].replace(
        "def quantize(path: str)", "def quantize(path: str, bits: int)"))
    set_version(released, "qnn_quant", "0.1.1")
    commit(released, "signature change as a patch")
    run = policy(released)
    assert run.returncode == 1
    assert "qnn_quant.api.quantize changed def (path: str) -> def (path: str, bits: int)" in (
        run.stderr
    )
    assert "bump to 0.2.0" in run.stderr

    set_version(released, "qnn_quant", "0.2.0")
    commit(released, "qnn-quant 0.2.0")
    assert policy(released).returncode == 0


def test_qnn_common_leaving_a_released_stage_range_says_so(released: Path) -> None:
    write(released, "src/python/qnn_common/api.py", "def load(path: str, mode: str) -> str:\n"
          "    return path + mode\n")
    set_version(released, "qnn_common", "0.2.0")
    commit(released, "qnn-common 0.2.0, breaking")
    run = policy(released)
    assert run.returncode == 1
    assert (
        "ERROR qnn-quant: released qnn-quant-v0.1.0 requires qnn-common~=0.1.0, which "
        "qnn-common 0.2.0 no longer satisfies: bump qnn-quant"
    ) in run.stderr
    assert "ERROR qnn-common" not in run.stderr  # qnn-common itself is bumped right

    set_version(released, "qnn_quant", "0.1.1")
    commit(released, "qnn-quant 0.1.1 for qnn-common 0.2")
    run = policy(released)
    assert run.returncode == 0, run.stderr
    assert "release qnn-quant 0.1.1 together with it" in run.stdout


def test_a_compatible_qnn_common_release_needs_no_stage_bump(released: Path) -> None:
    write(released, "src/python/qnn_common/api.py", API["qnn_common"] + "\n\nVERSION = 2\n")
    set_version(released, "qnn_common", "0.1.1")
    commit(released, "qnn-common 0.1.1")
    run = policy(released)
    assert run.returncode == 0, run.stderr
    assert "qnn-quant 0.1.0: unchanged since qnn-quant-v0.1.0" in run.stdout


def test_a_changed_range_needs_a_bump_of_the_packages_that_use_it(repo: Path) -> None:
    write(repo, "3rdparty/python/requirements.txt", "torch>=2.13,<2.14\ntqdm>=4.66,<5\n")
    commit(repo, "requirements")
    git(repo, "tag", "qnn-common-v0.1.0")
    git(repo, "tag", "qnn-quant-v0.1.0")
    # Pants' graph, stubbed: which targets depend on the requirement (the real call is
    # `./pants dependents 3rdparty/python:reqs#torch`; tests and other packages' files vary).
    calls = repo.parent / "pants-calls.txt"
    stub = repo.parent / "pants-stub"
    stub.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {calls}\n'
        'case "$2" in *#torch) echo src/python/qnn_quant/api.py; '
        "echo src/python/qnn_quant/api_test.py:tests; echo tests/e2e/e2e_test.py:tests;; esac\n"
    )
    stub.chmod(0o755)
    run = subprocess.run([sys.executable, str(SCRIPT), "--repo", str(repo), "--pants", str(stub)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert not calls.exists(), "Pants ran although no range changed"

    write(repo, "3rdparty/python/requirements.txt", "torch>=2.13,<2.15\ntqdm>=4.66,<5\n")
    commit(repo, "torch 2.14 admitted")
    run = subprocess.run([sys.executable, str(SCRIPT), "--repo", str(repo), "--pants", str(stub)],
                         capture_output=True, text=True)
    assert run.returncode == 1
    assert "ERROR qnn-quant: 1 shipped file(s) changed since qnn-quant-v0.1.0 " \
        "(3rdparty/python/requirements.txt (torch)) but the version is still 0.1.0" in run.stderr
    assert "ERROR qnn-common" not in run.stderr
    assert calls.read_text().split("\n")[0] == "dependents 3rdparty/python:reqs#torch"
