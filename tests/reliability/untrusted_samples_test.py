"""Issue 49, items 3, 4 and 9 for sample files (`--inputs`, `--calibration-file`, an artifact's
eval inputs): small `.pt` files that hung or exhausted every reader, and torch's advice to drop
the weights-only restriction reaching users.

A 2 KB file of lists sharing their children (``a = [a, a]`` forty times) hung the structure
check, which walked 2^40 paths; a dict key of shared tuples hung torch.load itself (unpickling
hashes the key); a 0.5 MB file whose tensor storage is deflated took its full inflated size in
memory. Each runs in a child process, under a timeout where it used to hang.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from qnn_common.errors import ArtifactError
from qnn_common.torchio.samples import check_structure, load_inputs, load_samples, save_samples
from support.crafted_pt2 import Payload
from support.crafted_samples import (
    deep_lists,
    deflated_storage,
    self_containing_list,
    shared_lists,
    shared_tuple_key,
    torch_bytes,
)
from support.pipeline_runs import child_env

# What used to hang must end in well under this (refusing takes milliseconds).
_HANG = 60

_LOAD = """
import resource, sys
from pathlib import Path
from qnn_common.errors import ArtifactError
from qnn_common.torchio import samples
try:
    loaded = getattr(samples, sys.argv[1])(Path(sys.argv[2]))
    print("loaded", len(loaded))
except ArtifactError as err:
    print("refused:", err)
print("peak_rss_mib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def _load_in_child(path: Path, loader: str = "load_inputs") -> tuple[str, int]:
    """The child's one line (``refused: ...`` or ``loaded N``) and its peak RSS in MiB."""
    done = subprocess.run(
        [sys.executable, "-c", _LOAD, loader, str(path)],
        env=child_env(), text=True, capture_output=True, timeout=_HANG, check=False,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    first, last = done.stdout.splitlines()[0], done.stdout.splitlines()[-1]
    return first, int(last.split()[1])


# --- item 3: shared children, counted once -------------------------------------------------------


@pytest.mark.parametrize("loader", ["load_inputs", "load_samples"])
def test_lists_sharing_their_children_are_refused_at_once(tmp_path: Path, loader: str) -> None:
    path = shared_lists(tmp_path / "dag.pt", 40)
    assert path.stat().st_size < 16_000
    line, _ = _load_in_child(path, loader)
    assert line.startswith("refused:") and str(path) in line, line
    assert "shared parts are expanded" in line and "torch.save" in line, line


def test_a_dict_key_of_shared_tuples_never_reaches_torch_load(tmp_path: Path) -> None:
    """torch.load alone hangs on this one: the unpickler hashes the key, walking every path."""
    line, _ = _load_in_child(shared_tuple_key(tmp_path / "key.pt", 40))
    assert line.startswith("refused:") and "dict key that is a container" in line, line


@pytest.mark.parametrize(
    ("make", "reason"),
    [(self_containing_list, "contains itself"),
     (lambda p: deep_lists(p, 100_000), "nests deeper than")],
    ids=["self-containing", "deep"],
)
def test_self_reference_and_deep_nesting_are_one_line(
    tmp_path: Path, make: object, reason: str
) -> None:
    """Both ended in a RecursionError traceback from the structure check."""
    path = make(tmp_path / "odd.pt")  # type: ignore[operator]
    with pytest.raises(ArtifactError, match=reason):
        load_inputs(path)


_CHECK_DAG = """
from qnn_common.torchio.samples import check_structure
import torch
value = [torch.zeros(1)]
for _ in range(40):
    value = [value, value]
print(check_structure((value,), "args"))
"""


def test_check_structure_counts_a_shared_container_once() -> None:
    """Values that never were a file (a factory's example inputs) take the same bounded check."""
    done = subprocess.run([sys.executable, "-c", _CHECK_DAG], env=child_env(), text=True,
                          capture_output=True, timeout=_HANG, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "args[0]" in done.stdout and "shared parts are expanded" in done.stdout, done.stdout
    cycle: list[object] = [torch.zeros(1)]
    cycle.append(cycle)
    assert check_structure((cycle,), "args") == "args[0][1] contains itself"


def test_honest_samples_repeating_one_sample_still_load(tmp_path: Path) -> None:
    """Sharing is refused only when it expands past the bound: ``[sample] * 8`` is fine."""
    sample = (torch.ones(1, 3, 8, 8), [torch.zeros(2)], {"scale": torch.ones(1)})
    path = tmp_path / "repeated.pt"
    path.write_bytes(torch_bytes([sample] * 8))
    loaded = load_inputs(path)
    assert len(loaded) == 8 and loaded[0].describe() == loaded[7].describe()
    save_samples(tmp_path / "again.pt", loaded)
    assert len(load_inputs(tmp_path / "again.pt")) == 8


def test_qnn_prepare_refuses_a_shared_calibration_file_in_one_line(tmp_path: Path) -> None:
    """The issue's reproduction through the CLI: it hung; now one `error:` line, exit 2."""
    from qnn_prepare import cli

    path = shared_lists(tmp_path / "calibration.pt", 40)
    done = subprocess.run(
        [sys.executable, "-m", cli.__name__, "--model", "tiny-cnn", "--calibration-file",
         str(path), "--calibration-samples", "2", "--out", str(tmp_path / "out")],
        env=child_env(), text=True, capture_output=True, timeout=_HANG * 3, check=False,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(path) in errors[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr


# --- item 4: decompressed sizes bounded before decompression -------------------------------------

_DECLARED = 256 * 2**20


def test_a_deflated_storage_is_refused_from_its_header(tmp_path: Path) -> None:
    """torch inflated the whole storage before anything looked at it: peak RSS grew by its
    declared size. Now the zip header's size refuses it, at the memory of a tiny honest load."""
    bomb = deflated_storage(tmp_path / "bomb.pt", _DECLARED)
    assert bomb.stat().st_size < _DECLARED // 200
    honest = tmp_path / "honest.pt"
    save_samples(honest, [(torch.zeros(4),)])
    line, peak = _load_in_child(bomb)
    _, baseline = _load_in_child(honest)
    assert line.startswith("refused:") and "data/0" in line and "inflates to" in line, line
    assert peak < baseline + 64, f"peak RSS {peak} MiB refusing it, {baseline} MiB for 16 bytes"


# --- item 9: torch's advice to drop the weights-only restriction never reaches users -------------


def test_a_pickled_object_is_refused_unrun_without_torchs_advice(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "payload.pt"
    path.write_bytes(torch_bytes([Payload(marker, "__import__('torch').zeros(2)")]))
    with pytest.raises(ArtifactError) as caught:
        load_samples(path)
    message = str(caught.value)
    assert not marker.exists()
    assert "weights_only" not in message and "\n" not in message, message
    assert "eval, which only an unrestricted unpickler would load" in message, message
    assert "never unpickled without restriction" in message
    assert "torch.save" in message


@pytest.mark.parametrize(
    "content",
    [b"not a torch file", b"PK\x05\x06" + bytes(18)],
    ids=["garbage", "empty-zip"],
)
def test_unreadable_files_get_our_message(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.pt"
    path.write_bytes(content)
    with pytest.raises(ArtifactError) as caught:
        load_inputs(path)
    message = str(caught.value)
    assert "weights_only" not in message and "\n" not in message, message
    assert "torch.save" in message
