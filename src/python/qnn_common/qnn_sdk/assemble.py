"""Assembling the project's x86 dev QNN SDK from the installed onnxruntime-qnn wheel.

The wheel's libraries are hard-linked (else copied) into a cache directory named by a key of
exactly what goes in, the real libQnnHtp.so is renamed and the compiled bridge takes its name,
and a marker written last says the assembly is complete. A file lock lets one process build it
while others wait.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from qnn_common.errors import BackendNotAvailableError
from qnn_common.qnn_sdk.bridge import (
    BRIDGE_CFLAGS,
    BRIDGE_LDLIBS,
    BRIDGE_RESOURCE,
    compile_bridge,
    read_bridge_source,
)
from qnn_common.qnn_sdk.dev_package import (
    DEV_DISTRIBUTION,
    DEV_DISTRIBUTION_VERSION,
    DEV_PACKAGE,
    DEV_RUNTIME_LIBS,
    DevPackage,
)
from qnn_common.qnn_sdk.layout import (
    ENV_CACHE,
    HTP_LIB,
    LIB_SUBDIR,
    REAL_HTP_LIB,
    SYSTEM_LIB,
    dev_sdk_cache_dir,
)
from qnn_common.qnn_sdk.probe import is_bridged, probe_libraries, qnn_version
from qnn_common.qnn_sdk.versions import EXECUTORCH_QNN_VERSION, version_text

log = logging.getLogger(__name__)

MARKER = "sdk.json"
MARKER_FORMAT = "qnn-pipeline-dev-qnn-sdk"
# Bumped when the assembled layout changes, so old cache entries are not mistaken for new ones.
LAYOUT_VERSION = 1


def assembled_dev_sdk(package: DevPackage, *, assemble: bool) -> tuple[Path, dict[str, Any]]:
    """The dev SDK's root and marker, assembling it first if needed (and `assemble` allows)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        # ExecuTorch loads host libraries from lib/x86_64-linux-clang/ only.
        raise BackendNotAvailableError(
            f"the project's dev QNN SDK is x86_64-only and this machine is {platform.machine()}: "
            "set QNN_SDK_ROOT to a Qualcomm SDK for this host"
        )
    bridge_source = read_bridge_source()
    key = _dev_key(package, bridge_source)
    cache = dev_sdk_cache_dir()
    root = cache / key[:16]
    marker = read_marker(root, key=key)
    if marker is not None:
        return root, marker
    if not assemble:
        raise BackendNotAvailableError(
            f"the project's x86 dev QNN SDK is not assembled yet (expected at {root}): run "
            "`qnn-sdk-setup`, or set QNN_SDK_ROOT to a Qualcomm SDK"
        )
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise BackendNotAvailableError(
            f"cannot create the QNN dev SDK cache {cache}: {err}. Set {ENV_CACHE} to a writable "
            "directory"
        ) from err
    with _exclusive_lock(cache / f".{key[:16]}.lock"):
        # Another process may have finished it while this one waited for the lock.
        marker = read_marker(root, key=key)
        if marker is None:
            marker = _assemble(package, bridge_source, key, root)
    return root, marker


def read_marker(root: Path, *, key: str | None = None) -> dict[str, Any] | None:
    """The dev SDK's completion record, or None unless the assembly under `root` is complete."""
    try:
        data = json.loads((root / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != MARKER_FORMAT:
        return None
    if data.get("layout") != LAYOUT_VERSION or not isinstance(data.get("probe"), dict):
        return None
    if key is not None and data.get("key") != key:
        return None
    lib_dir = root / LIB_SUBDIR
    if not all((lib_dir / name).is_file() for name in (HTP_LIB, REAL_HTP_LIB, SYSTEM_LIB)):
        return None
    return data


def _dev_key(package: DevPackage, bridge_source: bytes) -> str:
    # Only the RECORD rows of the files we take (each with its sha256, so no need to hash 250 MB):
    # the rest of RECORD varies by installer (INSTALLER, REQUESTED, .pyc) and would split one SDK
    # into several cache dirs.
    payload = {
        "layout": LAYOUT_VERSION,
        "record": [list(row) for row in package.record_rows],
        "bridge_sha256": hashlib.sha256(bridge_source).hexdigest(),
        "compile": [*BRIDGE_CFLAGS, *BRIDGE_LDLIBS],
    }
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


@contextlib.contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    with open(path, "a+b") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("another process is assembling the QNN dev SDK; waiting for it (%s)", path)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
def _assemble(package: DevPackage, bridge_source: bytes, key: str, root: Path) -> dict[str, Any]:
    """Build the dev SDK in a temp sibling of `root`, then rename it into place (with the lock)."""
    start = time.monotonic()
    if package.version != DEV_DISTRIBUTION_VERSION:
        log.warning(
            "assembling the QNN dev SDK from %s %s; the bridge was verified with %s only",
            DEV_DISTRIBUTION,
            package.version,
            DEV_DISTRIBUTION_VERSION,
        )
    log.info("assembling the QNN dev SDK from %s into %s", package.source, root)
    cache = root.parent
    # We hold the lock: leftovers of this key are from a process that died mid-build.
    for stale in [*cache.glob(f".tmp-{key[:16]}-*"), *cache.glob(f".old-{key[:16]}-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:16]}-", dir=cache))
    try:
        # mkdtemp makes 0700; the SDK is ordinary shared data.
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)
        lib_dir = tmp / LIB_SUBDIR
        runtime_dir = tmp / "lib" / DEV_RUNTIME_LIBS
        lib_dir.mkdir(parents=True)
        runtime_dir.mkdir(parents=True)
        linked = 0
        for rel, _, _ in package.record_rows:
            top, name = rel.split("/")
            if top == DEV_PACKAGE:
                src = package.package_dir / name
                dst = lib_dir / (REAL_HTP_LIB if name == HTP_LIB else name)
            else:
                src = package.runtime_libs_dir / name
                dst = runtime_dir / name
            if not src.is_file():
                raise BackendNotAvailableError(
                    f"{src} belongs to {DEV_DISTRIBUTION} but is missing: reinstall "
                    f"{DEV_DISTRIBUTION}=={DEV_DISTRIBUTION_VERSION}"
                )
            linked += _link_or_copy(src, dst)
        for required in (REAL_HTP_LIB, SYSTEM_LIB):
            if not (lib_dir / required).is_file():
                raise BackendNotAvailableError(
                    f"{DEV_DISTRIBUTION} {package.version} at {package.package_dir} has no "
                    f"{HTP_LIB if required == REAL_HTP_LIB else required}: install "
                    f"{DEV_DISTRIBUTION}=={DEV_DISTRIBUTION_VERSION} (the Linux x86_64 wheel)"
                )
        copied_s = time.monotonic() - start
        src_dir = tmp / "src"
        src_dir.mkdir()
        (src_dir / BRIDGE_RESOURCE).write_bytes(bridge_source)
        compiler = compile_bridge(src_dir / BRIDGE_RESOURCE, lib_dir / HTP_LIB)
        probe_start = time.monotonic()
        probe = probe_libraries(lib_dir)
        probe_s = time.monotonic() - probe_start
        if not is_bridged(probe):
            raise BackendNotAvailableError(
                f"the freshly built bridge {lib_dir / HTP_LIB} did not take over deviceCreate "
                f"(probe: {probe}); htp_bridge.c does not fit this QNN version. Install "
                f"{DEV_DISTRIBUTION}=={DEV_DISTRIBUTION_VERSION}, or set QNN_SDK_ROOT to a QNN "
                f"{version_text(EXECUTORCH_QNN_VERSION)} SDK"
            )
        marker: dict[str, Any] = {
            "format": MARKER_FORMAT,
            "layout": LAYOUT_VERSION,
            "key": key,
            "source": package.source,
            DEV_DISTRIBUTION: package.version,
            "bridge_sha256": hashlib.sha256(bridge_source).hexdigest(),
            "compiler": compiler,
            "compile": [*BRIDGE_CFLAGS, *BRIDGE_LDLIBS],
            "probe": probe,
            "assembly_seconds": round(time.monotonic() - start, 3),
            "probe_seconds": round(probe_s, 3),
            "created_unix": time.time(),
        }
        # Written last: a directory without it is an interrupted build and is never trusted.
        (tmp / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
        if root.exists():
            # An untrusted leftover (no marker, or files missing). rename() cannot replace a
            # non-empty directory, so move it aside first.
            old = Path(tempfile.mkdtemp(prefix=f".old-{key[:16]}-", dir=cache))
            os.replace(root, old / "sdk")
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info(
        "assembled the QNN dev SDK in %.1f s (%d of %d files hard-linked, copying %.1f s, "
        "version probe %.2f s): QNN %s at %s",
        time.monotonic() - start,
        linked,
        len(package.record_rows),
        copied_s,
        probe_s,
        qnn_version(probe),
        root,
    )
    return marker


def _link_or_copy(src: Path, dst: Path) -> int:
    """Hard-link `src` to `dst` (instant, no space), else copy it; 1 if linked, else 0."""
    try:
        os.link(src, dst)  # follows a symlinked src (pex venvs link into their wheel cache)
        return 1
    except OSError:
        shutil.copy2(src, dst)
        return 0
