"""A program this process did not compile is first loaded and run in a forked child.

ExecuTorch's runtime trusts the `.pte` it is given. One flipped byte in an XNNPACK delegate
segment makes the delegate's compiler log bytes that are not UTF-8, which executorch 1.5.1's
Python log bridge turns into a C++ exception thrown through pybind11: std::terminate, exit 134,
no message, and a staging directory and a lock left behind (issue 27). Other corruptions could
crash in native code the same way. No check of ours can rule that out for every byte, so the
runtime's first contact with such a program happens where an abort cannot take this process down.

`rehearse(pte, rehearsal)` forks; the child calls `rehearsal(step)` (load the program, run
what the caller is about to run on the same inputs, naming each step), with its stdout and
stderr captured, and exits. If it returned or raised a Python exception, the parent goes on and
does the same work for real: the runtime is deterministic, so a clean error recurs in-process
and is reported by the usual path, and a program that ran here runs there. If the child died
(a signal, an abort), the parent raises one ArtifactError naming the program, the step and the
runtime's last words.

The child runs under a memory cap (`qnn_infer.memory_cap`): a program whose plan asks for more
(one flipped byte asked for 20 GB, issue 49) fails an allocation there, and the parent refuses it
with one ArtifactError instead of running it in-process, where nothing would bound it.

Why fork, not a fresh interpreter: the child shares the imported runtime, the loaded QNN
libraries and the inputs, copy-on-write; a new Python would import torch again, seconds per
program. The runtime's threadpool survives a fork (ExecuTorch reinitialises it in the child).

A program this process's compile just wrote skips the rehearsal (a chained pipeline run: the
orchestrator hands the digest compile wrote to infer, `InferInput.compiled_here`, and the file
must still hash to it), so a normal run pays nothing; a cached compile artifact, a `--from X.pte`
or a `qnn-infer` of a directory is rehearsed, at the cost of loading the program and running its
inputs twice.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from qnn_common.cli.noise import stop_filtering_native_output
from qnn_common.cli.support import EXIT_ERROR
from qnn_common.errors import ArtifactError, PipelineError
from qnn_common.store.hashing import sha256_file
from qnn_infer import memory_cap

log = logging.getLogger(__name__)

Step = Callable[[str], None]
Rehearsal = Callable[[Step], object]

# How much of what the runtime printed last is quoted in the error (one line).
_TAIL_CHARS = 240
# The child's exit codes: returned, raised a Python exception, ran out of memory (its cap).
_RETURNED, _RAISED, _OUT_OF_MEMORY = 0, 1, 3
# What the runtime prints when a C++ allocation fails where nothing turns it into a MemoryError.
_NATIVE_OUT_OF_MEMORY = "std::bad_alloc"
_ERROR_PREFIX = "error: "


def rehearse_unless_compiled_here(
    pte: Path, compiled_here: str | None, rehearsal: Rehearsal
) -> None:
    """`rehearse` unless `pte` holds exactly the bytes this process's compile wrote
    (`compiled_here`, their sha256): then nothing to do. A file edited or swapped since hashes
    otherwise and is rehearsed."""
    if compiled_here is not None and sha256_file(pte) == compiled_here:
        log.debug("%s: compiled by this process; running it in-process directly", pte)
        return
    rehearse(pte, rehearsal)


def rehearse(pte: Path, rehearsal: Rehearsal) -> None:
    """Run `rehearsal` in a forked child; raise ArtifactError if the child crashed.

    `rehearsal` receives a `step(description)` callable to say what it is doing ("loading
    method forward"): the last step begun is where a crash is reported. Whatever the child
    prints is captured, not shown (the real run repeats it). Ctrl-C or SIGTERM while waiting kill
    the child and propagate.
    """
    if not hasattr(os, "fork"):  # not a POSIX system: nothing to isolate with
        return
    budget = memory_cap.rehearsal_budget(pte)
    with tempfile.TemporaryFile() as output:
        steps_read, steps_write = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            os.close(steps_read)
            _child(rehearsal, steps_write, output.fileno(), budget)
        os.close(steps_write)
        try:
            with os.fdopen(steps_read, "rb") as steps_file:
                steps = steps_file.read()  # until the child exits and the pipe closes
            _, status, usage = os.wait4(pid, 0)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            raise
        # ru_maxrss is in KiB on Linux.
        log.debug("%s: rehearsed, peak RSS %.0f MiB", pte, usage.ru_maxrss / 1024)
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) in (_RETURNED, _RAISED):
            return
        output.seek(0)
        printed = output.read().decode("utf-8", "backslashreplace")
    bounded = _run_bound_expired(status, printed)
    if bounded is not None:
        raise PipelineError(bounded)  # the bound on one run (qnn_infer.deadline) ended the child
    last_step = steps.decode("utf-8", "replace").splitlines()[-1:] or ["loading it"]
    out_of_memory = os.WIFEXITED(status) and os.WEXITSTATUS(status) == _OUT_OF_MEMORY
    if out_of_memory or _NATIVE_OUT_OF_MEMORY in printed:
        cap = f" ({memory_cap.describe(budget)} more than this process held)" if budget else ""
        raise ArtifactError(
            pte,
            f"the program asked the ExecuTorch runtime for more memory than its rehearsal may "
            f"take{cap} while {last_step[0]}; its memory plan is corrupt, or it was not made by "
            "this pipeline: compile it again from its source (qnn-compile); if you trust it and "
            f"it needs more, set {memory_cap.MEMORY_ENV} to the MiB it may take (0 = no cap)",
        )
    raise ArtifactError(
        pte,
        f"the ExecuTorch runtime crashed ({_describe(status)}) while {last_step[0]}"
        f"{_tail(printed)}; the program is corrupt, or was not made by this pipeline: compile "
        "it again from its source (qnn-compile), or run a program you trust",
    )


def _child(rehearsal: Rehearsal, steps_fd: int, output_fd: int, budget: int | None) -> None:
    code = _RAISED
    try:
        os.dup2(output_fd, 1)
        os.dup2(output_fd, 2)
        stop_filtering_native_output()  # what the runtime prints before it dies is the reason
        if budget is not None:
            memory_cap.cap_this_process(budget)

        def step(description: str) -> None:
            os.write(steps_fd, description.encode("utf-8", "replace") + b"\n")

        rehearsal(step)
        code = _RETURNED
    except MemoryError:  # the runtime's std::bad_alloc: in-process, nothing would cap it
        code = _OUT_OF_MEMORY
    except BaseException:  # the parent meets any other Python error again in-process
        pass  # code stays _RAISED
    finally:
        # No atexit handlers, no buffered output flushed twice, no finally of the parent's stack.
        os._exit(code)


def _run_bound_expired(status: int, printed: str) -> str | None:
    """The deadline's message if the run bound ended the child: it prints its one `error:` line
    and exits with EXIT_ERROR, a code the child itself never uses."""
    if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == EXIT_ERROR):
        return None
    said = [line for line in printed.splitlines() if line.startswith(_ERROR_PREFIX)]
    return said[-1][len(_ERROR_PREFIX):] if said else None


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return f"killed by {name}"
    return f"exit code {os.WEXITSTATUS(status)}"


def _tail(printed: str) -> str:
    """The runtime's last non-empty lines, joined into one short clause (or nothing)."""
    lines = [line.strip() for line in printed.splitlines() if line.strip()]
    if not lines:
        return ""
    text = " / ".join(lines[-3:])
    if len(text) > _TAIL_CHARS:
        text = "..." + text[-_TAIL_CHARS:]
    return f"; it printed: {text}"
