"""Issue 27, classes 1, 6 and 8 for `.pt2` files: what passes the archive check is what torch loads.

A checker that keys members by normalized names checks one copy while torch loads another; one
that reads every member holds a 3 GiB deflated member in memory; a bad CRC ended qnn-compile with
a traceback. Each test reproduces that on a real exported program, then checks it is refused with
one message, the payload unrun.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from qnn_common.errors import ArtifactError
from qnn_common.torchio.programs import load_program
from qnn_common.torchio.pt2_archive import check_pt2_archive
from qnn_compile.cli import main as compile_main
from support.crafted_pt2 import ALIASES, save_plain_program, shadow, with_member
from support.pipeline_runs import child_env


@pytest.fixture(scope="module")
def plain_pt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pt2") / "plain.pt2"
    save_plain_program(path)
    return path


# --- 1. a second name for a member -------------------------------------------------------------


@pytest.mark.parametrize("alias", ["dot", "double-slash"])
def test_a_shadowed_member_runs_code_in_torch(plain_pt2: Path, tmp_path: Path, alias: str) -> None:
    """The reproduction: torch looks the exact name up, gets the payload and retries it with
    weights_only=False."""
    marker = tmp_path / "marker"
    evil = shadow(plain_pt2, tmp_path / "evil.pt2", marker, alias)
    with contextlib.suppress(Exception):
        torch.export.load(evil)
    assert marker.exists(), "the shadowed archive no longer exploits torch.export.load"


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_a_member_with_two_names_is_refused_unrun(
    plain_pt2: Path, tmp_path: Path, alias: str
) -> None:
    marker = tmp_path / "marker"
    evil = shadow(plain_pt2, tmp_path / "evil.pt2", marker, alias)
    with pytest.raises(ArtifactError, match="sample_inputs/model.pt") as info:
        load_program(evil)
    assert info.value.path == evil
    assert "name" in info.value.reason and "torch.export.save" in info.value.reason
    assert not marker.exists()


@pytest.mark.parametrize(
    "name", ["../model.pt", "data/../models/x.json", "/abs/x", "data\\x", "other-root/x"]
)
def test_member_names_torch_export_save_never_writes_are_refused(
    plain_pt2: Path, tmp_path: Path, name: str
) -> None:
    bad = tmp_path / "bad.pt2"
    with zipfile.ZipFile(plain_pt2) as src, zipfile.ZipFile(bad, "w") as out:
        for member in src.infolist():
            out.writestr(member.filename, src.read(member))
        out.writestr(name if name.startswith(("/", "other")) else f"plain/{name}", b"x")
    with pytest.raises(ArtifactError, match="member name") as info:
        load_program(bad)
    assert info.value.path == bad


def test_torch_never_unpickles_what_it_could_retry_unrestricted(plain_pt2: Path) -> None:
    """torch's loader gets the sample inputs as b"" (which it reads as none, without unpickling),
    so its weights_only=False retry cannot be reached; they come back from our weights-only load,
    equal to what was saved."""
    with plain_pt2.open("rb") as file:
        checked = check_pt2_archive(plain_pt2, file)
    with zipfile.ZipFile(io.BytesIO(checked.archive)) as handed:
        samples = [n for n in handed.namelist() if "/data/sample_inputs/" in n]
        assert samples and all(handed.read(n) == b"" for n in samples)
    loaded = load_program(plain_pt2)
    saved = torch.export.load(plain_pt2)  # the honest original: torch's own load is safe here
    assert loaded.example_inputs is not None and saved.example_inputs is not None
    (got,), _ = loaded.example_inputs
    (want,), _ = saved.example_inputs
    assert torch.equal(got, want)
    assert loaded.graph_module.code == saved.graph_module.code


# --- 6. sizes are bounded by the headers, before anything is inflated ---------------------------

_GIB = 2**30

_PEAK_RSS = """
import resource, sys
from pathlib import Path
from qnn_common.errors import ArtifactError
from qnn_common.torchio.programs import load_program
try:
    load_program(Path(sys.argv[1]))
    print("loaded")
except ArtifactError as err:
    print("refused:", err.reason)
print("peak_rss_kib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


@pytest.fixture(scope="module")
def bomb_pt2(plain_pt2: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return with_member(plain_pt2, tmp_path_factory.mktemp("bomb") / "bomb.pt2", "extra/z", 3 * _GIB)


def test_a_3_gib_deflated_member_is_refused_from_its_header(bomb_pt2: Path) -> None:
    """The issue's 3.2 MB archive with a 3 GiB member: refused in the memory of a plain load."""
    assert bomb_pt2.stat().st_size < 8 * 2**20
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS, str(bomb_pt2)],
        env=child_env(), text=True, capture_output=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("refused:") and "extra/z" in lines[0] and "GiB" in lines[0], lines
    peak_gib = int(lines[-1].split()[1]) / 2**20
    assert peak_gib < 1.5, f"peak RSS {peak_gib:.2f} GiB refusing a 3 GiB member"


def test_members_overlapping_in_the_file_are_refused(plain_pt2: Path, tmp_path: Path) -> None:
    """A zip bomb's other trick: central-directory entries that point at the same bytes."""
    data = bytearray(plain_pt2.read_bytes())
    with zipfile.ZipFile(plain_pt2) as archive:
        first, _ = archive.infolist()[:2]
        second_record = archive.start_dir + 46 + len(first.filename) + len(first.extra)
    # The second record's local-header offset (at +42) now points at the first member.
    data[second_record + 42 : second_record + 46] = first.header_offset.to_bytes(4, "little")
    bad = tmp_path / "overlap.pt2"
    bad.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="overlap") as info:
        load_program(bad)
    assert info.value.path == bad


# --- 8. a corrupt archive is one error line, exit 2 ---------------------------------------------


def _corrupt_weight(plain_pt2: Path, dst: Path) -> Path:
    data = bytearray(plain_pt2.read_bytes())
    with zipfile.ZipFile(plain_pt2) as archive:
        info = archive.getinfo("plain/data/weights/weight_0")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    data[start + 10] ^= 0xFF  # inside the weight's bytes: the CRC no longer matches
    dst.write_bytes(bytes(data))
    return dst


def _rename_in_local_header(plain_pt2: Path, dst: Path) -> Path:
    data = bytearray(plain_pt2.read_bytes())
    at = data.find(b"plain/models/model.json")  # the first occurrence: the local header's
    data[at + len("plain/")] = ord("X")
    dst.write_bytes(bytes(data))
    return dst


@pytest.mark.parametrize("corrupt", [_corrupt_weight, _rename_in_local_header])
def test_qnn_compile_on_a_corrupt_pt2_says_so_in_one_line(
    plain_pt2: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], corrupt: object
) -> None:
    assert callable(corrupt)
    bad = corrupt(plain_pt2, tmp_path / "bad.pt2")
    assert compile_main([str(bad), "-o", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and str(bad) in lines[0], err
    assert not (tmp_path / "c").exists()

