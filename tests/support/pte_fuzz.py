"""The .pte fuzz driver: every variant through `qnn-infer`'s main, in one process, tallied.

Run as `python -m support.pte_fuzz PTE INPUTS WORKDIR SEED FLIPS SEGMENT_FLIPS TRUNCATIONS`, in a
child process: an abort that got past the CLI would end this process, which is what the test
checks first. Prints one JSON object: the count per outcome and the variants that were neither a
clean error (exit 2, one `error:` line, no traceback) nor a completed run (exit 0).
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from qnn_common.torchio.samples import Sample, load_samples
from qnn_infer.cli import main as infer_main
from support.pipeline_runs import leftovers
from support.pte_variants import fuzz_variants


def _outcome(code: int, stderr: str) -> str:
    lines = stderr.splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    # A traceback, or the runtime's own dying words (not our error line quoting them).
    if any(line.startswith(("Traceback", "terminate called")) for line in lines):
        return "traceback"
    if code == 0 and not errors:
        return "ran"
    if code == 2 and len(errors) == 1:
        return "error: runtime crashed" if "runtime crashed" in errors[0] else "error"
    return f"exit {code} with {len(errors)} error line(s)"


def fuzz(
    pte: Path, inputs: Path, work: Path, seed: int, counts: tuple[int, int, int]
) -> dict[str, Any]:
    flips, segment_flips, truncations = counts
    out, variant = work / "out", work / "variant.pte"
    argv = [str(variant), "--inputs", str(inputs), "-o", str(out), "--warmup", "0", "--runs", "1",
            "-q", "--no-accuracy-gates"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert infer_main([str(pte), *argv[1:]]) == 0
    expected = load_samples(out / "outputs.pt")
    tally: Counter[str] = Counter()
    bad: list[dict[str, str]] = []
    examples: dict[str, str] = {}
    for label, data in fuzz_variants(pte.read_bytes(), seed=seed, flips=flips,
                                     segment_flips=segment_flips, truncations=truncations):
        shutil.rmtree(out, ignore_errors=True)
        variant.write_bytes(data)
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
                code = infer_main(argv)
        except Exception:  # a traceback the CLI let through: what the fuzz is looking for
            stderr.write(traceback.format_exc())
            code = 1
        outcome = _outcome(code, stderr.getvalue())
        if outcome == "ran":
            got = load_samples(out / "outputs.pt")
            outcome = "ran: same outputs" if _same(expected, got) else "ran: other outputs"
        left = [name for name in leftovers(work) if name != ".pytest_cache"]
        if left:
            outcome = "left files behind"
        tally[outcome] += 1
        examples.setdefault(outcome, f"{label}: {stderr.getvalue().strip()[-300:]}")
        if not outcome.startswith(("ran", "error")):
            bad.append({"variant": label, "outcome": outcome, "stderr": stderr.getvalue()[-2000:],
                        "left": ", ".join(left)})
    return {"tally": dict(tally), "bad": bad, "examples": examples}


def _same(expected: list[Sample], got: list[Sample]) -> bool:
    return len(expected) == len(got) and all(
        len(x) == len(y) and all(torch.equal(a, b) for a, b in zip(x, y, strict=True))
        for x, y in zip(expected, got, strict=True)
    )


def main(argv: list[str]) -> int:
    pte, inputs, work = (Path(a) for a in argv[:3])
    seed, *counts = (int(a) for a in argv[3:7])
    report = fuzz(pte, inputs, work, seed, (counts[0], counts[1], counts[2]))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
