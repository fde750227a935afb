"""NativeLog holds what native code writes to fd 2, and lets our own log lines through live."""

from __future__ import annotations

import os
import subprocess
import sys

from qnn_compile import native_log

# In a child process, so that fd 2 and sys.stderr are a real process's (pytest replaces both).
_CHILD = """
import logging, os, sys
from {module} import NativeLog
logging.basicConfig(stream=sys.stderr, format="%(message)s")
handler = logging.getLogger().handlers[0]
native = NativeLog()
with native.capture():
    os.write(2, b"a native line\\n")
    logging.warning("progress line")
assert native.lines == ["a native line"], native.lines
assert handler.stream is sys.stderr
"""


def test_log_lines_pass_while_native_output_is_held() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD.format(module=native_log.__name__)],
        capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr
    # The log line was written live; the native line was held and passed through at the end.
    assert done.stderr.splitlines() == ["progress line", "a native line"]
