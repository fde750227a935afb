from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from qnn_common.store.atomic import (
    atomic_path,
    atomic_write_text,
    is_temp_name,
    remove_orphaned_temps,
)


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_temp_names_carry_the_writer_and_match_the_pattern(tmp_path: Path) -> None:
    target = tmp_path / "summary.json"
    with atomic_path(target) as tmp:
        assert tmp.name.startswith(f".summary.{os.getpid()}.")
        assert tmp.name.endswith(".tmp.json")
        assert is_temp_name(tmp.name)
        tmp.write_text("{}")
    assert target.read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_a_dead_writers_temp_is_swept_a_live_ones_and_others_are_kept(tmp_path: Path) -> None:
    target = tmp_path / "summary.json"
    atomic_write_text(target, "{}")
    orphan = tmp_path / f".summary.{_dead_pid()}.abcd1234.tmp.json"
    live = tmp_path / f".summary.{os.getpid()}.efgh5678.tmp.json"
    no_pid = tmp_path / ".summary.ijkl9012.tmp.json"  # an older release's name: writer unknown
    other_file = tmp_path / f".model.{_dead_pid()}.mnop3456.tmp.pte"
    for path in (orphan, live, no_pid, other_file):
        path.write_text("partial")

    assert remove_orphaned_temps(target) == [orphan]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(["summary.json", live.name, no_pid.name, other_file.name])


def test_sweeping_a_missing_directory_is_a_no_op(tmp_path: Path) -> None:
    assert remove_orphaned_temps(tmp_path / "absent" / "summary.json") == []


def test_a_failed_write_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("writer failed")
    assert list(tmp_path.iterdir()) == []
