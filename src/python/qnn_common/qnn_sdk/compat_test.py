"""check_compatible: what ExecuTorch 1.5.1 can drive is allowed, warned about, or refused."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from qnn_common.errors import BackendNotAvailableError
from qnn_common.qnn_sdk import QnnSdk, check_compatible

# What the dev SDK reports (sdk_test checks the real one).
DEV_SDK = QnnSdk(
    root=Path("/cache/qnn-sdk/0123456789abcdef"),
    qnn_version="2.51.0",
    core_api_version="2.40.0",
    backend_api_version="5.51.0",
    build_id="v2.51.0.250822",
    bridged=True,
    source="onnxruntime-qnn==2.7.0 (x86 dev SDK, bridged)",
)


def test_check_compatible(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="qnn_common.qnn_sdk")
    check_compatible(DEV_SDK)  # bridged 2.51
    assert not caplog.records

    def unbridged(version: str) -> QnnSdk:
        return dataclasses.replace(DEV_SDK, bridged=False, qnn_version=version)

    for refused in ("2.47.0", "2.51.0", "3.0.0"):
        with pytest.raises(BackendNotAvailableError, match="2.37"):
            check_compatible(unbridged(refused))
    check_compatible(unbridged("2.37.0"))
    assert not caplog.records
    check_compatible(unbridged("2.42.1"))
    assert "untested" in caplog.text
    caplog.clear()
    check_compatible(unbridged("2.30.0"))
    assert "older" in caplog.text
    # The bridge writes the new layout: in front of an old library it would corrupt the config.
    with pytest.raises(BackendNotAvailableError, match="onnxruntime-qnn==2.7.0"):
        check_compatible(dataclasses.replace(DEV_SDK, qnn_version="2.40.0"))
