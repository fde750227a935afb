"""What the infer stage does differently per backend (`InferBackend`), and what a runtime setup
reports (`RuntimeInfo`): the types every backend module provides, apart from the lookup of those
modules (`qnn_infer.backends`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qnn_common.soc import HtpArch


@dataclass(frozen=True)
class RuntimeInfo:
    """What was set up for a program's delegates: for the manifest's metrics and tool versions."""

    record: dict[str, Any] = field(default_factory=dict)
    tools: dict[str, str] = field(default_factory=dict)
    qnn_sdk_root: Path | None = None
    qnn_bridged: bool = False


def _no_device_libs(runtime: RuntimeInfo, arch: HtpArch | None) -> tuple[list[Path], list[str]]:
    # Kernels linked into the device runner binary need no library pushed beside it.
    return [], []


@dataclass(frozen=True)
class InferBackend:
    """One backend's part of running a program.

    `prepare` makes this process able to run the backend's delegates (a library to load, an SDK
    to activate) and says what it set up. `device_libs` names the files an Android device run
    pushes beside the program (for an HTP program, `arch` picks them), and what is missing, each
    said so the user knows where to get it. `start_failure`, if the delegate can fail to start
    for want of a setup, explains that failure of loading `pte` (the runtime's error `exc`).
    """

    prepare: Callable[[], RuntimeInfo] = RuntimeInfo
    device_libs: Callable[[RuntimeInfo, HtpArch | None], tuple[list[Path], list[str]]] = (
        _no_device_libs
    )
    start_failure: Callable[[Path, Exception], str] | None = None


# XNNPACK and portable kernels are linked into ExecuTorch's Python runtime and the device runner,
# and need nothing.
LINKED_KERNELS = InferBackend()
