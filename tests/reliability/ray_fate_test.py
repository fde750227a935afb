"""Issue 27, class 9: the local Ray a sweep starts must not outlive a `kill -9` of the sweep.

ray.init's GCS and raylet died with the driver, but the raylet's agents (DashboardAgent,
RuntimeEnvAgent) stayed, reparented to init, waiting on the dead GCS for a minute or more.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from qnn_pipeline import cli as pipeline_cli
from support.pipeline_runs import child_env

# Under the minute and more the agents lingered; the reaper acts as soon as the pipe closes, but
# on a starved machine (a CI at load ~10) two agents once outlived 20 s: the reaper's own start.
GRACE_S = 45.0


def _descendants(root: int) -> dict[int, str]:
    """pid -> command line of every live descendant of `root`."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the fields follow the last ")".
        parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
        names[int(entry)] = cmdline.replace(b"\0", b" ").decode("utf-8", "replace").strip()
    found: dict[int, str] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                found[pid] = names[pid]
                frontier.append(pid)
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def test_a_killed_sweep_leaves_no_ray_process(tmp_path: Path) -> None:
    sweep = subprocess.Popen(
        [sys.executable, "-m", pipeline_cli.__name__, "sweep", "--model", "tiny-cnn",
         "--backend", "portable", "--recipe", "fp32", "--jobs", "2", "--runs", "1",
         "--calibration-samples", "2", "--no-progress", "--out", str(tmp_path / "sweep")],
        env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 300
        ray: dict[int, str] = {}
        while time.monotonic() < deadline and sweep.poll() is None:
            ray = _descendants(sweep.pid)
            if any("Agent" in name for name in ray.values()):
                break
            time.sleep(0.5)
        assert any("Agent" in name for name in ray.values()), f"no Ray agents seen: {ray}"
        time.sleep(2)  # the agents up and the sweep's tasks submitted
        ray = _descendants(sweep.pid)
    finally:
        sweep.send_signal(signal.SIGKILL)
        sweep.wait()
    started = time.monotonic()
    left = _alive(set(ray))
    while left and time.monotonic() - started < GRACE_S:
        time.sleep(0.5)
        left = _alive(left)
    for pid in left:  # leave the machine clean for the next test, whatever this one found
        os.kill(pid, signal.SIGKILL)
    assert not left, f"alive {GRACE_S:.0f} s after kill -9: {[ray[p] for p in left]}"
