"""The stand-in libQnnHtp.so: its C source (the `htp_bridge.c` resource) and compiling it.

It lets ExecuTorch 1.5.1 (built against QNN 2.37) drive the QNN 2.51 libraries of the dev SDK;
htp_bridge.c explains how.
"""

from __future__ import annotations

import importlib.resources
import logging
import os
import shutil
import subprocess
from pathlib import Path

from qnn_common.errors import BackendNotAvailableError

log = logging.getLogger(__name__)

# Ships in the qnn_common package (the `bridge` resources target beside this package).
BRIDGE_RESOURCE = "htp_bridge.c"
BRIDGE_CFLAGS = (
    "-O2",
    "-shared",
    "-fPIC",
    "-Wall",
    "-Wextra",
    "-Wl,-soname,libQnnHtp.so",
    "-Wl,-z,nodelete",
)
BRIDGE_LDLIBS = ("-ldl",)
COMPILER_NAMES = ("gcc", "cc")
# Pants test sandboxes can run with a minimal PATH; the compiler is usually still here.
COMPILER_FALLBACKS = ("/usr/bin/gcc", "/usr/bin/cc")
COMPILE_TIMEOUT_S = 120.0


def read_bridge_source() -> bytes:
    """The bridge's C source, as shipped in the qnn_common package."""
    return importlib.resources.files("qnn_common").joinpath(BRIDGE_RESOURCE).read_bytes()


def compile_bridge(source: Path, output: Path) -> str:
    """Compile `source` into the shared library `output`; the compiler used."""
    compiler = _find_compiler()
    cmd = [compiler, *BRIDGE_CFLAGS, "-o", str(output), str(source), *BRIDGE_LDLIBS]
    env = dict(os.environ)
    # gcc looks for `as` and `ld` on PATH too; a sandbox's minimal PATH may lack them.
    env["PATH"] = os.pathsep.join(p for p in (env.get("PATH", ""), "/usr/bin", "/bin") if p)
    try:
        result = subprocess.run(
            cmd, capture_output=True, text=True, env=env, timeout=COMPILE_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise BackendNotAvailableError(
            f"cannot run the C compiler for the QNN dev SDK bridge ({' '.join(cmd)}): {err}. "
            "Install gcc (`apt-get install gcc`)"
        ) from err
    if result.returncode != 0:
        raise BackendNotAvailableError(
            f"compiling the QNN dev SDK bridge failed ({' '.join(cmd)}, exit "
            f"{result.returncode}): {result.stderr.strip()[-2000:]}. Check that gcc and the C "
            "library headers are installed (`apt-get install gcc libc6-dev`)"
        )
    if result.stderr.strip():
        log.warning("compiler output for htp_bridge.c:\n%s", result.stderr.strip())
    return compiler


def _find_compiler() -> str:
    for name in COMPILER_NAMES:
        found = shutil.which(name)
        if found:
            return found
    for candidate in COMPILER_FALLBACKS:
        if os.access(candidate, os.X_OK):
            return candidate
    raise BackendNotAvailableError(
        "no C compiler (gcc or cc) on PATH or in /usr/bin: the QNN dev SDK compiles its "
        "libQnnHtp.so bridge (htp_bridge.c) once when it is assembled. Install one "
        "(`apt-get install gcc`), or set QNN_SDK_ROOT to a Qualcomm QNN 2.37 SDK"
    )
