"""Where a QNN SDK keeps the libraries ExecuTorch loads, and where the project's dev SDKs live."""

from __future__ import annotations

import os
from pathlib import Path

from qnn_common.errors import BackendNotAvailableError

ENV_SDK_ROOT = "QNN_SDK_ROOT"
ENV_CACHE = "QNN_PIPELINE_CACHE"
LIB_SUBDIR = Path("lib") / "x86_64-linux-clang"
HTP_LIB = "libQnnHtp.so"
SYSTEM_LIB = "libQnnSystem.so"
# The bridge dlopens the real library under this name from its own directory (htp_bridge.c).
REAL_HTP_LIB = "libQnnHtp.real.so"


def dev_sdk_cache_dir() -> Path:
    """Where dev SDKs are assembled: $QNN_PIPELINE_CACHE/qnn-sdk, else ~/.cache/qnn-pipeline/..."""
    env = os.environ.get(ENV_CACHE, "")
    if env:
        return Path(env).expanduser().resolve() / "qnn-sdk"
    try:
        # Falls back to the password database when HOME is unset (Pants sandboxes, cron).
        home = Path.home()
    except RuntimeError as err:
        raise BackendNotAvailableError(
            f"cannot find a home directory for the QNN dev SDK cache ({err}): set {ENV_CACHE} "
            "to a writable directory"
        ) from err
    return home / ".cache" / "qnn-pipeline" / "qnn-sdk"
