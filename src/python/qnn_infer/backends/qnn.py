"""QNN at run time: the SDK's libraries loaded in this process (on x86 they run the HTP
emulator), and for an Android device the SDK's Android and Hexagon libraries for the HTP arch.

A QNN program on a phone needs the SDK's Android build of the QNN libraries (libQnnHtp.so,
libQnnSystem.so, the HTP stub for the SoC's arch) and the Hexagon skel library for that arch. They
come from a Qualcomm SDK (QNN_SDK_ROOT); the project's x86 development SDK has none of them.
"""

from __future__ import annotations

import logging
from pathlib import Path

from qnn_common.soc import HtpArch
from qnn_infer.backends.runtime import InferBackend, RuntimeInfo

log = logging.getLogger(__name__)


def prepare() -> RuntimeInfo:
    """Find the SDK (QNN_SDK_ROOT, or the project's x86 development SDK), check it for version
    skew, and load its libraries (after torch and the ExecuTorch runtime, as they require)."""
    from qnn_common.qnn_sdk import ready_qnn_sdk

    sdk = ready_qnn_sdk()
    log.info("QNN %s from %s%s", sdk.qnn_version, sdk.root,
             " (x86 emulation through the compatibility bridge)" if sdk.bridged else "")
    return RuntimeInfo(
        record={"qnn_sdk": sdk.record()},
        tools={"qnn": sdk.qnn_version, "qnn_bridge": "yes" if sdk.bridged else "no"},
        qnn_sdk_root=sdk.root,
        qnn_bridged=sdk.bridged,
    )


def qnn_device_libs(sdk_root: Path, arch: HtpArch) -> list[Path]:
    """The QNN SDK files a device run of an HTP program needs, for HTP `arch` (e.g. V75)."""
    v = arch.name.lower()  # "v75"
    android = sdk_root / "lib" / "aarch64-android"
    return [
        android / "libQnnHtp.so",
        android / "libQnnSystem.so",
        android / f"libQnnHtp{arch.name}Stub.so",
        sdk_root / "lib" / f"hexagon-{v}" / "unsigned" / f"libQnnHtp{arch.name}Skel.so",
    ]


def device_libs(runtime: RuntimeInfo, arch: HtpArch | None) -> tuple[list[Path], list[str]]:
    """The SDK's libraries a device run pushes, and what is missing (`arch`: from the compile
    artifact's SoC, it picks the stub and skel libraries)."""
    if runtime.qnn_bridged or runtime.qnn_sdk_root is None:
        return [], [
            "the QNN libraries built for Android and Hexagon, which only a Qualcomm SDK "
            "ships (the project's x86 development SDK emulates the HTP on this host and has "
            "none); set QNN_SDK_ROOT to a QNN SDK matching executorch's (2.37)"
        ]
    if arch is None:
        return [], ["the program's HTP arch (run infer on a compile artifact, not a .pte)"]
    libs = qnn_device_libs(runtime.qnn_sdk_root, arch)
    return libs, [f"{lib} (from the QNN SDK)" for lib in libs if not lib.is_file()]


def start_failure(pte: Path, exc: Exception) -> str:
    """The QNN backend failed to start: most often, its libraries were never loaded."""
    return (
        f"{pte} holds a QNN delegate and the QNN backend failed to start "
        f"({exc}); it needs the QNN libraries loaded first: qnn-infer does that, and "
        "library callers call qnn_infer.runtimes.prepare_runtime({Backend.QNN}) (the "
        "SDK from QNN_SDK_ROOT, or the project's x86 development SDK)"
    )


BACKEND = InferBackend(prepare=prepare, device_libs=device_libs, start_failure=start_failure)
