"""Running many fuzz cases through child processes that report one JSON line per case and may die.

A case that aborts the interpreter takes its child down, not the test: the case after the last
one reported is recorded as a crash and the next child goes on from the case after it.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

from support.pipeline_runs import child_env


def run_cases(
    command: Callable[[int], list[str]], total: int, *, timeout: float
) -> tuple[dict[int, dict[str, str]], str]:
    """index -> the record a child printed for that case (`{"index", "outcome", "message", ...}`)
    for every case of `total`, and all the children's stderr. `command(first)` is the command
    line of a child that starts at case `first`; each child is bounded by `timeout` seconds."""
    results: dict[int, dict[str, str]] = {}
    stderr = ""
    while len(results) < total:
        done = subprocess.run(
            command(len(results)), env=child_env(), text=True, capture_output=True,
            timeout=timeout, check=False,
        )
        stderr += done.stderr
        for line in done.stdout.splitlines():
            record = json.loads(line)
            results[record["index"]] = record
        if done.returncode != 0:  # died on the case after the last one it reported
            results[len(results)] = {"outcome": "crash", "message": f"exit {done.returncode}"}
    return results, stderr
