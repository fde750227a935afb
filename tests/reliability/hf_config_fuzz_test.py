"""Issue 49, Deliver 5: config.json fields fuzzed under `qnn-pipeline --model DIR --prompt`.

24 seeded mutations of tiny-llama's config.json (`support.config_fuzz`: wrong types, nulls,
zero, negative and huge numbers, inconsistent heads, odd `auto_map`s, deleted fields), each run
through the pipeline CLI's main() up to prepare, in one child process under a time bound. Every
case either succeeds or ends in exactly one `error:` line with exit code 2: no traceback, no
abort, no hang. Most cases are refused before any export (the config's fields are checked
first); the few valid ones export tiny-llama (seconds each).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from support import config_fuzz
from support.crafted_hf import tiny_decoder_dir
from support.pipeline_runs import child_env

SEED = 49
CASES = 24


def test_fuzzed_config_fields_end_in_one_error_line_or_a_run(tmp_path: Path) -> None:
    base = tiny_decoder_dir(tmp_path / "base")
    cases = config_fuzz.mutations(SEED, CASES)
    dirs = []
    for i, case in enumerate(cases):
        model = tmp_path / f"case{i}"
        shutil.copytree(base, model)
        config_fuzz.apply(model / "config.json", case)
        dirs.append([str(model), str(tmp_path / f"out{i}")])
    listing = tmp_path / "cases.json"
    listing.write_text(json.dumps(dirs), encoding="utf-8")

    done = subprocess.run(
        [sys.executable, "-m", config_fuzz.__name__, str(listing)],
        env=child_env(), text=True, capture_output=True, timeout=config_fuzz.HANG_S * 4,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]  # the child itself: no abort, no crash
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(cases), done.stderr[-3000:]
    bad = []
    for case, result in zip(cases, results, strict=True):
        ok = not result["traceback"] and (
            (result["code"] == 0 and not result["errors"])
            or (result["code"] == 2 and len(result["errors"]) == 1)
        )
        if not ok:
            bad.append(f"{case}: {result}")
    assert not bad, "\n".join(bad)
    refused = sum(r["code"] == 2 for r in results)
    assert refused >= CASES // 2, f"only {refused} of {CASES} mutations were refused"
