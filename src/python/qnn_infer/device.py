"""Choosing what an Android device run needs: the runner binary and, for QNN, the device libraries.

A QNN program on a phone needs the SDK's Android build of the QNN libraries (libQnnHtp.so,
libQnnSystem.so, the HTP stub for the SoC's arch) and the Hexagon skel library for that arch. They
come from a Qualcomm SDK (QNN_SDK_ROOT); the project's x86 development SDK has none of them.
"""

from __future__ import annotations

from pathlib import Path

from qnn_common.config import InferConfig
from qnn_common.errors import BackendNotAvailableError
from qnn_common.recipes import Backend
from qnn_common.soc import HtpArch
from qnn_infer.runner import DeviceRunner
from qnn_infer.runtimes import RuntimeInfo


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


def device_runner(
    pte: Path, cfg: InferConfig, backends: set[Backend], runtime: RuntimeInfo,
    arch: HtpArch | None = None,
) -> DeviceRunner:
    """A DeviceRunner for `pte` per `cfg.device`, or an error naming everything that is missing.

    For a QNN program `arch` (from the compile artifact's SoC) picks the stub and skel libraries.
    """
    assert cfg.device is not None
    libs: list[Path] = []
    problems: list[str] = []
    if Backend.QNN in backends:
        if runtime.qnn_bridged or runtime.qnn_sdk_root is None:
            problems.append(
                "the QNN libraries built for Android and Hexagon, which only a Qualcomm SDK "
                "ships (the project's x86 development SDK emulates the HTP on this host and has "
                "none); set QNN_SDK_ROOT to a QNN SDK matching executorch's (2.37)"
            )
        elif arch is None:
            problems.append("the program's HTP arch (run infer on a compile artifact, not a .pte)")
        else:
            libs = qnn_device_libs(runtime.qnn_sdk_root, arch)
            problems += [f"{lib} (from the QNN SDK)" for lib in libs if not lib.is_file()]
    try:
        runner = DeviceRunner(
            pte,
            runner_binary=cfg.device_runner,
            serial=None if cfg.device == "auto" else cfg.device,
            device_libs=libs,
        )
    except BackendNotAvailableError as err:
        if not problems:
            raise
        raise BackendNotAvailableError(f"{err}; and {'; '.join(problems)}") from None
    if problems:
        raise BackendNotAvailableError(
            "running on an Android device needs: " + "; ".join(problems)
        )
    return runner
