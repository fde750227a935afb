"""A child `sys.executable` imports what its parent imports, however the parent got its path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from qnn_common.cli.child_env import import_path, path_exported, python_child_env

# The parent, as a PEX runs code: its import path is assembled at start-up (here: a directory
# put on sys.path by code, with no PYTHONPATH), then it starts `sys.executable` for a module
# found only on that path.
_PARENT = """
import subprocess, sys
sys.path.insert(0, sys.argv[1])
from qnn_common.cli.child_env import python_child_env
env = python_child_env() if sys.argv[2] == "passed" else None
sys.exit(subprocess.run([sys.executable, "-c", "import only_on_my_path"], env=env).returncode)
"""


@pytest.mark.parametrize(("mode", "code"), [("inherited", 1), ("passed", 0)])
def test_child_sees_the_path_only_when_passed(tmp_path: Path, mode: str, code: int) -> None:
    (tmp_path / "only_on_my_path.py").write_text("")
    qnn_common_root = str(Path(__file__).resolve().parents[2])  # the directory holding qnn_common
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {qnn_common_root!r})\n" + _PARENT,
         str(tmp_path), mode],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    # "inherited" is the bug as issue 24 saw it: the child cannot import the parent's modules.
    assert done.returncode == code, done.stderr[-2000:]


def test_import_path_is_absolute_and_keeps_inherited(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/inherited/one")
    entries = import_path().split(os.pathsep)
    assert all(os.path.isabs(p) for p in entries)
    assert entries[-1] == "/inherited/one" and len(entries) == len(set(entries))
    assert python_child_env({"A": "1"}) == {"A": "1", "PYTHONPATH": import_path()}


def test_path_exported_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONPATH", raising=False)
    with path_exported():
        assert os.environ["PYTHONPATH"] == import_path()
    assert "PYTHONPATH" not in os.environ
