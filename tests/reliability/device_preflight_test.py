"""Issue 49, item 9: `--device` without adb failed only after three stages.

`qnn-pipeline --device ...` ran prepare, quantize and compile (47 s for tiny-cnn) before infer
found no adb. What a device run needs on the host (adb, the device it names, the executor runner
built for Android) is now checked before any stage, in one `error:` line.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from qnn_common.config import InferConfig
from qnn_common.errors import BackendNotAvailableError
from qnn_infer.device import check_device_ready
from qnn_pipeline import cli as pipeline_cli

# An ELF header of an arm64 executable: what the runner check reads (magic, class, e_machine).
_ARM64_ELF = b"\x7fELF\x02\x01\x01" + bytes(11) + (183).to_bytes(2, "little")


def _fake_adb(bin_dir: Path, *listed: str) -> None:
    """An `adb` on PATH whose `adb devices` lists `listed` (serial, state) lines."""
    bin_dir.mkdir(exist_ok=True)
    adb = bin_dir / "adb"
    lines = "".join(f"echo '{line}'\n" for line in ("List of devices attached", *listed))
    adb.write_text(f"#!/bin/sh\n{lines}")
    adb.chmod(adb.stat().st_mode | stat.S_IXUSR)


def _runner(tmp_path: Path) -> Path:
    runner = tmp_path / "qnn_executor_runner"
    runner.write_bytes(_ARM64_ELF + bytes(64))
    return runner


def _pipeline_error(argv: list[str], out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert pipeline_cli.main(["--model", "tiny-cnn", "--out", str(out), "-q", *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert not list(out.glob("*-*")), "a stage ran before the device was checked"
    return errors[0]


def test_no_adb_is_one_line_before_any_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no adb, wherever this test runs
    line = _pipeline_error(["--device", "auto", "--device-runner", str(_runner(tmp_path))],
                           tmp_path / "out", capsys)
    assert "'adb' is not on PATH; install Android platform-tools" in line, line


def test_a_serial_adb_does_not_list_is_one_line_before_any_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_adb(tmp_path / "bin", "emulator-5554\tdevice")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    line = _pipeline_error(["--device", "R5CX", "--device-runner", str(_runner(tmp_path))],
                           tmp_path / "out", capsys)
    assert "serial 'R5CX' (adb does not list it)" in line, line


def test_a_missing_runner_names_the_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_adb(tmp_path / "bin", "emulator-5554\tdevice")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    line = _pipeline_error(["--device", "auto"], tmp_path / "out", capsys)
    assert "pass --device-runner" in line, line


def test_a_ready_device_passes_the_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_adb(tmp_path / "bin", "emulator-5554\tdevice")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    check_device_ready(InferConfig(device="emulator-5554", device_runner=_runner(tmp_path)))
    check_device_ready(InferConfig())  # no device: nothing to check
    with pytest.raises(BackendNotAvailableError, match="unauthorized"):
        _fake_adb(tmp_path / "bin", "emulator-5554\tunauthorized")
        check_device_ready(InferConfig(device="auto", device_runner=_runner(tmp_path)))
