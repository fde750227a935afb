"""The QNN SDK this process uses: the one ``QNN_SDK_ROOT`` names, else the project's dev SDK."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qnn_common.errors import BackendNotAvailableError
from qnn_common.qnn_sdk.assemble import assembled_dev_sdk, read_marker
from qnn_common.qnn_sdk.dev_package import (
    DEV_DISTRIBUTION_VERSION,
    DEV_SDK_EXTRA,
    find_dev_package,
)
from qnn_common.qnn_sdk.layout import ENV_SDK_ROOT, HTP_LIB, LIB_SUBDIR, SYSTEM_LIB
from qnn_common.qnn_sdk.probe import is_bridged, probe_libraries_cached, qnn_version
from qnn_common.qnn_sdk.versions import version_text


@dataclass(frozen=True)
class QnnSdk:
    """A QNN SDK on disk, with the versions its HTP backend library reports."""

    root: Path  # what QNN_SDK_ROOT points at
    qnn_version: str  # "2.51.0": from the backend build id, else "2.<backend API minor>"
    core_api_version: str  # "2.40.0"
    backend_api_version: str  # "5.51.0"
    build_id: str  # what QnnBackend_getBuildId returns, "" if unavailable
    bridged: bool  # True for the project's dev SDK (htp_bridge.c in front of the real library)
    source: str  # "QNN_SDK_ROOT" or "onnxruntime-qnn==2.7.0 (x86 dev SDK, bridged)"

    @property
    def lib_dir(self) -> Path:
        """root / "lib" / "x86_64-linux-clang": where ExecuTorch loads the libraries from."""
        return self.root / LIB_SUBDIR

    def record(self) -> dict[str, object]:
        """The SDK as plain JSON values, for manifests."""
        return {
            "root": str(self.root),
            "qnn_version": self.qnn_version,
            "core_api_version": self.core_api_version,
            "backend_api_version": self.backend_api_version,
            "build_id": self.build_id,
            "bridged": self.bridged,
            "source": self.source,
        }


def find_qnn_sdk(*, assemble: bool = True) -> QnnSdk:
    """The QNN SDK this process should use.

    ``QNN_SDK_ROOT`` set (non-empty): that SDK, checked for its libraries and probed for its
    versions. Otherwise the project's x86 dev SDK built from the installed onnxruntime-qnn
    package, assembled into `dev_sdk_cache_dir` on first use (with ``assemble=False`` a missing
    assembly is an error instead). Raises BackendNotAvailableError saying what is missing.
    """
    env_root = os.environ.get(ENV_SDK_ROOT, "")
    if env_root:
        return _sdk_from_env(env_root)
    package = find_dev_package()
    if package is None:
        raise BackendNotAvailableError(
            "no QNN SDK: QNN_SDK_ROOT is not set and the Python package onnxruntime-qnn is not "
            "installed. Either set QNN_SDK_ROOT to a Qualcomm SDK (QNN / QAIRT) with x86_64 "
            "libraries in lib/x86_64-linux-clang/, or install the x86 dev SDK, the "
            f"`{DEV_SDK_EXTRA}` extra (Linux x86_64; it brings onnxruntime-qnn=="
            f"{DEV_DISTRIBUTION_VERSION}): `pip install 'qnn-common[{DEV_SDK_EXTRA}]'`, or the "
            f"same extra of the stage you use (`pip install 'qnn-compile[{DEV_SDK_EXTRA}]'`), "
            "then run `qnn-sdk-setup`"
        )
    root, marker = assembled_dev_sdk(package, assemble=assemble)
    return _sdk_from_marker(root, marker, source=package.source)


def _sdk_from_env(value: str) -> QnnSdk:
    root = Path(value).expanduser().resolve()
    lib_dir = root / LIB_SUBDIR
    for name in (HTP_LIB, SYSTEM_LIB):
        if not (lib_dir / name).is_file():
            raise BackendNotAvailableError(
                f"QNN_SDK_ROOT={value} is not a usable QNN SDK: {lib_dir / name} does not exist "
                "(ExecuTorch loads the x86_64 libraries from $QNN_SDK_ROOT/lib/x86_64-linux-clang/"
                "). Point QNN_SDK_ROOT at a Qualcomm SDK (QNN / QAIRT) with x86_64 libraries, or "
                "unset QNN_SDK_ROOT to use the project's x86 dev SDK (`qnn-sdk-setup` "
                "assembles it)"
            )
    # `export QNN_SDK_ROOT=$(qnn-sdk-setup --print-root)` names our own dev SDK, and a bridge can
    # be assembled by hand: report it as bridged, or check_compatible would refuse a QNN 2.51.
    marker = read_marker(root)
    if marker is not None:
        return _sdk_from_marker(root, marker, source=ENV_SDK_ROOT)
    probe = probe_libraries_cached(lib_dir)
    return _sdk_from_probe(root, probe, bridged=is_bridged(probe), source=ENV_SDK_ROOT)


def _sdk_from_marker(root: Path, marker: dict[str, Any], *, source: str) -> QnnSdk:
    return _sdk_from_probe(root, marker["probe"], bridged=True, source=source)


def _sdk_from_probe(root: Path, probe: dict[str, Any], *, bridged: bool, source: str) -> QnnSdk:
    return QnnSdk(
        root=root,
        qnn_version=qnn_version(probe),
        core_api_version=version_text(probe["core_api"]),
        backend_api_version=version_text(probe["backend_api"]),
        build_id=probe.get("build_id") or "",
        bridged=bridged,
        source=source,
    )
