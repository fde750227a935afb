"""Issue 49, item 5: a sweep on Ray ends cleanly on SIGTERM, and on a Ray address nothing answers.

SIGTERM to a sweep on a local Ray aborted it (exit 134 and Ray's native "*** SIGTERM received"
dump) or ended it with `error: sys.exit(1) was called at python/ray/_raylet.pyx`, blaming "a model
factory": `ray.init` installs its own SIGTERM handlers over the CLI's. A `--ray-address` nothing
answers hung past 300 s (Ray retries the connection for minutes). And the documented `ray://`
addresses need `ray[client]`, which no wheel of this project pulls in.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from qnn_pipeline import cli as pipeline_cli
from support.pipeline_runs import child_env

SWEEP = ("sweep", "--model", "tiny-cnn", "--backend", "portable", "--recipe", "fp32",
         "--runs", "1", "--calibration-samples", "2", "--no-progress")


def _sweep(out: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", pipeline_cli.__name__, *SWEEP, "--out", str(out), *extra],
        env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _finish(proc: subprocess.Popen[str], within: float) -> tuple[int, str]:
    """The exit code and stderr, or a failure (the process killed) if it outlives `within`."""
    try:
        _, err = proc.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"still running {within:.0f} s on: {err[-2000:]}")
    return proc.returncode, err


def test_sigterm_ends_a_sweep_on_a_local_ray_cleanly(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path / "sweep", "--jobs", "2", "-v")
    assert sweep.stderr is not None
    seen = []
    deadline = time.monotonic() + 240
    for line in sweep.stderr:  # -v: the cells' stage logs reach the driver once tasks run
        seen.append(line)
        if "Started a local Ray instance" in line or time.monotonic() > deadline:
            break
    time.sleep(3)  # the tasks submitted, the driver waiting on them
    sweep.send_signal(signal.SIGTERM)
    code, err = _finish(sweep, within=60)
    err = "".join(seen) + err
    assert code == 143, err[-3000:]
    assert "terminated (SIGTERM)" in err
    assert "SIGTERM received" not in err and "Traceback" not in err, err[-3000:]
    assert "error:" not in err, err[-3000:]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers: a host that is up, no Ray on it."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        yield server.getsockname()[1]


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_ray_address_nothing_listens_on_is_one_error_line_at_once(tmp_path: Path) -> None:
    address = f"127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    code, err = _finish(_sweep(tmp_path / "sweep", "--ray-address", address), within=60)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1, err[-3000:]
    assert address in errors[0] and "--jobs 1" in errors[0], errors
    assert "Traceback" not in err
    assert time.monotonic() - started < 30


def test_a_ray_address_that_never_answers_fails_within_the_bound(
    tmp_path: Path, silent_port: int
) -> None:
    address = f"127.0.0.1:{silent_port}"
    started = time.monotonic()
    sweep = _sweep(tmp_path / "sweep", "--ray-address", address, "--ray-timeout", "5")
    code, err = _finish(sweep, within=90)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1, err[-3000:]
    assert address in errors[0] and "within 5 s" in errors[0], errors
    assert "Traceback" not in err and "model factory" not in err
    assert time.monotonic() - started < 60


def test_a_ray_client_address_without_ray_client_says_what_to_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "grpc", None)  # as without ray[client]: import grpc fails
    argv = [*SWEEP[1:], "--out", str(tmp_path / "sweep"), "--ray-address", "ray://head:10001"]
    assert pipeline_cli.main(["sweep", *argv]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "ray://head:10001" in errors[0], err
    assert "pip install 'ray[client]'" in errors[0]
    assert not (tmp_path / "sweep").exists()


def test_a_second_sweep_into_one_out_is_refused_while_the_first_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 49, item 9: two sweeps into one --out kept only the last writer's tables."""
    import fcntl

    out = tmp_path / "sweep"
    out.mkdir()
    (out / "sweep.md").write_text("the first sweep's table\n")
    with open(out / ".sweep.lock", "w") as held:  # the first sweep, still running
        held.write("12345\n")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX)
        argv = [*SWEEP[1:], "--jobs", "1", "-q", "--out", str(out)]
        assert pipeline_cli.main(["sweep", *argv]) == 2
    err = capsys.readouterr().err
    assert f"error: {out}: another sweep (pid 12345) is writing its tables here" in err, err
    assert (out / "sweep.md").read_text() == "the first sweep's table\n"
    assert sorted(p.name for p in out.iterdir()) == [".sweep.lock", "sweep.md"]
