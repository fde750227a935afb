"""Every test here runs with its own dev SDK cache and without QNN_SDK_ROOT from the caller."""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from qnn_common.cli.child_env import python_child_env
from qnn_common.qnn_sdk import QnnSdk, find_qnn_sdk


@pytest.fixture(scope="module")
def dev_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("qnn-pipeline-cache")


@pytest.fixture(autouse=True)
def _isolated_env(dev_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QNN_PIPELINE_CACHE", str(dev_cache))
    monkeypatch.delenv("QNN_SDK_ROOT", raising=False)


@pytest.fixture(scope="module")
def dev_sdk(dev_cache: Path) -> Iterator[QnnSdk]:
    """One real assembly shared by the test module (it links or copies about 250 MB)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QNN_PIPELINE_CACHE", str(dev_cache))
        mp.delenv("QNN_SDK_ROOT", raising=False)
        start = time.monotonic()
        sdk = find_qnn_sdk()
        print(f"dev QNN SDK assembled in {time.monotonic() - start:.2f} s at {sdk.root}")
    yield sdk


@pytest.fixture
def wheel_package_dir() -> Path:
    """The installed onnxruntime_qnn package directory."""
    spec = importlib.util.find_spec("onnxruntime_qnn")
    assert spec is not None and spec.submodule_search_locations, "onnxruntime-qnn not installed"
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture
def child_env(_isolated_env: None) -> dict[str, str]:
    """A child Python's environment: this test's imports and cache, and no QNN_SDK_ROOT."""
    return python_child_env({k: v for k, v in os.environ.items() if k != "QNN_SDK_ROOT"})
