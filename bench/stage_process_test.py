"""`run_stage`'s child imports the stage CLIs however the bench was launched (issue 24).

Under `./pants run bench/pipeline_bench.py` the first-party code is on the PEX's path, not in the
environment; the child (`sys.executable -c ... runpy`) ended in `No module named qnn_prepare.cli`.
Here the environment carries no PYTHONPATH, as in that PEX, and the path is only this process's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from stage_process import run_stage


def test_stage_child_imports_the_cli_without_pythonpath(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTHONPATH", raising=False)
    seconds, peak_mb = run_stage(["qnn_prepare.cli", "--help"], tmp_path)
    assert seconds > 0 and peak_mb > 0
