"""The op coverage table: op x target x precision -> pass / expected failure / fail, as Markdown.

Pure formatting: the rows come from whoever ran the cells (tests/op/coverage.py).
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Sequence
from dataclasses import dataclass

from qnn_common.recipes import Recipe
from qnn_testing.matrix import OpTarget


class Status(enum.StrEnum):
    """A cell's verdict."""

    PASS = "pass"
    XFAIL = "xfail"  # an expected failure that failed as expected
    RAISES = "raises"  # an expected exception, raised
    FAIL = "fail"  # missed its expectation (a regression, or an unexpected pass)

    @property
    def ok(self) -> bool:
        """Whether the suite is green on this cell."""
        return self is not Status.FAIL


@dataclass(frozen=True)
class Row:
    """One measured cell."""

    case: str
    family: str
    target: str
    precision: Recipe
    status: Status
    sqnr: str  # as printed: "41.2", "inf", "-"
    message: str = ""


_MARK = {Status.PASS: "pass", Status.XFAIL: "xfail", Status.RAISES: "raises", Status.FAIL: "FAIL"}


def summary(rows: Sequence[Row]) -> dict[str, collections.Counter[Status]]:
    """Counts of each status per target."""
    counts: dict[str, collections.Counter[Status]] = {}
    for row in rows:
        counts.setdefault(row.target, collections.Counter())[row.status] += 1
    return counts


def render(rows: Sequence[Row], targets: Sequence[OpTarget], title: str, preamble: str) -> str:
    """The Markdown page: a summary per target, one table per op family, then the reasons."""
    columns = [
        (t.name, p)
        for t in targets
        for p in t.precisions
        if any(r.target == t.name and r.precision is p for r in rows)
    ]
    by_cell = {(r.case, r.target, r.precision): r for r in rows}
    lines = [
        f"# {title}",
        "",
        preamble,
        "",
        "## Summary",
        "",
        "| target | cells | pass | expected failure | expected exception | fail |",
        "|---|---|---|---|---|---|",
    ]
    for target, counts in summary(rows).items():
        lines.append(
            f"| {target} | {sum(counts.values())} | {counts[Status.PASS]} | "
            f"{counts[Status.XFAIL]} | {counts[Status.RAISES]} | {counts[Status.FAIL]} |"
        )
    families: dict[str, list[str]] = {}
    for row in rows:
        names = families.setdefault(row.family, [])
        if row.case not in names:
            names.append(row.case)
    header = "| op | " + " | ".join(f"{t} {p.value}" for t, p in columns) + " |"
    for family, names in families.items():
        lines += ["", f"## {family}", "", header, "|---" * (len(columns) + 1) + "|"]
        for name in names:
            cells = []
            for target, precision in columns:
                found = by_cell.get((name, target, precision))
                cells.append("" if found is None else f"{_MARK[found.status]} {found.sqnr}")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    notes = [r for r in rows if r.status is not Status.PASS and r.message]
    if notes:
        lines += ["", "## Expected failures, exceptions and failures", ""]
        for r in notes:
            lines.append(
                f"- `{r.case}` {r.target} {r.precision.value} ({r.status.value}): "
                f"{_one_line(r.message)}"
            )
    return "\n".join(lines) + "\n"


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split()).replace("|", "\\|")
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
