"""The run bound's timers, for real, in a child process (they end the process they are in)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from qnn_common.cli.support import EXIT_ERROR
from qnn_common.errors import ConfigValidationError
from qnn_infer import deadline

# `seconds` of a native call that holds the GIL the whole time, like Method.execute.
_CHILD = """
import ctypes, sys
from qnn_infer.deadline import RunBound
bound = RunBound({bound}, "slow call")
with bound.bounded():
    ctypes.CDLL(None).usleep(int({seconds} * 1e6))
print("returned", flush=True)
with bound.bounded():  # proven: a second call is not bounded
    ctypes.CDLL(None).usleep(int({seconds} * 1e6))
print("returned again", flush=True)
"""


def _run(bound: float, seconds: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _CHILD.format(bound=bound, seconds=seconds)],
        capture_output=True, text=True, check=False, timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def test_a_call_within_the_bound_returns_and_proves_the_program() -> None:
    done = _run(bound=5, seconds=0.05)
    assert (done.returncode, done.stdout.split("\n")[:2]) == (0, ["returned", "returned again"])
    assert "error:" not in done.stderr


def test_a_call_past_the_bound_ends_the_process_with_one_error_line() -> None:
    done = _run(bound=0.2, seconds=30)
    assert done.returncode == EXIT_ERROR and done.stdout == ""
    assert done.stderr.splitlines() == ["error: slow call"]


def test_a_call_that_returns_after_the_line_but_before_the_exit_is_still_ended() -> None:
    """The line says the run was ended: a call returning in the grace must not go on to succeed
    (it did once in CI: the line, then the run's results and exit 0)."""
    done = _run(bound=0.2, seconds=0.2 + deadline._GRACE_S / 2)
    assert done.returncode == EXIT_ERROR and "returned" not in done.stdout
    assert done.stderr.splitlines() == ["error: slow call"]


def test_the_bound_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(deadline.RUN_TIMEOUT_ENV, raising=False)
    assert deadline.run_timeout_s() == deadline.DEFAULT_RUN_TIMEOUT_S
    monkeypatch.setenv(deadline.RUN_TIMEOUT_ENV, "0")
    assert deadline.bound_for("x") is None
    monkeypatch.setenv(deadline.RUN_TIMEOUT_ENV, "soon")
    with pytest.raises(ConfigValidationError, match="between 0"):
        deadline.run_timeout_s()
