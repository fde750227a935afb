"""Issue 24: a sweep launched as a PEX launches it, and failures outside our code, each one line.

The sweep runs in a child process whose import path is assembled in code, with no PYTHONPATH in
its environment: how a PEX (`./pants run src/python/qnn_pipeline:cli -- sweep`) runs it. Its
local Ray's agents and workers are `sys.executable` children; before the fix they could not
import ray, the node timed out after ~47 s, and the user got a raw traceback and exit 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from qnn_pipeline import cli as pipeline_cli  # what the child runs: a dependency of this test

_AS_A_PEX = (
    "import sys; sys.path[:0] = {paths!r}\nfrom " + pipeline_cli.__name__
    + " import main\nsys.exit(main())"
)


def _sweep(tmp_path: Path, *argv: str, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess[str]:
    paths = [os.path.abspath(p) for p in sys.path if p]
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-c", _AS_A_PEX.format(paths=paths), "sweep", *argv,
         "--out", str(tmp_path / "sweep"), "--no-progress"],
        env={**base, **(env or {})}, cwd=tmp_path, text=True, capture_output=True, timeout=900,
        check=False,
    )


def _one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr[-3000:]
    return errors[0]


def test_a_pex_sweep_starts_ray_and_a_dying_worker_fails_only_its_cell(tmp_path: Path) -> None:
    done = _sweep(tmp_path, "--model", "sweep.sweep_factories:mlp,sweep.sweep_factories:dies",
                  "--backend", "xnnpack", "--recipe", "fp32", "--runs", "3", "--threads", "1",
                  "--jobs", "2")
    assert done.returncode == 2, done.stderr[-3000:]
    line = _one_error_line(done.stderr)
    assert "1 of 2 cells" in line and "sweep.sweep_factories:dies" in line, line
    assert "Ray worker running this stage died" in line and "--jobs 1" in line, line
    cells = {c["model"]: c for c in json.loads((tmp_path / "sweep" / "sweep.json").read_text())
             ["cells"]}
    assert cells["sweep.sweep_factories:mlp"]["status"] == "ok"
    assert cells["sweep.sweep_factories:dies"]["status"] == "failed"


def test_a_local_ray_that_cannot_start_says_so_and_how_to_go_on(tmp_path: Path) -> None:
    """A real start failure: Ray's socket paths under this TMPDIR pass AF_UNIX's 107 bytes."""
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    done = _sweep(tmp_path, "--model", "sweep.sweep_factories:mlp", "--jobs", "2",
                  env={"TMPDIR": str(deep)})
    assert done.returncode == 2, done.stderr[-3000:]
    line = _one_error_line(done.stderr)
    assert "could not start a local Ray" in line and "--jobs 1" in line, line
