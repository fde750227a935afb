"""Per-backend runtime preparation: what must happen in this process before a program loads.

XNNPACK and portable kernels are linked into ExecuTorch's Python runtime and need nothing. A QNN
delegate needs the QNN libraries loaded (libQnnHtp.so, libQnnSystem.so): on x86 they run the HTP
emulator. The target comes from the compile manifest; for a bare .pte, from the delegates the
program names.
"""

from __future__ import annotations

import importlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qnn_common.cli.noise import native_noise_filtered
from qnn_common.errors import ArtifactError
from qnn_common.llm_spec import LLM_CUSTOM_OPS_MODULE
from qnn_common.recipes import BACKENDS, Backend

log = logging.getLogger(__name__)

# ExecuTorch's backend ids, as a .pte's delegate entries name them.
_BACKEND_IDS = {t.runtime_id: b for b, t in BACKENDS.items() if t.runtime_id is not None}


def host_runtime() -> Any:
    """ExecuTorch's runtime in this process, with the quantized and LLM kernel libraries
    registered: programs that run quantized_decomposed ops outside a delegate (portable 8a8w's
    q / dq, 8da4w's embedding lookups, `embedding_byte` / `embedding_4bit`) or ExecuTorch's
    `llama` custom ops (a causal LM's cache and attention) fail to load methods without them."""
    importlib.import_module("executorch.kernels.quantized")  # imported for their side effect
    importlib.import_module(LLM_CUSTOM_OPS_MODULE)
    from executorch.runtime import Runtime

    return Runtime.get()


def delegates_in(pte: Path) -> set[Backend]:
    """The backends whose delegates a .pte holds (empty: portable kernels only)."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    try:
        program = deserialize_pte_binary(pte.read_bytes()).program
    except Exception as exc:  # the flatbuffer reader raises assorted types on garbage
        raise ArtifactError(pte, f"is not a readable ExecuTorch program ({exc})") from exc
    ids = {d.id for plan in program.execution_plan for d in plan.delegates}
    return {_BACKEND_IDS[i] for i in ids if i in _BACKEND_IDS}


@dataclass(frozen=True)
class RuntimeInfo:
    """What was set up for a program's delegates: for the manifest's metrics and tool versions."""

    record: dict[str, Any] = field(default_factory=dict)
    tools: dict[str, str] = field(default_factory=dict)
    qnn_sdk_root: Path | None = None
    qnn_bridged: bool = False


def prepare_runtime(backends: set[Backend]) -> RuntimeInfo:
    """Make this process able to run delegates of `backends`; say what was set up.

    For QNN: find the SDK (QNN_SDK_ROOT, or the project's x86 development SDK), check it for version
    skew, and load its libraries (after torch and the ExecuTorch runtime, as they require).
    """
    if Backend.QNN not in backends:
        return RuntimeInfo()
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


def cpu_threads(requested: int | None) -> int:
    """The CPU threads a host run uses: `requested`, or every core this process may run on."""
    if requested is not None:
        return requested
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def set_cpu_threads(requested: int | None) -> int:
    """Size the ExecuTorch runtime's threadpool (the one XNNPACK's kernels run on); return it.

    The pool is process-wide: executorch 1.5.1's pybindings resize it with
    `_unsafe_reset_threadpool` ("unsafe" while a method executes; this runs before any does).
    Nothing happens when it already has that many threads.
    """
    from executorch.extension.pybindings import portable_lib

    threads = cpu_threads(requested)
    # The first touch of the pool probes the CPU (cpuinfo), which prints lines to fd 2.
    with native_noise_filtered():
        if portable_lib._threadpool_get_thread_count() != threads:
            portable_lib._unsafe_reset_threadpool(threads)
        return int(portable_lib._threadpool_get_thread_count())
