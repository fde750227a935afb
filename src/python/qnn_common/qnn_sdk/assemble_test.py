"""The x86 dev SDK assembled for real from onnxruntime-qnn: its layout, its cache, its lock."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from qnn_common.errors import BackendNotAvailableError
from qnn_common.qnn_sdk import QnnSdk, find_qnn_sdk
from qnn_common.qnn_sdk.assemble import MARKER
from qnn_common.qnn_sdk.layout import HTP_LIB, REAL_HTP_LIB, SYSTEM_LIB


def test_dev_sdk_layout(dev_sdk: QnnSdk, dev_cache: Path, wheel_package_dir: Path) -> None:
    assert dev_sdk.root.parent == dev_cache / "qnn-sdk"
    assert len(dev_sdk.root.name) == 16
    assert dev_sdk.lib_dir == dev_sdk.root / "lib" / "x86_64-linux-clang"
    wheel_libs = {p.name for p in wheel_package_dir.glob("lib*.so")}
    assert {HTP_LIB, SYSTEM_LIB, "libHtpPrepare.so"} <= wheel_libs
    sdk_libs = {p.name for p in dev_sdk.lib_dir.iterdir()}
    assert sdk_libs == (wheel_libs - {HTP_LIB}) | {REAL_HTP_LIB, HTP_LIB}
    # The real library is the wheel's, unchanged; the one ExecuTorch loads is the small bridge.
    real = dev_sdk.lib_dir / REAL_HTP_LIB
    assert real.stat().st_size == (wheel_package_dir / HTP_LIB).stat().st_size
    assert (dev_sdk.lib_dir / HTP_LIB).stat().st_size < 1 << 20
    # The wheel's RPATH $ORIGIN/../onnxruntime_qnn.libs must resolve inside the SDK.
    runtime = {p.name.split("-")[0] for p in (dev_sdk.root / "lib/onnxruntime_qnn.libs").iterdir()}
    assert runtime == {"libc++", "libc++abi", "libunwind"}
    assert not (dev_sdk.root / "lib" / "x86_64-linux-clang").is_symlink()


def test_second_call_is_a_no_op(dev_sdk: QnnSdk) -> None:
    watched = [dev_sdk.root, dev_sdk.root / MARKER, dev_sdk.lib_dir / HTP_LIB]
    before = [p.stat().st_mtime_ns for p in watched]
    start = time.monotonic()
    assert find_qnn_sdk() == dev_sdk
    assert find_qnn_sdk(assemble=False) == dev_sdk
    elapsed = time.monotonic() - start
    assert [p.stat().st_mtime_ns for p in watched] == before
    assert not list(dev_sdk.root.parent.glob(".tmp-*"))
    assert elapsed < 5, f"a cached lookup took {elapsed:.1f} s"


def test_directory_without_marker_is_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wheel_package_dir: Path
) -> None:
    monkeypatch.setenv("QNN_PIPELINE_CACHE", str(tmp_path))
    first = find_qnn_sdk()
    (first.root / MARKER).unlink()
    (first.root / "half-written").write_text("an interrupted build leaves things like this")
    leftover = first.root.parent / f".tmp-{first.root.name}-dead"
    leftover.mkdir()
    # A Pants sandbox may have no PATH: the compiler is found in /usr/bin all the same.
    monkeypatch.setenv("PATH", "")

    def cross_device_link(src: object, dst: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    # A cache on another file system cannot hard-link: the rebuild copies instead.
    monkeypatch.setattr(os, "link", cross_device_link)
    with pytest.raises(BackendNotAvailableError, match="not assembled yet"):
        find_qnn_sdk(assemble=False)
    second = find_qnn_sdk()
    assert second == first
    assert (second.root / MARKER).is_file()
    assert not (second.root / "half-written").exists()
    assert not leftover.exists()
    real = (second.lib_dir / REAL_HTP_LIB).stat()
    original = (wheel_package_dir / HTP_LIB).stat()
    assert (real.st_size, real.st_nlink) == (original.st_size, 1)


def test_assemble_false_says_how_to_assemble(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QNN_PIPELINE_CACHE", str(tmp_path))
    with pytest.raises(BackendNotAvailableError, match="qnn-sdk-setup"):
        find_qnn_sdk(assemble=False)
    assert not (tmp_path / "qnn-sdk").exists()


def test_concurrent_assemblies_end_with_one_sdk(tmp_path: Path, child_env: dict[str, str]) -> None:
    cache = tmp_path / "cache"
    script = textwrap.dedent(
        """
        import logging, sys, time
        from pathlib import Path
        from qnn_common.qnn_sdk import find_qnn_sdk
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        Path(sys.argv[1] + ".ready").touch()
        while not Path(sys.argv[2]).exists():
            time.sleep(0.002)
        print(find_qnn_sdk().root)
        """
    )
    go = tmp_path / "go"
    env = {**child_env, "QNN_PIPELINE_CACHE": str(cache)}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path / f"child{i}"), str(go)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"child{i}.ready").exists() for i in range(2)):
        assert time.monotonic() < deadline, "children did not start"
        assert all(c.poll() is None for c in children), [c.communicate() for c in children]
        time.sleep(0.01)
    go.touch()
    results = [c.communicate(timeout=300) for c in children]
    for child, (_, err) in zip(children, results, strict=True):
        assert child.returncode == 0, err
    roots = {out.strip() for out, _ in results}
    assert len(roots) == 1
    logs = "".join(err for _, err in results)
    assert logs.count("assembled the QNN dev SDK") == 1, logs
    entries = sorted(p.name for p in (cache / "qnn-sdk").iterdir() if not p.name.endswith(".lock"))
    assert entries == [Path(roots.pop()).name]
