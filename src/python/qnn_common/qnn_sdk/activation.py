"""Loading a QNN SDK into this process, after torch, as the one ExecuTorch uses."""

from __future__ import annotations

import ctypes
import importlib
import logging
import os
import threading
from pathlib import Path

from qnn_common.errors import BackendNotAvailableError
from qnn_common.qnn_sdk.compat import check_compatible
from qnn_common.qnn_sdk.layout import ENV_SDK_ROOT, HTP_LIB, REAL_HTP_LIB, SYSTEM_LIB
from qnn_common.qnn_sdk.sdk import QnnSdk, find_qnn_sdk
from qnn_common.qnn_sdk.versions import EXECUTORCH_VERSION

log = logging.getLogger(__name__)

_activation_lock = threading.Lock()
_active_root: Path | None = None
# Held so the preloaded libraries are never garbage-collected into a dlclose.
_preloaded: list[ctypes.CDLL] = []


def preflight_qnn_sdk() -> QnnSdk:
    """The SDK this process would use, found and checked against ExecuTorch, nothing loaded:
    the one place every QNN step finds it (a pipeline's check before any stage, the compile's
    toolchain digest, and `ready_qnn_sdk`). Raises BackendNotAvailableError saying what is
    missing and what to do."""
    sdk = find_qnn_sdk()
    check_compatible(sdk)
    return sdk


def ready_qnn_sdk() -> QnnSdk:
    """The SDK this process uses, found, checked against ExecuTorch and activated, in the order
    that requires: what a QNN compile or a QNN program run needs first."""
    sdk = preflight_qnn_sdk()
    activate(sdk)
    return sdk


def activate(sdk: QnnSdk) -> None:
    """Make `sdk` the one ExecuTorch uses in this process; idempotent.

    Sets QNN_SDK_ROOT (so ExecuTorch neither downloads an SDK nor looks elsewhere), imports torch
    and executorch.runtime, then preloads libQnnHtp.so and libQnnSystem.so with RTLD_GLOBAL,
    which satisfies ExecuTorch's dlopen of the bare names. That order is required: QNN loaded
    before torch aborts later with `libc++abi: Pure virtual function called!`. A process can use
    one SDK only: activating another raises BackendNotAvailableError.
    """
    global _active_root
    with _activation_lock:
        if _active_root is not None:
            if _active_root == sdk.root:
                return
            raise BackendNotAvailableError(
                f"this process already uses the QNN SDK at {_active_root}; it cannot switch to "
                f"{sdk.root} (QNN libraries stay loaded). Run the work for the other SDK in a "
                "new process"
            )
        lib_dir = sdk.lib_dir.resolve()
        foreign = [p for p in _loaded_qnn_libraries() if p.resolve().parent != lib_dir]
        if foreign:
            raise BackendNotAvailableError(
                f"another QNN SDK's {foreign[0]} is already loaded in this process, so ExecuTorch "
                f"would keep using it instead of {sdk.root}. Activate the QNN SDK before anything "
                "loads QNN, or use a new process"
            )
        previous = os.environ.get(ENV_SDK_ROOT)
        if previous and Path(previous).expanduser().resolve() != sdk.root:
            log.warning("QNN_SDK_ROOT=%s is replaced by %s in this process", previous, sdk.root)
        # Before anything from executorch runs: its setup_qnn_sdk() downloads an SDK otherwise.
        os.environ[ENV_SDK_ROOT] = str(sdk.root)
        try:
            _import_runtime()
            handles = [
                _preload(sdk.lib_dir / HTP_LIB),
                _preload(sdk.lib_dir / SYSTEM_LIB),
            ]
        except BaseException:
            if previous is None:
                os.environ.pop(ENV_SDK_ROOT, None)
            else:
                os.environ[ENV_SDK_ROOT] = previous
            raise
        _preloaded.extend(handles)
        _active_root = sdk.root
        log.info("QNN SDK active: QNN %s at %s (%s)", sdk.qnn_version, sdk.root, sdk.source)


def _import_runtime() -> None:
    # Imported by name so this module (and the `qnn-sdk-setup` PEX) does not depend on torch and
    # executorch: only activation needs them, and only to get the load order right.
    try:
        importlib.import_module("torch")
        importlib.import_module("executorch.runtime")
    except ImportError as err:
        raise BackendNotAvailableError(
            f"activating the QNN SDK needs torch and executorch=={EXECUTORCH_VERSION} in this "
            f"environment ({err}): install them, or depend on the project's qnn_compile / "
            "qnn_infer packages"
        ) from err


def _preload(path: Path) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError as err:
        raise BackendNotAvailableError(
            f"cannot load {path}: {err}. Re-run `qnn-sdk-setup` (dev SDK) or check the SDK at "
            "QNN_SDK_ROOT"
        ) from err


def _loaded_qnn_libraries() -> list[Path]:
    """QNN HTP / System libraries already mapped into this process (Linux /proc/self/maps)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    names = {HTP_LIB, SYSTEM_LIB, REAL_HTP_LIB}
    found: dict[Path, None] = {}
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and os.path.basename(fields[5]) in names:
            found[Path(fields[5])] = None
    return list(found)
