"""Fault injection: kill -9 the pipeline at seeded random points in every stage (tiny-cnn).

One uninterrupted run is the reference. A second output directory gets one run per stage, each
killed (SIGKILL: no handler, no cleanup) at a random moment after that stage started, then a
final run that completes. After every kill, every visible stage directory must be a sealed,
verified artifact (a partial one is never visible, so never trusted); each rerun reuses exactly
the stages that were sealed before the kill; and the final directory holds the same artifacts,
byte for byte, as the uninterrupted run, with nothing left over.

QNN_FAULT_SEED picks other kill points (the default is fixed, so CI is repeatable).
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from support.pipeline_runs import (
    child_env,
    file_digests,
    leftovers,
    pipeline_command,
    sealed_artifacts,
)
from support.summary import read_summary

STAGES = ("prepare", "quantize", "compile", "infer")
SEED = int(os.environ.get("QNN_FAULT_SEED", "20261130"))
_EVENT = re.compile(r"\b(prepare|quantize|compile|infer) (started|cached)\b")


@dataclass
class _Run:
    """A pipeline child process and what its log said about each stage."""

    process: subprocess.Popen[str]
    events: list[tuple[str, str]] = field(default_factory=list)  # (stage, started | cached)
    log: list[str] = field(default_factory=list)
    seen: threading.Condition = field(default_factory=threading.Condition)

    def drain(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self.seen:
                self.log.append(line)
                if match := _EVENT.search(line):
                    self.events.append((match[1], match[2]))
                self.seen.notify_all()
        with self.seen:
            self.seen.notify_all()

    def wait_for_start(self, stage: str, timeout: float) -> bool:
        """True once `stage` started; False if the process ended (or cached it) first."""
        with self.seen:
            return (
                self.seen.wait_for(
                    lambda: (stage, "started") in self.events or self.process.poll() is not None,
                    timeout,
                )
                and (stage, "started") in self.events
            )


def _start(out: Path) -> tuple[_Run, threading.Thread]:
    process = subprocess.Popen(
        pipeline_command(out),
        env=child_env(),
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    run = _Run(process)
    reader = threading.Thread(target=run.drain, daemon=True)
    reader.start()
    return run, reader


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted")
    run, reader = _start(out)
    assert run.process.wait(timeout=600) == 0
    reader.join()
    return out


def test_killed_anywhere_the_rerun_ends_with_the_same_bytes(
    reference: Path, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    seconds = {s["name"]: s["seconds"] for s in read_summary(reference)["stages"]}
    out = tmp_path / "killed"
    sealed_before: set[str] = set()
    kills = []
    for stage in STAGES:
        # A moment inside the stage: within 80% of what it took uninterrupted (or of 50 ms).
        delay = rng.uniform(0.0, 0.8 * max(seconds[stage], 0.05))
        run, reader = _start(out)
        started = run.wait_for_start(stage, timeout=600)
        assert started, f"{stage} never started:\n{''.join(run.log)[-3000:]}"
        time.sleep(delay)
        run.process.kill()
        run.process.wait(timeout=60)
        reader.join()
        _check_rerun_trusted_only_sealed(run, sealed_before)
        # Whatever the moment, every visible directory is complete and verified.
        sealed_before = {name.split("-")[0] for name in sealed_artifacts(out)}
        where = "after its seal" if stage in sealed_before else "mid-stage"
        kills.append(f"{stage}+{delay:.2f}s ({where})")

    final, reader = _start(out)
    assert final.process.wait(timeout=600) == 0, "".join(final.log)[-3000:]
    reader.join()
    _check_rerun_trusted_only_sealed(final, sealed_before)
    context = f"seed {SEED}, kills at {kills}"
    print(context)  # shown with -s: where this seed's kills landed
    assert sealed_artifacts(out) == sealed_artifacts(reference), context
    assert file_digests(out) == file_digests(reference), context
    assert leftovers(out) == [], context


def _check_rerun_trusted_only_sealed(run: _Run, sealed_before: set[str]) -> None:
    """The stages a run reused are exactly the ones that were sealed when it started.

    (A stage rerun into a directory of another name means its cache key changed: the source tree
    was edited while the test ran.)
    """
    said = "".join(line for line in run.log if re.search(r"refused|started|cached", line))
    for stage, event in run.events:
        if event == "cached":
            assert stage in sealed_before, f"{stage} reused though it was never sealed:\n{said}"
        else:
            assert stage not in sealed_before, f"{stage} rerun though it was sealed:\n{said}"
