"""Run a stage CLI in its own process and measure its wall time and peak RSS.

Shared by the benchmarks (`pipeline_bench.py`, `llm_bench.py`): a stage's memory is only its own
when it runs alone, in a fresh interpreter.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from qnn_common.cli.child_env import python_child_env

# Runs a stage CLI's module as __main__ and writes its peak RSS (VmHWM: this process image's
# high-water mark; not ru_maxrss, which a child inherits from the forking parent) to the file
# named by argv[1].
_PEAK_RSS = """
import runpy, sys
out, module = sys.argv.pop(1), sys.argv.pop(1)
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            open(out, "w").write(line.split()[1])
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
finally:
    peak()
"""


def run_stage(argv: list[str], work: Path) -> tuple[float, float]:
    """Run `python -m argv[0] argv[1:]` in a child process: (seconds, peak RSS in MB).

    Raises SystemExit naming the command if it fails.
    """
    work.mkdir(parents=True, exist_ok=True)
    rss_file = work / "peak_rss_kb"
    rss_file.unlink(missing_ok=True)
    t = time.perf_counter()
    # The child must import the stage CLIs from this process's path: under `./pants run` the
    # interpreter alone does not see them (qnn_common.cli.child_env).
    proc = subprocess.run([sys.executable, "-c", _PEAK_RSS, str(rss_file), *argv],
                          env=python_child_env(), stdout=subprocess.DEVNULL, check=False)
    seconds = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed (exit {proc.returncode})")
    return seconds, int(rss_file.read_text()) / 1024
