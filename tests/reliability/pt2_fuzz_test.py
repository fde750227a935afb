"""Issue 27's fuzz test, `.pt2` half: flipped bytes and truncations of a real exported program.

Seeded and bounded: FLIPS single-byte flips at random offsets (random xor masks) and TRUNCATIONS
random cuts of one small program saved by torch.export.save, each loaded with `load_program` in
a child process (an abort takes the child down, not the test; the next child goes on after the
variant it died on). Every variant must be a clean PipelineError or load the very program saved:
0 crashes, 0 tracebacks, 0 other exceptions, 0 programs that load but differ. `QNN_FUZZ_SEED`
picks other variants.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest

from support.crafted_pt2 import save_plain_program
from support.resumable_children import run_cases

FLIPS = 300
TRUNCATIONS = 60
SEED = int(os.environ.get("QNN_FUZZ_SEED", "27"))

# In the child: load each variant, print one JSON line per variant, as it goes.
_LOADER = r"""
import json, sys
from pathlib import Path
import torch
from qnn_common.errors import PipelineError
from qnn_common.torchio.programs import load_program

original, first, paths = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
want = torch.export.load(original)  # the honest original: torch's own load is safe on it

def same(got):
    if got.graph_module.code != want.graph_module.code:
        return False
    a, b = got.state_dict, want.state_dict
    if a.keys() != b.keys() or not all(torch.equal(a[k], b[k]) for k in a):
        return False
    (x,), _ = got.example_inputs
    (y,), _ = want.example_inputs
    return torch.equal(x, y)

for index, path in enumerate(paths[first:], start=first):
    try:
        outcome = "correct" if same(load_program(Path(path))) else "wrong"
        message = ""
    except PipelineError as err:
        outcome, message = "error", str(err)
    except Exception as err:
        outcome, message = "exception", f"{type(err).__name__}: {err}"
    print(json.dumps({"index": index, "outcome": outcome, "message": message}), flush=True)
"""


def _variants(original: Path, directory: Path) -> list[Path]:
    data = original.read_bytes()
    rng = random.Random(SEED)
    paths = []
    for i in range(FLIPS):
        flipped = bytearray(data)
        flipped[rng.randrange(len(data))] ^= rng.randrange(1, 256)
        paths.append(directory / f"flip-{i}.pt2")
        paths[-1].write_bytes(bytes(flipped))
    for i in range(TRUNCATIONS):
        paths.append(directory / f"cut-{i}.pt2")
        paths[-1].write_bytes(data[: rng.randrange(len(data))])
    return paths


def test_flipped_and_truncated_pt2_files_are_clean_errors_or_the_same_program(
    tmp_path: Path,
) -> None:
    original = tmp_path / "plain.pt2"
    save_plain_program(original)
    paths = _variants(original, tmp_path)
    results, stderr = run_cases(
        lambda first: [sys.executable, "-c", _LOADER, str(original), str(first),
                       *map(str, paths)],
        len(paths), timeout=900,
    )
    counts: dict[str, int] = {}
    for record in results.values():
        counts[record["outcome"]] = counts.get(record["outcome"], 0) + 1
    bad = {
        paths[i].name: r for i, r in results.items() if r["outcome"] not in ("error", "correct")
    }
    assert not bad, f"{counts}: {dict(list(bad.items())[:5])}"
    assert "Traceback" not in stderr, stderr[-3000:]
    multi_line = [r["message"] for r in results.values() if "\n" in r["message"]]
    assert not multi_line, multi_line[:3]
    assert counts.get("error", 0) > len(paths) // 2  # the flips did reach what is checked
    print(f"pt2 fuzz, seed {SEED}: {counts}")


@pytest.mark.parametrize("cut", [0, 1, 21, 22])
def test_tiny_prefixes_are_clean_errors(tmp_path: Path, cut: int) -> None:
    """The edges random cuts rarely hit: empty, one byte, just under and at the size of an
    end-of-central-directory record."""
    from qnn_common.errors import ArtifactError
    from qnn_common.torchio.programs import load_program

    original = tmp_path / "plain.pt2"
    save_plain_program(original)
    path = tmp_path / "cut.pt2"
    path.write_bytes(original.read_bytes()[:cut])
    with pytest.raises(ArtifactError, match="is not an exported program"):
        load_program(path)
