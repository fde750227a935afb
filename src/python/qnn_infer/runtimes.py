"""The host runtime: what must happen in this process before a program loads.

What each backend needs is its `InferBackend` (`qnn_infer.backends`): XNNPACK and portable
kernels are linked into ExecuTorch's Python runtime and need nothing; a QNN delegate needs the
QNN libraries loaded. The target comes from the compile manifest; for a bare .pte, from the
delegates the program names.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from qnn_common.cli.noise import native_noise_filtered
from qnn_common.errors import ArtifactError
from qnn_common.llm_spec import LLM_CUSTOM_OPS_MODULE
from qnn_common.recipes import Backend
from qnn_infer.backends import BY_RUNTIME_ID, INFER_BACKENDS
from qnn_infer.backends.runtime import RuntimeInfo


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
    return {BY_RUNTIME_ID[i] for i in ids if i in BY_RUNTIME_ID}


def prepare_runtime(backends: set[Backend]) -> RuntimeInfo:
    """Make this process able to run delegates of `backends`; say what was set up (each
    backend's `InferBackend.prepare`: for QNN, its SDK found, checked and loaded)."""
    info = RuntimeInfo()
    for backend in sorted(backends):
        done = INFER_BACKENDS[backend].prepare()
        info = RuntimeInfo(
            record={**info.record, **done.record}, tools={**info.tools, **done.tools},
            qnn_sdk_root=info.qnn_sdk_root or done.qnn_sdk_root,
            qnn_bridged=info.qnn_bridged or done.qnn_bridged,
        )
    return info


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
