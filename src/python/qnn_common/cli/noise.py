"""Known-harmless third-party noise, filtered in one place so that what a user reads is ours.

Every CLI calls `quiet_third_party()` (through `support.setup_logging`) unless `-v` is given,
in which case everything below is shown as it comes. Each entry names the library and what the
message means, so that a new version's noise is added here (with its reason) and nowhere else:

- torchao logs a WARNING per optional CUDA / CUTLASS kernel library it cannot load on a CPU-only
  host, and one about triton being absent; we never use those kernels.
- torch's pytree logs a deprecation WARNING for each Enum torchao registers as a pytree constant.
- torch / torchao / transformers emit FutureWarning / DeprecationWarning about their own internal
  APIs (LeafSpec pickling, export internals) on every export and load.
- transformers draws a "Loading weights" progress bar for each checkpoint it reads.
- ExecuTorch's runtime (XNNPACK's cpuinfo) prints five `[cpuinfo_utils.cpp:NN]` lines to file
  descriptor 2 the first time a method loads on a host that is not an ARM phone; see
  `native_noise_filtered`. On the QNN emulator the runtime prints `[INFO] [Qnn ExecuTorch]: ...`
  lines as it loads and releases each method (and on some calls), which landed before and after
  the tokens a generation streams; with them, on every load, a `[WARNING]` that its QNN API
  version (2.40 in QNN 2.51) is newer than the one it was "tested against" (2.27): the SDK this
  project accepts is checked by `qnn_common.qnn_sdk.check_compatible`, so there is nothing to do.
  The x86 HTP emulator itself prints ` # LIBNATIVE: No alternate configuration present ...` to
  stdout (fd 1) the first time it starts: the default it goes on with is the one we want.
- ExecuTorch warns "PassManager is deprecated" each time its own lowering builds one, and (once
  per op) that an op a partitioner asked to keep whole, such as `aten.unbind.int`, is decomposed
  after all because it is mutable or aliases its output: nothing we can act on, no effect on the
  program.
- ExecuTorch's LLM custom ops (`executorch.extension.llm.custom_ops`) log through the root
  logger where they look for and load their library, and their attention kernel, run eagerly
  through torch (a quantize stage's fake-quant model), prints `[kernel_runtime_context.h:NN] No
  temp allocator provided` to fd 2 on every call: it then allocates its scratch itself.
- ExecuTorch's QNN quantizer prints (to stdout, per node) "No quant config is implemented for
  op, aten.dropout.default" for ops that carry no value to quantize: dropout (an identity at
  inference), contiguous and alias (views of their input); see `printed_noise_filtered`. The same
  line for any other op still shows: that op stays in float.

The log and native filters drop only those exact messages: any other log line from the same
libraries still shows. Warnings are filtered by category and by the library they come from, as
those libraries raise them by the dozen about their own internals; ours are never filtered.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO, cast

# (logger name, message regex): records logged by that very logger with a matching message.
LOG_NOISE: tuple[tuple[str, str], ...] = (
    ("torchao", r"^Failed to load .*: Could not load this library"),
    ("torchao", r"^Skipping import of cpp extensions"),
    ("torchao.kernel.intmm", r"Detected no triton"),
    ("torch.utils._pytree", r"is an Enum subclass and is now natively supported"),
    ("executorch.exir.pass_manager", r"^PassManager is deprecated"),
    # Logged with logging.warn, i.e. by the root logger itself.
    ("root", r"^Op \S+ was requested for preservation by partitioner\.  This request is ignored "
             r"because it (is mutable|aliases output)\.$"),
    ("root", r"^(Looking for libcustom_ops_aot_lib\.so in|Loading custom ops library:) "),
)

# (category, module regex) for Python warnings raised from inside these libraries' code.
WARNING_NOISE: tuple[tuple[type[Warning], str], ...] = (
    (FutureWarning, r"^(torch|torchao|transformers|executorch)(\.|$)"),
    (DeprecationWarning, r"^(torch|torchao|transformers|executorch)(\.|$)"),
)
# Warnings whose message is known noise whichever module they are attributed to (torch's own
# pytree pickling warns through the caller's frame, so the module filter above misses it).
WARNING_MESSAGES: tuple[tuple[type[Warning], str], ...] = ((FutureWarning, r".*LeafSpec.*"),)

# Lines native code writes to fd 2 that carry no information for the user.
NATIVE_NOISE: tuple[re.Pattern[str], ...] = (
    re.compile(r"^\[cpuinfo_utils\.cpp:\d+\] "),
    re.compile(r"^\[INFO\] \[Qnn ExecuTorch\]: "),
    re.compile(r"^\[WARNING\] \[Qnn ExecuTorch\]: Qnn API version [\d.]+ is used\. The version "
               r"is tested against [\d.]+\.$"),
    re.compile(r"^ # LIBNATIVE: No alternate configuration present in libnative_tls\.conf "),
    re.compile(r"^\[kernel_runtime_context\.h:\d+\] No temp allocator provided$"),
)

# Lines third-party code print()s to stdout that carry no information for the user.
PRINTED_NOISE: tuple[re.Pattern[str], ...] = (
    re.compile(
        r"^No quant config is implemented for op, "
        r"aten\.(dropout|contiguous|alias)\.default$"
    ),
)

_quiet = False
# Off in a process whose fd 2 is already captured whole (qnn_infer.isolation's child): there the
# filter's temp file would swallow what the process prints before a crash.
_filter_native = True


class _DropKnownNoise(logging.Filter):
    """Drops the records of one logger whose message matches one of `patterns`."""

    def __init__(self, patterns: list[re.Pattern[str]]) -> None:
        super().__init__()
        self.patterns = patterns

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(p.search(message) for p in self.patterns)


def quiet_third_party() -> None:
    """Install the filters above for this process (idempotent); call it before importing torch.

    The logger filters attach to the loggers the libraries create, by name, so they work even if
    the library is imported later. Transformers' progress bar is turned off through its
    documented environment variable unless the user set that variable themselves.
    """
    global _quiet
    if _quiet:
        return
    _quiet = True
    by_logger: dict[str, list[re.Pattern[str]]] = {}
    for name, pattern in LOG_NOISE:
        by_logger.setdefault(name, []).append(re.compile(pattern))
    for name, patterns in by_logger.items():
        logging.getLogger(name).addFilter(_DropKnownNoise(patterns))
    for category, module in WARNING_NOISE:
        warnings.filterwarnings("ignore", category=category, module=module)
    for category, message in WARNING_MESSAGES:
        warnings.filterwarnings("ignore", message=message, category=category)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def stop_filtering_native_output() -> None:
    """Make `native_noise_filtered` a no-op in this process from now on (see `_filter_native`)."""
    global _filter_native
    _filter_native = False


def is_quiet() -> bool:
    """Whether `quiet_third_party` is in force (False with -v, or outside our CLIs)."""
    return _quiet


@dataclass
class Captured:
    """What native code wrote to fd 2 inside an `fd2_captured` block, once the block ended."""

    text: str = ""


def _stderr_handlers() -> list[logging.StreamHandler[Any]]:
    """Every configured logging handler that writes to sys.stderr."""
    loggers = [logging.getLogger(), *(
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    )]
    return [
        h for lg in loggers for h in lg.handlers
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
        and h.stream is sys.stderr
    ]


@contextlib.contextmanager
def fd2_captured() -> Iterator[Captured | None]:
    """Send file descriptor 2 to a temporary file while the block runs; yield a `Captured` whose
    text is what was written, once the block ends (None, capturing nothing, without a real
    stderr: embedded, or captured by a test runner).

    Python cannot intercept what C++ writes to the descriptor, hence the file. The logging
    handlers that write to sys.stderr (our own progress lines) write to a copy of the real
    stderr meanwhile, so they appear as they happen rather than after the block.
    """
    try:
        stderr_fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        yield None
        return
    sys.stderr.flush()
    saved = os.dup(stderr_fd)
    real = os.fdopen(os.dup(saved), "w", buffering=1, encoding="utf-8", errors="replace")
    moved = [(h, h.setStream(real)) for h in _stderr_handlers()]
    captured = Captured()
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), stderr_fd)
        try:
            yield captured
        finally:
            sys.stderr.flush()
            for handler, stream in moved:
                handler.setStream(stream)
            real.close()
            os.dup2(saved, stderr_fd)
            os.close(saved)
            tmp.seek(0)
            captured.text = tmp.read().decode("utf-8", "replace")


@contextlib.contextmanager
def fd1_captured() -> Iterator[Captured | None]:
    """`fd2_captured` for file descriptor 1 (stdout): what native code printed there inside the
    block, once it ended (None without a real stdout). Whatever Python prints meanwhile is held
    too, so it is for blocks that print nothing of ours (a program's load, not a stream)."""
    try:
        stdout_fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        yield None
        return
    sys.stdout.flush()
    saved = os.dup(stdout_fd)
    captured = Captured()
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), stdout_fd)
        try:
            yield captured
        finally:
            sys.stdout.flush()
            os.dup2(saved, stdout_fd)
            os.close(saved)
            tmp.seek(0)
            captured.text = tmp.read().decode("utf-8", "replace")


@contextlib.contextmanager
def native_noise_filtered(*, stdout: bool = False) -> Iterator[None]:
    """Drop the `NATIVE_NOISE` lines native code writes to fd 2 (and with `stdout`, to fd 1)
    while the block runs; the rest is written through afterwards, in order.

    Does nothing unless `quiet_third_party` is in force (so library callers and -v see it all),
    or when there is no real stderr.
    """
    if not _quiet or not _filter_native:
        yield
        return
    printed = captured = None
    try:
        with contextlib.ExitStack() as stack:
            if stdout:
                printed = stack.enter_context(fd1_captured())
            captured = stack.enter_context(fd2_captured())
            yield
    finally:  # what the block wrote goes through even if it raised
        _write_kept(captured, sys.stderr)
        _write_kept(printed, sys.stdout)


def _write_kept(captured: Captured | None, stream: TextIO) -> None:
    kept = [
        line for line in (captured.text if captured else "").splitlines(keepends=True)
        if not any(p.search(line) for p in NATIVE_NOISE)
    ]
    if kept:
        stream.write("".join(kept))
        stream.flush()


class _DropPrinted(io.TextIOBase):
    """A stdout that writes through every complete line but the `PRINTED_NOISE` ones."""

    def __init__(self, target: TextIO) -> None:
        super().__init__()
        self._target = target
        self._pending = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            if not any(p.search(line) for p in PRINTED_NOISE):
                self._target.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self._target.flush()

    def close_pending(self) -> None:
        if self._pending and not any(p.search(self._pending) for p in PRINTED_NOISE):
            self._target.write(self._pending)
        self._pending = ""
        self._target.flush()


@contextlib.contextmanager
def printed_noise_filtered() -> Iterator[None]:
    """Drop the `PRINTED_NOISE` lines Python code print()s to stdout while the block runs.

    Does nothing unless `quiet_third_party` is in force (library callers and -v see it all).
    """
    if not _quiet:
        yield
        return
    filtered = _DropPrinted(sys.stdout)
    # A text stream in all but its class: redirect_stdout wants a TextIO.
    with contextlib.redirect_stdout(cast(TextIO, filtered)):
        try:
            yield
        finally:
            filtered.close_pending()
