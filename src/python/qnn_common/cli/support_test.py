"""How a CLI ends: one `error:` line and exit 2 for every failure, 130 / 143 for the signals."""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from qnn_common.cli.support import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    Terminated,
    check_output_writable,
    describe_os_error,
    run_cli,
)
from qnn_common.errors import ConfigValidationError, StageError


def _error_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.splitlines()


def test_system_exit_from_foreign_code_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    def body(argv: Sequence[str] | None) -> int:
        sys.exit(0)  # what a model factory did: "success", and the run ended without a word

    assert run_cli(body, []) == EXIT_ERROR
    (line,) = _error_lines(capsys)
    assert line.startswith("error: sys.exit(0) was called at ") and __file__ in line


def test_argparse_exits_are_left_alone() -> None:
    def body(argv: Sequence[str] | None) -> int:
        argparse.ArgumentParser(prog="x").parse_args(argv)
        return 0

    with pytest.raises(SystemExit) as exc:
        run_cli(body, ["--help"])
    assert exc.value.code == 0
    with pytest.raises(SystemExit) as exc:
        run_cli(body, ["--no-such-flag"])
    assert exc.value.code == 2


def test_os_error_is_one_line_with_the_path(capsys: pytest.CaptureFixture[str]) -> None:
    def body(argv: Sequence[str] | None) -> int:
        raise NotADirectoryError(errno.ENOTDIR, "Not a directory", "/data/file/out")

    assert run_cli(body, []) == EXIT_ERROR
    assert _error_lines(capsys) == [
        "error: /data/file/out: Not a directory; part of this path is a file, not a directory; "
        "pick another path"
    ]


def test_stage_error_from_an_os_error_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    cause = PermissionError(errno.EACCES, "Permission denied", "/ro/prepare-1")

    def body(argv: Sequence[str] | None) -> int:
        raise StageError("prepare", f"failed: PermissionError: {cause}", cause)

    assert run_cli(body, []) == EXIT_ERROR
    (line,) = _error_lines(capsys)
    assert line.startswith("error: [prepare] /ro/prepare-1: Permission denied; no permission")


def test_non_utf8_path_is_shown_escaped() -> None:
    path = os.fsdecode(b"/tmp/bad\xff")
    err = OSError(errno.ENOENT, "No such file or directory", path)
    assert describe_os_error(err) == "/tmp/bad\\xff: No such file or directory"


def test_ctrl_c_exits_130(capsys: pytest.CaptureFixture[str]) -> None:
    def body(argv: Sequence[str] | None) -> int:
        raise KeyboardInterrupt

    assert run_cli(body, []) == EXIT_INTERRUPTED
    assert "interrupted" in capsys.readouterr().err


def test_sigterm_unwinds_like_ctrl_c(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cleaned = tmp_path / "cleaned"

    def body(argv: Sequence[str] | None) -> int:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0.1)  # let the handler run
            return 0
        finally:
            cleaned.touch()  # what atomic writes do with their temp files

    before = signal.getsignal(signal.SIGTERM)
    assert run_cli(body, []) == EXIT_TERMINATED
    assert cleaned.exists()
    assert "terminated (SIGTERM)" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize(
    ("raised", "code"), [(KeyboardInterrupt, EXIT_INTERRUPTED), (Terminated, EXIT_TERMINATED)]
)
def test_signal_swallowed_by_a_destructor_is_delivered_again(
    raised: type[KeyboardInterrupt], code: int
) -> None:
    """Python drops an exception raised in a destructor ("Exception ignored in ..."): a Ctrl-C
    that landed in one of torch's weakref callbacks let the pipeline run on and exit 0."""

    class Landing:
        def __del__(self) -> None:
            raise raised

    def body(argv: Sequence[str] | None) -> int:
        Landing()  # destroyed at once: the signal's exception is swallowed there
        time.sleep(10)  # the redelivered signal interrupts this
        return 0

    start = time.monotonic()
    assert run_cli(body, []) == code
    assert time.monotonic() - start < 5


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda d: d / "file", "exists and is not a directory; it must name"),
        (lambda d: d / "file" / "out", "file is not a directory"),
        (lambda d: d / ("n" * 300), "the file system allows"),
        (lambda d: d.joinpath(*["d" * 200] * 21), "the system's limit"),
        (lambda d: Path(os.fsdecode(bytes(d / "bad") + b"\xff")), "not valid UTF-8"),
    ],
)
def test_unusable_output_dirs_are_refused_before_work(
    tmp_path: Path, make: Callable[[Path], Path], reason: str
) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigValidationError, match=reason) as exc:
        check_output_writable(make(tmp_path), "--out")
    assert exc.value.field == "--out"
    assert len(str(exc.value)) < 400  # one readable line, even for a 4 KB path


def test_usable_output_dirs_pass(tmp_path: Path) -> None:
    check_output_writable(tmp_path, "--out")
    check_output_writable(tmp_path / "new" / "deeper", "--out")
    assert not (tmp_path / "new").exists()  # checked, not created
