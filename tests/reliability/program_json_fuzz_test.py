"""Issue 49, deliverable 5, `.pt2` program JSON half: seeded mutations of a real program's
`models/model.json` (symbolic sizes, guards, node targets, range constraints, tree specs, any
value), each loaded and run in a child process (`support.program_json_fuzz`).

0 code executions (the marker every hostile string would write never appears), 0 exceptions
other than our PipelineError at load, 0 crashes, 0 hangs past the bound, and every refusal is one
line. `QNN_FUZZ_SEED` picks other variants.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from support.crafted_pt2 import save_plain_program
from support.program_json_fuzz import variants
from support.resumable_children import run_cases

PER_CLASS = 25
SEED = int(os.environ.get("QNN_FUZZ_SEED", "49"))
BOUND_S = 600  # for all the variants of one program; each loads in well under a second


def _dynamic_program(path: Path) -> None:
    """A program with symbolic sizes and range constraints: what the size mutations start from."""
    class Halve(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.linear(x[1:]), torch.zeros(x.shape[0] // 2)

    torch.manual_seed(0)
    dim = torch.export.Dim("b", min=4, max=64)
    program = torch.export.export(Halve(), (torch.randn(8, 3),), dynamic_shapes=({0: dim},))
    torch.export.save(program, path)


@pytest.mark.parametrize("kind", ["plain", "dynamic"])
def test_program_json_mutations_run_no_code_and_are_clean(tmp_path: Path, kind: str) -> None:
    original = tmp_path / f"{kind}.pt2"
    if kind == "plain":
        save_plain_program(original)
    else:
        _dynamic_program(original)
    marker = tmp_path / "marker"
    paths = variants(original, tmp_path, marker, SEED, PER_CLASS)
    results, stderr = run_cases(
        lambda first: [sys.executable, "-m", "support.program_json_fuzz", str(first),
                       *map(str, paths)],
        len(paths), timeout=BOUND_S,
    )
    counts = Counter(record["outcome"] for record in results.values())
    print(f"program JSON fuzz ({kind}), seed {SEED}: {dict(counts)}")
    assert not marker.exists(), "a mutated program JSON ran code"
    bad = {paths[i].name: r for i, r in results.items() if r["outcome"] in ("exception", "crash")}
    assert not bad, f"{dict(counts)}: {dict(list(bad.items())[:5])}"
    assert "Traceback" not in stderr, stderr[-3000:]
    multi_line = [r["message"] for r in results.values()
                  if r["outcome"] == "error" and "\n" in r["message"]]
    assert not multi_line, multi_line[:3]
    assert counts["error"] > len(paths) // 3  # the mutations reached what is checked
