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

The agents' own environment no longer shows the token: each sets its process title
(`ray::DashboardAgent`), which overwrites the memory `/proc/<pid>/environ` reads. So while the
sweep lives, the watcher also notes every descendant of a marked process (the agents are the
raylet's children) with its start time, and kills those too, unless the PID now names another
process. Without that, the agents outlived a killed sweep until they noticed on their own: under
a CPU hog, longer than 45 s (`tests/reliability/ray_fate_test.py`).
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
import os, select, signal, sys
mark, sweep = sys.argv[1].encode(), int(sys.argv[2])
signal.signal(signal.SIGINT, signal.SIG_IGN)

def processes():
    # pid -> (parent pid, start time, marked) of every process we may read.
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in (os.getpid(), sweep):
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            with open(f"/proc/{entry}/environ", "rb") as fh:
                marked = mark in fh.read().split(b"\\0")
        except OSError:
            continue  # gone already, or not ours to read
        out[int(entry)] = (int(fields[1]), fields[19], marked)
    return out

def ours(table):
    # (pid, start time) of the marked processes and of all their descendants.
    found = {pid for pid, (_, _, marked) in table.items() if marked}
    grew = True
    while grew:
        more = {pid for pid, (parent, _, _) in table.items() if parent in found} - found
        found |= more
        grew = bool(more)
    return {(pid, table[pid][1]) for pid in found}

seen = set()
while not select.select([sys.stdin], [], [], 1.0)[0]:
    seen |= ours(processes())
while sys.stdin.buffer.read1(65536):
    pass  # EOF: the sweep shut Ray down and closed the pipe, or it died
table = processes()
for pid, started in seen | ours(table):
    if pid in table and table[pid][1] == started:  # still the process we saw
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
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
