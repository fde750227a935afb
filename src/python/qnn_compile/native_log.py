"""What backend libraries print while we lower, kept for error messages, filtered for people.

QNN and ExecuTorch's C++ side report to file descriptor 2 directly: a rejected op's reason, or why
a context binary failed, never reaches a Python exception. `NativeLog.capture()` redirects fd 2
into a temporary file for the duration, then keeps the error lines (for the StageError), moves the
informational chatter to the debug log, and writes everything else through to the real stderr.
ExecuTorch's Python loggers (one INFO line per node from the QNN partitioner and preprocessor) are
held the same way: kept for diagnosis, shown with -v only. Our own loggers' stderr handlers write
to the real stderr meanwhile, so progress lines appear as the lowering goes.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
from collections.abc import Iterator

from qnn_common.cli.noise import fd2_captured

log = logging.getLogger(__name__)

# Error lines as QNN ("[ERROR] [Qnn ExecuTorch]: ...", " <E> ...") and ExecuTorch's C++ logger
# ("E 00:00:05.051737 executorch:...") print them.
_ERROR = re.compile(r"^\s*(\[ERROR\]|<E>|E \d\d:\d\d:\d\d)")
# Printed on every HTP graph build by QNN 2.51 for an option executorch 1.5.1 sets; harmless.
_HARMLESS = (re.compile(r"unexpected GraphHtpSettings option 66"),)
# Chatter: QNN / ExecuTorch info and warning lines, and executorch's Python loggers' INFO lines.
_CHATTER = re.compile(
    r"^\s*(\[(INFO|WARNING|DEBUG|VERBOSE)\]|\[(INFO|DEBUG) \d{4}-|[IWD] \d\d:\d\d:\d\d)"
)
# The QNN preprocessor names each node as it builds it; the last one is where a failure happened.
_VISITING = re.compile(r"Visiting: \S+, (\S+)")


class _Keep(logging.Handler):
    """Keeps upstream log records as lines; they reach the console through our debug log only."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self._lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        line = f"[{record.levelname} {record.name}] {record.getMessage()}"
        self._lines.append(line)
        if record.levelno >= logging.WARNING:
            log.warning("%s", record.getMessage())
        else:
            log.debug("%s", line)


class NativeLog:
    """Lines native code wrote to stderr inside `capture()` blocks, sorted by what they mean."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        """Redirect fd 2 to a temporary file while the block runs (qnn_common.cli.noise
        .fd2_captured: our own log lines still reach the terminal as they are written), hold
        ExecuTorch's Python loggers the same way, then sort what was written."""
        upstream = logging.getLogger("executorch")
        handler = _Keep(self.lines)
        was_propagating = upstream.propagate
        upstream.addHandler(handler)
        upstream.propagate = False
        captured = None
        try:
            with fd2_captured() as captured:
                yield
        finally:
            upstream.removeHandler(handler)
            upstream.propagate = was_propagating
            if captured is not None:
                self._absorb(captured.text)

    def _absorb(self, text: str) -> None:
        passthrough = []
        for line in text.splitlines():
            if not line.strip():
                continue
            self.lines.append(line)
            if _ERROR.match(line) and not any(h.search(line) for h in _HARMLESS):
                passthrough.append(line)
            elif _CHATTER.match(line) or any(h.search(line) for h in _HARMLESS):
                log.debug("%s", line)
            else:
                passthrough.append(line)
        if passthrough:
            sys.stderr.write("\n".join(passthrough) + "\n")
            sys.stderr.flush()

    def errors(self) -> list[str]:
        """Error lines, minus the known-harmless ones, in order."""
        return [
            line.strip() for line in self.lines
            if _ERROR.match(line) and not any(h.search(line) for h in _HARMLESS)
        ]

    def last_visited(self) -> str | None:
        """The op the QNN preprocessor was building last (where a context build failed)."""
        for line in reversed(self.lines):
            match = _VISITING.search(line)
            if match:
                return match.group(1)
        return None
