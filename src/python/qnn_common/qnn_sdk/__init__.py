"""The Qualcomm QNN SDK that ExecuTorch's QNN backend loads: find it, assemble it, activate it.

Two kinds of SDK are used:

- A Qualcomm SDK (QNN / QAIRT) named by ``QNN_SDK_ROOT``: used as it is, only checked.
- Otherwise the project's x86 development SDK, assembled on first use from PyPI's
  ``onnxruntime-qnn==2.7.0`` wheel (x86_64 QNN 2.51 libraries) plus a stand-in ``libQnnHtp.so``
  compiled from ``htp_bridge.c``, which lets ExecuTorch 1.5.1 (built against QNN 2.37) drive
  QNN 2.51. It serves ahead-of-time compilation and HTP emulation on x86, never a device.

The order of the calls matters and `activate` enforces it; `ready_qnn_sdk()` makes them::

    sdk = find_qnn_sdk()
    check_compatible(sdk)   # these two: `preflight_qnn_sdk()`, what every QNN step calls
    activate(sdk)       # before any ExecuTorch QNN compile or QNN program run in this process

`qnn-sdk-setup` (`main`) assembles the dev SDK ahead of time and prints where it is.

Modules: `sdk` (the record, and which SDK to use), `dev_package` (the onnxruntime-qnn wheel),
`assemble` (building the dev SDK from it), `bridge` (compiling htp_bridge.c), `probe` (the
versions the libraries report), `compat` (version skew), `activation` (loading into the
process), `cli` (`qnn-sdk-setup`), `layout` and `versions` (the paths and versions they share).
"""

from qnn_common.qnn_sdk.activation import activate, preflight_qnn_sdk, ready_qnn_sdk
from qnn_common.qnn_sdk.cli import main
from qnn_common.qnn_sdk.compat import check_compatible
from qnn_common.qnn_sdk.layout import (
    ENV_CACHE,
    ENV_SDK_ROOT,
    HTP_LIB,
    LIB_SUBDIR,
    SYSTEM_LIB,
    dev_sdk_cache_dir,
)
from qnn_common.qnn_sdk.sdk import QnnSdk, find_qnn_sdk

__all__ = [
    "ENV_CACHE",
    "ENV_SDK_ROOT",
    "HTP_LIB",
    "LIB_SUBDIR",
    "SYSTEM_LIB",
    "QnnSdk",
    "activate",
    "check_compatible",
    "dev_sdk_cache_dir",
    "find_qnn_sdk",
    "main",
    "preflight_qnn_sdk",
    "ready_qnn_sdk",
]
