"""Where the dev SDKs are cached when nothing says where."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from qnn_common.qnn_sdk import dev_sdk_cache_dir


def test_cache_dir_without_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QNN_PIPELINE_CACHE")
    monkeypatch.delenv("HOME", raising=False)
    home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    assert dev_sdk_cache_dir() == home / ".cache" / "qnn-pipeline" / "qnn-sdk"
