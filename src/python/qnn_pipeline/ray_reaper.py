"""The local Ray a sweep starts dies with the sweep, kill -9 included.

`ray.init()` starts its GCS and raylet with the driver's death as their own (Linux PDEATHSIG),
but the raylet's agents (`ray::DashboardAgent`, `ray::RuntimeEnvAgent`) are its children and
outlive it: they notice the raylet is gone, then wait on the dead GCS to report it, reparented to
init, for a minute or more after a `kill -9` of the sweep (issue 27).

`reaped_ray()` marks the Ray it starts: a variable with a unique token in the environment
`ray.init` passes to every process of that Ray (GCS, raylet, agents, workers). It starts a small
watcher process in a session of its own (Ctrl-C to the sweep's terminal does not reach it),
whose stdin is a pipe only the sweep holds. The pipe reads EOF when the sweep closes it after
`ray.shutdown()`, or when the kernel closes it because the sweep died, however; the watcher then
kills every process whose environment carries the token, so nothing of another Ray (or anything
else) on the machine is touched.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

ENV_MARK = "QNN_PIPELINE_RAY_TOKEN"

# The watcher imports nothing of this project (a PEX or a venv runs it the same way) and nothing
# heavy: it starts in a fraction of a second and only waits.
_WATCHER = """
import os, signal, sys
mark, sweep = sys.argv[1].encode(), int(sys.argv[2])
signal.signal(signal.SIGINT, signal.SIG_IGN)
sys.stdin.buffer.read()  # EOF: the sweep shut Ray down and closed the pipe, or it died
for entry in os.listdir("/proc"):
    if not entry.isdigit() or int(entry) in (os.getpid(), sweep):
        continue
    try:
        with open(f"/proc/{entry}/environ", "rb") as fh:
            if mark in fh.read().split(b"\\0"):
                os.kill(int(entry), signal.SIGKILL)
    except OSError:
        pass  # gone already, or not ours to read
"""


@contextlib.contextmanager
def reaped_ray() -> Iterator[None]:
    """Around `ray.init()` ... `ray.shutdown()` of a local Ray: whatever of it outlives the
    block, or this process, is killed (see the module docstring)."""
    if not Path("/proc/self/environ").exists():  # no /proc to find the processes by
        yield
        return
    token = f"{ENV_MARK}={uuid.uuid4().hex}"
    reaper = subprocess.Popen(
        [sys.executable, "-c", _WATCHER, token, str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    name, value = token.split("=", 1)
    os.environ[name] = value  # inherited by what ray.init starts, and by what those start
    try:
        yield
    finally:
        os.environ.pop(name, None)
        if reaper.stdin is not None:
            with contextlib.suppress(OSError):
                reaper.stdin.close()
        try:
            reaper.wait(timeout=30)
        except subprocess.TimeoutExpired:
            reaper.kill()
            reaper.wait()
