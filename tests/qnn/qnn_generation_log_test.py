"""Issue 49, item 10: generating on the HTP, the QNN runtime's log reached the streamed text.

`qnn-pipeline --backend qnn --prompt ...` printed fourteen `[INFO] [Qnn ExecuTorch]` lines (each
method's load) and a `[WARNING]` right before the tokens, the emulator's ` # LIBNATIVE` line on
stdout, and four `Destroy Qnn ...` lines after the report. Measured before the fix on tiny-llama
16a8w, SM8650, on the x86 emulator; the unit test is qnn_infer/generate_test.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from qnn_pipeline import cli as pipeline_cli
from support.pipeline_runs import child_env

PROMPT = "Once upon a time"


def test_the_streamed_text_is_not_interleaved_with_the_runtime_log(tmp_path: Path) -> None:
    argv = ["--model", "tiny-llama", "--backend", "qnn", "--soc", "SM8650", "--recipe", "16a8w",
            "--prompt", PROMPT, "--max-new-tokens", "8", "--calibration-samples", "2",
            "--max-seq-len", "64", "--prefill-len", "16", "--out", str(tmp_path / "out")]
    # One stream, as a terminal shows the two.
    done = subprocess.run([sys.executable, "-m", pipeline_cli.__name__, *argv], env=child_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=1500, check=False)
    assert done.returncode == 0, done.stdout[-3000:]
    # From the infer stage on, to the report and the process's exit (the compile stage's own
    # start of the emulator prints its LIBNATIVE line once, long before any text streams).
    lines = done.stdout.splitlines()
    lines = lines[next(i for i, line in enumerate(lines) if "infer started" in line):]
    runtime = [line for line in lines if "[Qnn ExecuTorch]" in line or "LIBNATIVE" in line]
    assert runtime == [], "\n".join(runtime)
    # The streamed text is the line right before the stage's "generated" log line.
    at = next(i for i, line in enumerate(lines) if "generated 8 token(s): ttft" in line)
    streamed = lines[at - 1]
    assert streamed.strip() and "infer started" not in streamed, lines[at - 3:at + 1]
    assert f"generated 8 token(s): {streamed!r}" in done.stdout  # the report quotes the same
