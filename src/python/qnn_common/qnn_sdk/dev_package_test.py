"""The onnxruntime-qnn wheel's files are identified the same with or without its RECORD."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from qnn_common.qnn_sdk.dev_package import hashed_rows, record_rows
from qnn_common.qnn_sdk.layout import HTP_LIB


def test_hashed_files_give_the_same_key_as_record(dev_cache: Path, wheel_package_dir: Path) -> None:
    # A zipapp PEX's wheel cache has no RECORD: hashing the files must give the same rows (and so
    # the same cache dir) as the RECORD of a pip / venv install.
    record = importlib.metadata.distribution("onnxruntime-qnn").read_text("RECORD")
    expected = record_rows(record)
    assert any(rel.endswith("/" + HTP_LIB) for rel, _, _ in expected)
    runtime_libs = wheel_package_dir.parent / "onnxruntime_qnn.libs"
    assert hashed_rows(wheel_package_dir, runtime_libs) == expected
    memo = dev_cache / "qnn-sdk" / "file-digests.json"
    assert memo.is_file()
    stamp = memo.stat().st_mtime_ns
    assert hashed_rows(wheel_package_dir, runtime_libs) == expected  # from the memo
    assert memo.stat().st_mtime_ns == stamp
