"""Which QNN SDK is used: QNN_SDK_ROOT checked and probed, else the dev SDK, else a way out."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from qnn_common.errors import BackendNotAvailableError
from qnn_common.qnn_sdk import QnnSdk, check_compatible, find_qnn_sdk, sdk
from qnn_common.qnn_sdk.layout import HTP_LIB, REAL_HTP_LIB, SYSTEM_LIB

DEV_SOURCE = "onnxruntime-qnn==2.7.0 (x86 dev SDK, bridged)"


def test_dev_sdk_versions_are_probed_from_the_real_library(dev_sdk: QnnSdk) -> None:
    assert dev_sdk.core_api_version == "2.40.0"
    assert dev_sdk.backend_api_version == "5.51.0"
    assert dev_sdk.qnn_version.startswith("2.51.")
    assert dev_sdk.build_id.startswith("v2.51.")
    assert dev_sdk.bridged
    assert dev_sdk.source == DEV_SOURCE
    record = dev_sdk.record()
    assert record == json.loads(json.dumps(record))
    assert record["root"] == str(dev_sdk.root)
    assert set(record) == {
        "root",
        "qnn_version",
        "core_api_version",
        "backend_api_version",
        "build_id",
        "bridged",
        "source",
    }


def test_env_root_empty_dir_names_the_missing_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QNN_SDK_ROOT", str(tmp_path))
    with pytest.raises(BackendNotAvailableError) as info:
        find_qnn_sdk()
    message = str(info.value)
    assert str(tmp_path / "lib" / "x86_64-linux-clang" / HTP_LIB) in message
    assert "unset QNN_SDK_ROOT" in message
    assert "qnn-sdk-setup" in message


def test_env_root_with_only_htp_names_the_system_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib_dir = tmp_path / "lib" / "x86_64-linux-clang"
    lib_dir.mkdir(parents=True)
    (lib_dir / HTP_LIB).write_bytes(b"")
    monkeypatch.setenv("QNN_SDK_ROOT", str(tmp_path))
    with pytest.raises(BackendNotAvailableError, match=SYSTEM_LIB):
        find_qnn_sdk()


def test_unbridged_qnn_2_51_is_refused_with_the_way_out(
    dev_sdk: QnnSdk, dev_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A "Qualcomm SDK" made of the wheel's unmodified libraries: what a user with QAIRT 2.51 has.
    lib_dir = tmp_path / "lib" / "x86_64-linux-clang"
    lib_dir.mkdir(parents=True)
    os.link(dev_sdk.lib_dir / REAL_HTP_LIB, lib_dir / HTP_LIB)
    for name in (SYSTEM_LIB, "libHtpPrepare.so"):
        os.link(dev_sdk.lib_dir / name, lib_dir / name)
    runtime_libs = dev_sdk.root / "lib" / "onnxruntime_qnn.libs"
    (tmp_path / "lib" / "onnxruntime_qnn.libs").symlink_to(runtime_libs)
    monkeypatch.setenv("QNN_SDK_ROOT", str(tmp_path))
    found = find_qnn_sdk()
    assert found.root == tmp_path.resolve()
    assert found.source == "QNN_SDK_ROOT"
    assert not found.bridged
    assert (found.core_api_version, found.backend_api_version) == ("2.40.0", "5.51.0")
    assert found.qnn_version.startswith("2.51.")
    # The probe is cached by the library's path, mtime and size.
    probes = list((dev_cache / "qnn-sdk" / "probes").glob("*.json"))
    assert probes
    stamps = {p: p.stat().st_mtime_ns for p in probes}
    assert find_qnn_sdk() == found
    assert {p: p.stat().st_mtime_ns for p in probes} == stamps
    with pytest.raises(BackendNotAvailableError) as info:
        check_compatible(found)
    message = str(info.value)
    for expected in ("2.51", "2.37", "QNN_SDK_ROOT", "unset QNN_SDK_ROOT", "qnn-sdk-setup"):
        assert expected in message


def test_env_root_at_the_dev_sdk_stays_bridged(
    dev_sdk: QnnSdk, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `export QNN_SDK_ROOT=$(qnn-sdk-setup --print-root)` must not turn it into a refused SDK.
    monkeypatch.setenv("QNN_SDK_ROOT", str(dev_sdk.root))
    found = find_qnn_sdk()
    assert found.root == dev_sdk.root
    assert found.bridged
    assert found.source == "QNN_SDK_ROOT"
    check_compatible(found)


def test_no_sdk_at_all_says_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sdk, "find_dev_package", lambda: None)
    with pytest.raises(BackendNotAvailableError) as info:
        find_qnn_sdk()
    message = str(info.value)
    for expected in (
        "QNN_SDK_ROOT",
        "onnxruntime-qnn==2.7.0",
        "pip install 'qnn-common[qnn-dev-sdk]'",
        "pip install 'qnn-compile[qnn-dev-sdk]'",
        "qnn-sdk-setup",
    ):
        assert expected in message
