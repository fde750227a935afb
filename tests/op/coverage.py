"""Generate docs/op_coverage.md: run the op matrix and tabulate pass / expected failure / fail.

    ./pants run tests/op/coverage.py -- --targets xnnpack,portable,qnn-v75
    QNN_OP_SUITE=full ./pants run tests/op/coverage.py -- --out docs/op_coverage.md

The cells are those the suite runs in the chosen mode (QNN_OP_SUITE, or --mode), judged by the
same code as the tests (`op.verdict.judge`). `--rows` saves the measured rows (JSON lines, as
they are measured) and `--merge` renders the table from saved rows, so targets can be measured
in separate processes and a cell re-measured alone.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from op.harness import Harness
from op.verdict import judge, sqnr_text
from qnn_common.recipes import Recipe
from qnn_testing.cases import BY_NAME, CATALOGUE
from qnn_testing.coverage import Row, Status, render, summary
from qnn_testing.matrix import TARGETS, Mode, cells, mode_from_env, targets_from_env


def _row_json(row: Row) -> dict[str, str]:
    return {
        "case": row.case,
        "family": row.family,
        "target": row.target,
        "precision": row.precision.value,
        "status": row.status.value,
        "sqnr": row.sqnr,
        "message": row.message,
    }


def _row(data: dict[str, str]) -> Row:
    return Row(
        data["case"],
        data["family"],
        data["target"],
        Recipe(data["precision"]),
        Status(data["status"]),
        data["sqnr"],
        data["message"],
    )


def measure(
    targets: str | None,
    mode: Mode,
    limit: int | None,
    rows_path: Path | None,
    patterns: Sequence[str] = ("*",),
) -> list[Row]:
    """Run every selected cell, printing one line per cell as it goes.

    With `rows_path`, each row is appended to it as a JSON line as soon as it is measured, so an
    interrupted run keeps what it measured.
    """
    env = {} if targets is None else {"QNN_OP_TARGETS": targets}
    chosen = targets_from_env(env) if targets else targets_from_env()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        harness = Harness(Path(tmp))
        chosen_cells = [
            c
            for c in cells(CATALOGUE, chosen, mode)
            if any(fnmatch.fnmatchcase(c.case, p) for p in patterns)
        ]
        for i, cell in enumerate(chosen_cells):
            if limit is not None and i >= limit:
                break
            start = time.perf_counter()
            verdict = judge(cell, harness)
            row = Row(
                cell.case,
                BY_NAME[cell.case].family,
                cell.target.name,
                cell.precision,
                verdict.status,
                sqnr_text(verdict.sqnr_db),
                verdict.message,
            )
            rows.append(row)
            if rows_path is not None:
                with rows_path.open("a") as f:
                    f.write(json.dumps(_row_json(row)) + "\n")
            print(
                f"{cell.id}: {verdict.status.value} {sqnr_text(verdict.sqnr_db)} dB "
                f"({time.perf_counter() - start:.1f} s) {verdict.message[:200]}",
                flush=True,
            )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Measure (or merge) and write the Markdown table; exit 1 if any cell failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--targets",
        help="comma-separated, e.g. xnnpack,portable,qnn-v75 "
        "(default: QNN_OP_TARGETS, else all)",
    )
    parser.add_argument(
        "--mode",
        choices=[m.value for m in Mode],
        help="default or full (default: QNN_OP_SUITE, else default)",
    )
    parser.add_argument("--out", type=Path, default=Path("docs/op_coverage.md"))
    parser.add_argument("--rows", type=Path, help="also save the measured rows here (JSON lines)")
    parser.add_argument(
        "--merge", type=Path, nargs="+", help="render from saved rows instead of measuring"
    )
    parser.add_argument("--limit", type=int, help="stop after this many cells (a quick look)")
    parser.add_argument("--note", default="", help="a sentence to add to the page's preamble")
    parser.add_argument(
        "--cases",
        default="*",
        help="comma-separated case name patterns (fnmatch), e.g. 'conv*,add'",
    )
    args = parser.parse_args(argv)
    mode = Mode(args.mode) if args.mode else mode_from_env()
    if args.merge:
        # Later rows win: a re-measured cell replaces the earlier one.
        merged = {}
        for path in args.merge:
            for line in path.read_text().splitlines():
                if line.strip():
                    row = _row(json.loads(line))
                    if row.case in BY_NAME:  # rows of cases since removed are dropped
                        merged[(row.case, row.target, row.precision)] = row
        order = {c.name: i for i, c in enumerate(CATALOGUE)}
        rows = sorted(merged.values(), key=lambda r: order.get(r.case, len(order)))
    else:
        if args.rows:
            args.rows.write_text("")
        rows = measure(args.targets, mode, args.limit, args.rows, args.cases.split(","))
    present = {r.target for r in rows}
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    preamble = (
        f"Generated {stamp} by `./pants run tests/op/coverage.py` ({mode.value} mode; "
        "`QNN_OP_SUITE=full` for every cell). Each cell: the verdict and the worst output's SQNR "
        "in dB against its reference (eager fp32 for float precisions, the fake-quantized model "
        "for quantized ones); `xfail` = an expected failure, `raises` = an expected exception, "
        "both with their reasons below; an empty cell was not run in this mode. QNN runs on the "
        "x86 HTP emulator (QNN 2.51 through the project's bridge), one SoC per HTP arch."
        + (f" {args.note}" if args.note else "")
    )
    text = render(rows, [t for t in TARGETS if t.name in present], "Operator coverage", preamble)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    for target, counts in summary(rows).items():
        print(target, {s.value: n for s, n in counts.items()})
    return 1 if any(r.status is Status.FAIL for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
