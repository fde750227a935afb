"""The third-party noise filter: known messages dropped, anything else kept, nothing with -v."""

from __future__ import annotations

import logging
import os
import sys
import warnings

import pytest

from qnn_common.cli import noise


@pytest.fixture
def quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    """quiet_third_party() for one test: its module state and environment are put back after."""
    monkeypatch.setattr(noise, "_quiet", False)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")  # the user's own choice is kept
    noise.quiet_third_party()


def test_known_log_noise_is_dropped_and_the_rest_kept(
    quiet: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("torchao").warning(
            "Failed to load /x/_C_mxfp8.so: Could not load this library: /x/_C_mxfp8.so"
        )
        logging.getLogger("torchao.kernel.intmm").warning("Warning: Detected no triton, ...")
        logging.getLogger("torch.utils._pytree").warning(
            "<enum 'K'> is an Enum subclass and is now natively supported by torch.compile"
        )
        logging.getLogger("torchao").warning("a real problem")
    assert [r.getMessage() for r in caplog.records] == ["a real problem"]
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "0"


def test_library_warnings_are_dropped_ours_kept(quiet: None) -> None:
    with warnings.catch_warnings(record=True) as caught:
        noise.quiet_third_party()  # idempotent; the filters are already in place
        warnings.warn_explicit("internal", FutureWarning, "x.py", 1, module="torch.export")
        warnings.warn_explicit(
            "`isinstance(treespec, LeafSpec)` is deprecated",
            FutureWarning,
            "copyreg.py",
            105,
            module="copyreg",
        )
        warnings.warn_explicit("ours", FutureWarning, "y.py", 1, module="qnn_quant.api")
    assert [str(w.message) for w in caught] == ["ours"]


def test_native_noise_filtered(quiet: None, capfd: pytest.CaptureFixture[str]) -> None:
    with noise.native_noise_filtered():
        os.write(sys.stderr.fileno(), b"[cpuinfo_utils.cpp:71] Reading file /sys/x\n")
        os.write(sys.stderr.fileno(), b"E 00:00:01 executorch: a real error\n")
    assert capfd.readouterr().err == "E 00:00:01 executorch: a real error\n"


def test_nothing_is_filtered_without_quiet(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(noise, "_quiet", False)  # what -v leaves in place
    with noise.native_noise_filtered():
        os.write(sys.stderr.fileno(), b"[cpuinfo_utils.cpp:71] Reading file /sys/x\n")
    assert "cpuinfo" in capfd.readouterr().err


def test_executorch_lowering_warnings_are_dropped(
    quiet: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 24: seen on every QNN lowering of a real model."""
    from executorch.exir.pass_manager import PassManager

    with caplog.at_level(logging.DEBUG):
        PassManager()  # the real constructor logs its deprecation
        # ExecuTorch logs this through logging.warn (the root logger), once per op.
        logging.warning(
            "Op aten.unbind.int was requested for preservation by partitioner.  This request "
            "is ignored because it aliases output."
        )
        logging.warning("Op aten.unbind.int is a real problem")
    assert [r.getMessage() for r in caplog.records] == ["Op aten.unbind.int is a real problem"]


def test_printed_noise_filtered(quiet: None, capsys: pytest.CaptureFixture[str]) -> None:
    with noise.printed_noise_filtered():
        print("No quant config is implemented for op, aten.dropout.default")
        print("No quant config is implemented for op, aten.alias.default")
        print("No quant config is implemented for op, aten.gelu.default")
        print("tail without newline", end="")
    assert capsys.readouterr().out == (
        "No quant config is implemented for op, aten.gelu.default\ntail without newline"
    )


def test_qnn_runtime_info_lines_are_dropped(quiet: None, capfd: pytest.CaptureFixture[str]) -> None:
    with noise.native_noise_filtered():
        os.write(sys.stderr.fileno(), b"[INFO] [Qnn ExecuTorch]: Destroy Qnn context\n")
        os.write(sys.stderr.fileno(), b"[ERROR] [Qnn ExecuTorch]: a real error\n")
    assert capfd.readouterr().err == "[ERROR] [Qnn ExecuTorch]: a real error\n"
