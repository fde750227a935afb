"""Issue 9, classes 5, 7, 8 and 9: how the CLIs end, what they bound, what they say and print.

Each test reproduces what the issue saw, on tiny-cnn with the real CLIs: in a child process where
the process itself is the subject (exit code, signals, an abort, what reaches the terminal),
in-process `main()` where only the message and the code matter.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from qnn_common.manifest import MANIFEST_NAME
from qnn_compile.cli import main as compile_main
from qnn_infer import cli as infer_cli
from qnn_pipeline import cli as pipeline_cli
from qnn_prepare.cli import main as prepare_main
from qnn_quant import cli as quant_cli
from support.pipeline_runs import child_env, leftovers, pipeline_command

# Third-party lines the issue found in the main job's log (class 9); none may show without -v.
NOISE = (
    "Could not load this library",
    "Detected no triton",
    "is an Enum subclass",
    "LeafSpec",
    "[cpuinfo_utils.cpp",
)


def _run(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`python -m <argv>` in a child process, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", *argv],
        env=child_env(),
        text=True,
        capture_output=True,
        timeout=timeout,
        check=False,
    )


def _one_error_line(stderr: str) -> str:
    """The single `error:` line a failure must end with: no traceback, no abort, no echo."""
    assert "Traceback" not in stderr and "terminate called" not in stderr, stderr[-2000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr[-2000:]
    return errors[0]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny-cnn compile artifact (prepare -> quantize -> compile, in-process)."""
    root = tmp_path_factory.mktemp("cnn")
    assert (
        prepare_main(
            [
                "--model",
                "tiny-cnn",
                "-o",
                str(root / "prepare"),
                "--calibration-samples",
                "2",
                "--eval-samples",
                "2",
                "-q",
            ]
        )
        == 0
    )
    assert (
        quant_cli.main(
            [str(root / "prepare"), "-o", str(root / "quantize"), "--report-layers", "0", "-q"]
        )
        == 0
    )
    assert compile_main([str(root / "quantize"), "-o", str(root / "compile"), "-q"]) == 0
    return root / "compile"


# --- class 5: exits that say nothing -----------------------------------------------------------


def test_model_factory_sys_exit_is_an_error(tmp_path: Path) -> None:
    """`--model sys:exit` ended the pipeline with exit 0, no summary and no word."""
    done = _run(pipeline_cli.__name__, "--model", "sys:exit", "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    line = _one_error_line(done.stderr)
    assert "sys:exit" in line and "sys.exit(None)" in line


def test_factory_module_exiting_at_import_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "out"
    assert pipeline_cli.main(["--model", "exits_on_import:make", "--out", str(out), "-q"]) == 2
    assert "SystemExit" in _one_error_line(capsys.readouterr().err)


# The pipeline CLI, stopped (SIGSTOP, by itself) inside one stage's work: at the first record its
# stage package logs while that stage's staging directory exists (after the work, before the
# seal). The test signals it there and lets it go on: the signal lands in the stage whatever the
# machine's speed, where a fixed sleep after a log line did not (issue 24: under load the stage
# was over, and sealed, before the signal came).
_STOPPED_IN_STAGE = """
import glob, logging, os, signal, sys
stage, out = sys.argv.pop(1), sys.argv.pop(1)

class StopInStage(logging.Handler):
    stopped = False
    def emit(self, record):
        if not self.stopped and glob.glob(os.path.join(out, "." + stage + "-*.staging-*")):
            StopInStage.stopped = True
            os.kill(os.getpid(), signal.SIGSTOP)

logging.getLogger({"quantize": "qnn_quant", "compile": "qnn_compile"}[stage]).addHandler(
    StopInStage())
from qnn_pipeline.cli import main
sys.exit(main())
"""


def _default_signals() -> None:
    """In the child: the signals' default dispositions, whatever this test runner ignores (a
    process started in the background inherits SIGINT ignored, and Python then keeps it so)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.mark.parametrize(
    ("sig", "code", "word", "stage"),
    [
        (signal.SIGTERM, 143, "terminated", "compile"),
        (signal.SIGINT, 130, "interrupted", "quantize"),
    ],
)
def test_signals_unwind_and_say_so(
    tmp_path: Path, sig: signal.Signals, code: int, word: str, stage: str
) -> None:
    """SIGTERM exited 143 with no message and left temp files; it now unwinds like Ctrl-C."""
    out = tmp_path / "out"
    argv = pipeline_command(out)
    assert argv[1:3] == ["-m", pipeline_cli.__name__]
    process = subprocess.Popen(
        [sys.executable, "-c", _STOPPED_IN_STAGE, stage, str(out), *argv[3:]],
        env=child_env(),
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=_default_signals,
    )
    log: list[str] = []
    assert process.stderr is not None
    reader = threading.Thread(target=lambda: log.extend(process.stderr or ()), daemon=True)
    reader.start()
    try:
        # A state, not a time: the child is stopped inside the stage (or ended, a failure).
        _, status = os.waitpid(process.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), f"never stopped in {stage}: {''.join(log)[-2000:]}"
        assert list(out.glob(f".{stage}-*.staging-*")), "stopped outside the stage's work"
        process.send_signal(sig)  # pending while stopped; delivered as it continues
        os.kill(process.pid, signal.SIGCONT)
        assert process.wait(timeout=600) == code, "".join(log)[-2000:]
    finally:
        process.kill()
        process.wait()
        reader.join(timeout=60)
    rest = "".join(log)
    assert word in rest and "Traceback" not in rest, rest[-2000:]
    assert leftovers(out) == []  # no temp file, staging directory or lock left behind
    assert not any((d / MANIFEST_NAME).exists() for d in out.glob(f"{stage}-*"))


def _unwritable(tmp_path: Path) -> Path:
    """A directory this process may not create: a read-only one, or /sys when we are root."""
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        return locked / "out"
    probe = Path("/sys/qnn-reliability-probe")
    try:
        probe.mkdir()
    except OSError as err:
        if err.errno in (errno.EPERM, errno.EACCES, errno.EROFS):
            return probe / "out"
    else:
        probe.rmdir()
    pytest.skip("no directory here refuses root")


@pytest.mark.parametrize(
    "case", ["unwritable", "under_a_file", "a_file", "long_name", "long_path", "not_utf8"]
)
def test_os_errors_are_one_line_with_the_path(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Raw tracebacks (or, for a non-UTF-8 byte, an abort) became one `error:` line."""
    (tmp_path / "file").write_text("not a directory")
    out = {
        "unwritable": lambda: _unwritable(tmp_path),
        "under_a_file": lambda: tmp_path / "file" / "out",
        "a_file": lambda: tmp_path / "file",
        "long_name": lambda: tmp_path / ("n" * 300),
        "long_path": lambda: tmp_path.joinpath(*["d" * 250] * 17),
        "not_utf8": lambda: Path(os.fsdecode(bytes(tmp_path / "out") + b"\xff")),
    }[case]()
    assert prepare_main(["--model", "tiny-cnn", "-o", str(out), "-q"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    shown = os.fsencode(out).decode("utf-8", "backslashreplace")
    assert shown[:60] in line or str(out.parent)[:60] in line, line


def test_non_utf8_out_does_not_abort_the_process(tmp_path: Path) -> None:
    """The process aborted (exit 134) inside pybind11 on a non-UTF-8 byte in --out."""
    out = bytes(tmp_path / "out") + b"\xff"
    argv = [
        os.fsencode(sys.executable),
        b"-m",
        pipeline_cli.__name__.encode(),
        b"--model",
        b"tiny-cnn",
        b"--out",
        out,
    ]
    done = subprocess.run(argv, env=child_env(), capture_output=True, timeout=120, check=False)
    assert done.returncode == 2
    assert "not valid UTF-8" in _one_error_line(done.stderr.decode("utf-8", "replace"))


# --- class 7: unbounded work -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--runs", str(10**9)], "infer.runs"),
        (["--calibration-samples", "100000"], "prepare.calibration_samples"),
        (["--seq-len", "1000000"], "prepare.seq_len"),
    ],
)
def test_absurd_sizes_are_refused_before_work(
    tmp_path: Path, argv: list[str], field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    # --stop-after prepare: were the bound lost, --runs 10**9 would fail here, not run for days.
    argv = ["--model", "tiny-cnn", "--out", str(out), "--stop-after", "prepare", *argv]
    assert pipeline_cli.main(argv) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert field in line and "at most" in line
    assert not out.exists()


def test_infer_runs_are_bounded(
    compiled: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert infer_cli.main([str(compiled), "-o", str(tmp_path / "i"), "--runs", "1000001"]) == 2
    assert "infer.runs" in _one_error_line(capsys.readouterr().err)


# --- class 8: messages that mislead ------------------------------------------------------------


def test_refused_cache_names_the_file_and_does_not_ask_to_rerun(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out"
    argv = [
        "--model",
        "tiny-cnn",
        "--calibration-samples",
        "2",
        "--out",
        str(out),
        "--stop-after",
        "prepare",
        "-q",
    ]
    assert pipeline_cli.main(argv) == 0
    (prepared,) = out.glob("prepare-*")
    data = bytearray((prepared / "calibration.pt").read_bytes())
    data[-10] ^= 0xFF
    (prepared / "calibration.pt").write_bytes(data)
    with caplog.at_level(logging.WARNING, logger="qnn_pipeline.orchestrator"):
        assert pipeline_cli.main(argv) == 0
    (warning,) = (r.getMessage() for r in caplog.records if "refused" in r.getMessage())
    assert str(prepared / "calibration.pt") in warning
    assert "rerun the stage" not in warning


def test_bare_pte_names_a_real_flag_and_is_not_labelled_fp32(
    compiled: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pte = compiled / "model.pte"
    out = tmp_path / "out"
    assert pipeline_cli.main(["--from", str(pte), "--out", str(out), "-q"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "--inputs" in line
    assert "--inputs" in pipeline_cli.build_parser().format_help()
    inputs = tmp_path / "inputs.pt"
    torch.save(torch.randn(1, 3, 32, 32), inputs)
    assert (
        pipeline_cli.main(
            ["--from", str(pte), "--inputs", str(inputs), "--out", str(out), "--runs", "2", "-q"]
        )
        == 0
    )
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["recipe"] is None and summary["backend"] == "xnnpack"
    assert "(fp32" not in printed and "(recipe unknown" in printed


@pytest.mark.parametrize("pex", [False, True])
def test_unimportable_factory_says_where_to_put_it(
    tmp_path: Path,
    pex: bool,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """ "is it on PYTHONPATH?" misled under ./pants run, whose PEX ignores PYTHONPATH."""
    if pex:
        monkeypatch.setenv("PEX", "/repo/dist/qnn_pipeline/cli.pex")
    else:
        monkeypatch.delenv("PEX", raising=False)
    argv = ["--model", "no_such_module_qnn:make", "--out", str(tmp_path / "out"), "-q"]
    assert pipeline_cli.main(argv) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "PEX_EXTRA_SYS_PATH" in line
    assert ("this is a PEX" in line) is pex


@pytest.mark.parametrize(
    ("argv", "expected", "stage"),
    [
        # Passed config validation and failed inside prepare; now refused with the config.
        (["--model", "tiny-cnn", "--seq-len", "1"], "prepare.seq_len", None),
        (["--model", "tiny-cnn", "--soc", "SM8650"], "soc", None),
        # Failed deep inside torch; now named from the model's config before its weights load.
        (["--model", "minilm", "--seq-len", "600"], "max_position_embeddings = 512", "prepare"),
    ],
)
def test_config_errors_come_before_work(
    tmp_path: Path,
    argv: list[str],
    expected: str,
    stage: str | None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out"
    assert pipeline_cli.main([*argv, "--out", str(out), "-q"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert expected in line
    assert ("[prepare]" in line) is (stage == "prepare")
    assert not any(out.glob("*/" + MANIFEST_NAME))


def test_qnn_sdk_is_checked_before_prepare(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("QNN_SDK_ROOT", str(tmp_path / "no-sdk"))
    out = tmp_path / "out"
    argv = [
        "--model",
        "tiny-cnn",
        "--backend",
        "qnn",
        "--soc",
        "SM8650",
        "--recipe",
        "fp16",
        "--out",
        str(out),
        "-q",
    ]
    assert pipeline_cli.main(argv) == 2
    assert "QNN_SDK_ROOT" in _one_error_line(capsys.readouterr().err)
    assert not list(out.glob("prepare-*"))


# --- class 9: noise ----------------------------------------------------------------------------


def test_third_party_noise_only_with_verbose(compiled: Path, tmp_path: Path) -> None:
    """The log opened with torchao's CUDA kernels, triton, pytree and the runtime's cpuinfo: infer
    alone imports all of them. (The LeafSpec FutureWarnings of exports: qnn_common/noise_test.)"""
    quiet = _run(infer_cli.__name__, str(compiled), "-o", str(tmp_path / "i"), "--runs", "2")
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert [n for n in NOISE if n in quiet.stderr] == [], quiet.stderr[-3000:]
    verbose = _run(
        infer_cli.__name__, str(compiled), "-o", str(tmp_path / "iv"), "--runs", "2", "-v"
    )
    assert verbose.returncode == 0, verbose.stderr[-2000:]
    assert [n for n in NOISE if n not in verbose.stderr] == ["LeafSpec"]


class _Slow(torch.nn.Module):
    """A few 2048 x 2048 matmuls on the portable kernels: seconds per run, for a 1 s bound."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(4):
            x = (x @ x) / 2048
        return x


def test_a_run_that_does_not_return_in_time_is_one_error_line(tmp_path: Path) -> None:
    """Issue 24: an emulator run went on for > 300 s with no word; a run now has a bound.

    The runtime holds the GIL while it runs, so this checks the bound fires from native code.
    """
    from executorch.exir import to_edge

    pte, inputs = tmp_path / "slow.pte", tmp_path / "x.pt"
    example = torch.randn(2048, 2048)
    pte.write_bytes(to_edge(torch.export.export(_Slow(), (example,))).to_executorch().buffer)
    torch.save((example,), inputs)
    start = time.monotonic()
    done = _run(pipeline_cli.__name__, "--from", str(pte), "--inputs", str(inputs),
                "--runs", "1", "--run-timeout", "1", "--out", str(tmp_path / "out"))
    assert done.returncode == 2, done.stderr[-2000:]
    line = _one_error_line(done.stderr)
    assert "did not return within 1 s" in line and "--run-timeout" in line, line
    assert time.monotonic() - start < 300
