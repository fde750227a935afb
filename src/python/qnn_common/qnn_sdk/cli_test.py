"""`qnn-sdk-setup`: the root alone for QNN_SDK_ROOT, a summary, or a one-line error."""

from __future__ import annotations

from pathlib import Path

import pytest

from qnn_common.qnn_sdk import QnnSdk, main


def test_cli_prints_the_root_only(dev_sdk: QnnSdk, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--print-root"]) == 0
    assert capsys.readouterr().out == f"{dev_sdk.root}\n"


def test_cli_summary(dev_sdk: QnnSdk, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    expected = (str(dev_sdk.root), "QNN 2.51", "core API 2.40.0", "bridged: yes", dev_sdk.source)
    for text in expected:
        assert text in out


def test_cli_error_is_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("QNN_SDK_ROOT", str(tmp_path))
    assert main(["--print-root"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: QNN_SDK_ROOT=")
