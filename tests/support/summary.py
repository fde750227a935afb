"""Reading a pipeline run's summary.json the way the suites check it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_summary(out: Path) -> dict[str, Any]:
    """The summary.json of the run whose output directory is `out`."""
    data = json.loads((out / "summary.json").read_text())
    assert isinstance(data, dict)
    return data


def stage_statuses(summary: dict[str, Any]) -> dict[str, str]:
    """Stage name -> "ran" / "cached" / "skipped"."""
    stages = summary["stages"]
    assert isinstance(stages, list)
    return {s["name"]: s["status"] for s in stages}
