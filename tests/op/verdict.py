"""Judges one matrix cell: runs it and compares what happened with what the case expects.

Shared by the test module and the coverage generator, so the table says exactly what the tests
assert.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import traceback
from dataclasses import dataclass

from op.harness import Harness, run_isolated
from qnn_common.recipes import Backend
from qnn_testing.cases import BY_NAME
from qnn_testing.checks import check_outputs, output_sqnr
from qnn_testing.coverage import Status
from qnn_testing.expect import Crashes, Measure, Raises, XFail, measure_for, resolve
from qnn_testing.matrix import Cell
from qnn_testing.structure import check_structure


@dataclass(frozen=True)
class Verdict:
    """A cell's status, the measured worst-output SQNR (if it ran), and why."""

    cell: Cell
    status: Status
    sqnr_db: float | None
    message: str
    seconds: float = 0.0


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def judge(cell: Cell, harness: Harness) -> Verdict:
    """Run `cell` and say whether it met its expectation (see `Status`)."""
    case = BY_NAME[cell.case]
    backend = cell.target.backend
    outcome, structure = resolve(case.all_rules, cell.target.name, backend, cell.precision)
    if case.host_unquantized and backend is not Backend.QNN:
        structure = dataclasses.replace(structure, qdq=False)
    label = f"{cell.case} on {cell.target.name} at {cell.precision.value}"
    if isinstance(outcome, Crashes):
        return _judge_crash(cell, outcome, harness, label)
    try:
        run = harness.run(case, cell.target, cell.precision)
    except Exception as exc:  # every stage error is a verdict, not a crash of the suite
        if isinstance(outcome, Raises):
            if isinstance(exc, outcome.exception) and outcome.match in str(exc):
                return Verdict(cell, Status.RAISES, None, f"raised as expected: {outcome.reason}")
            return Verdict(
                cell,
                Status.FAIL,
                None,
                f"{label}: expected {outcome.exception.__name__} "
                f"({outcome.match!r}), got {_first_line(exc)}",
            )
        detail = "".join(traceback.format_exception_only(exc)).strip()
        if isinstance(outcome, XFail):
            return Verdict(cell, Status.XFAIL, None, f"{outcome.reason} (raised: {detail})")
        return Verdict(cell, Status.FAIL, None, f"{label} raised {detail}")
    seconds = sum(run.seconds.values())
    sqnr = output_sqnr(run.reference, run.got)
    if isinstance(outcome, Raises):
        return Verdict(
            cell,
            Status.FAIL,
            sqnr,
            f"{label}: expected {outcome.exception.__name__} " f"({outcome.reason}), but it ran",
            seconds,
        )
    if isinstance(outcome, Measure):
        checks = outcome.checks
    else:
        checks = measure_for(case.all_rules, cell.target.name, backend, cell.precision).checks
    failures = check_structure(
        structure,
        run.lowered,
        quantized=cell.precision.is_quantized,
        qdq_nodes=run.qdq_nodes,
        backend_takes_qdq=backend is not Backend.PORTABLE,
    )
    failures += check_outputs(checks, run.reference, run.got)
    if isinstance(outcome, XFail):
        if failures:
            return Verdict(
                cell, Status.XFAIL, sqnr, f"{outcome.reason}: {'; '.join(failures)}", seconds
            )
        status = Status.FAIL if outcome.strict else Status.PASS
        return Verdict(
            cell,
            status,
            sqnr,
            f"{label}: expected to fail ({outcome.reason}) but " "passed: tighten the expectation",
            seconds,
        )
    if failures:
        return Verdict(cell, Status.FAIL, sqnr, f"{label}: " + "; ".join(failures), seconds)
    return Verdict(cell, Status.PASS, sqnr, "", seconds)


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _last_line(stderr: bytes) -> str:
    lines = stderr.decode(errors="replace").strip().splitlines()
    return f" ({lines[-1]})" if lines else ""


def _judge_crash(cell: Cell, outcome: Crashes, harness: Harness, label: str) -> Verdict:
    """Run the cell in a child process and check it died of the expected signal."""
    case = BY_NAME[cell.case]
    child = run_isolated(case, cell.target, cell.precision, harness.workdir)
    if child.returncode == -outcome.signal:
        return Verdict(
            cell,
            Status.RAISES,
            None,
            f"crashed as expected in a child process ({outcome.signal.name}): {outcome.reason}",
        )
    return Verdict(
        cell,
        Status.FAIL,
        None,
        f"{label}: expected a native crash ({outcome.signal.name}: {outcome.reason}), but the "
        f"child process ended with {_exit_text(child.returncode)}{_last_line(child.stderr)}: "
        "tighten the expectation",
    )


def sqnr_text(value: float | None) -> str:
    """A SQNR for tables: ``inf`` for exact, one decimal otherwise, ``-`` when not measured."""
    if value is None:
        return "-"
    return "inf" if math.isinf(value) and value > 0 else f"{value:.1f}"
