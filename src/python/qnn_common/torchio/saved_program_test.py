"""A saved program goes to the next stage's load of its file in memory, while the file holds the
bytes saved (`programs.SavedProgram`)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

from qnn_common.errors import ArtifactError
from qnn_common.torchio.programs import (
    SavedProgram,
    handed_on,
    load_program,
    save_program,
    share_equal_weights,
)


class _Cache(torch.nn.Module):
    """A stateful model: its buffer is what a shared-state bug would corrupt."""

    state: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.register_buffer("state", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.state.add_(x.sum(0))
        out: torch.Tensor = self.linear(x) + self.state
        return out


def _export(model: torch.nn.Module | None = None) -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    model = model or torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    return torch.export.export(model, (torch.randn(2, 4),))


def test_the_bytes_do_not_depend_on_the_file_name_and_the_digest_is_theirs(
    tmp_path: Path,
) -> None:
    # Written through a temp file (atomic), whose random name torch would put in the zip if it
    # were given the path.
    program = _export()
    first = save_program(tmp_path / "a" / "program.pt2", program)
    second = save_program(tmp_path / "b" / "other.pt2", program)
    data = (tmp_path / "a" / "program.pt2").read_bytes()
    assert data == (tmp_path / "b" / "other.pt2").read_bytes()
    assert first.sha256 == second.sha256 == hashlib.sha256(data).hexdigest()
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and ".tmp" in p.name]


def test_without_the_saved_program_every_load_reads_the_file(tmp_path: Path) -> None:
    program = _export()
    saved = save_program(tmp_path / "p.pt2", program)
    assert saved.program is program and len(saved.sha256) == 64
    loaded = load_program(tmp_path / "p.pt2")
    assert loaded is not program
    x = torch.randn(2, 4)
    assert torch.equal(loaded.module()(x), program.module()(x))


def test_the_saved_program_is_taken_while_the_file_holds_its_bytes(tmp_path: Path) -> None:
    program = _export()
    (tmp_path / "staging").mkdir()
    saved = save_program(tmp_path / "staging" / "p.pt2", program)
    # Sealing renames the stage's directory: the file is the same under another path.
    os.replace(tmp_path / "staging", tmp_path / "sealed")
    assert load_program(tmp_path / "sealed" / "p.pt2", saved) is program


def test_a_replaced_file_is_read_not_taken(tmp_path: Path) -> None:
    program, other = _export(), _export(torch.nn.Sequential(torch.nn.Linear(4, 3)))
    saved = save_program(tmp_path / "p.pt2", program)
    save_program(tmp_path / "q.pt2", other)
    os.replace(tmp_path / "q.pt2", tmp_path / "p.pt2")  # a new file under the saved name
    loaded = load_program(tmp_path / "p.pt2", saved)
    assert loaded is not program and loaded is not other
    assert loaded.module()(torch.randn(2, 4)).shape == (2, 3)


def test_a_file_edited_in_place_is_read_not_taken(tmp_path: Path) -> None:
    """Same inode, same size, mtime set back: the bytes are hashed again and differ."""
    program = _export()
    path = tmp_path / "p.pt2"
    saved = save_program(path, program)
    st = os.stat(path)
    data = bytearray(path.read_bytes())
    data[-30] ^= 0xFF
    with open(path, "r+b") as fh:
        fh.write(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    try:
        loaded = load_program(path, saved)
    except ArtifactError:  # the edit broke the archive: read, and refused
        return
    assert loaded is not program


def test_programs_sharing_tensors_are_not_handed_on() -> None:
    """Two methods exported from one stateful model share its buffer; loaded from their files,
    each has its own, so neither goes on in memory (running one must not change the other)."""
    model = _Cache()
    first, second = _export(model), _export(model)
    alone = _export()
    saved = {name: SavedProgram(p, "0" * 64) for name, p in
             (("prefill", first), ("decode", second), ("other", alone))}
    assert set(handed_on(saved)) == {"other"}


def test_equal_weights_of_loaded_methods_share_one_tensor(tmp_path: Path) -> None:
    """Loaded from their files, two methods of one model hold a copy each of its weights: after
    share_equal_weights one, and still a buffer each."""
    model = _Cache()
    for name in ("a", "b"):
        save_program(tmp_path / f"{name}.pt2", _export(model))
    other = _Cache()  # same names, other values: not shared
    save_program(tmp_path / "c.pt2", _export(other))
    programs = {n: load_program(tmp_path / f"{n}.pt2") for n in ("a", "b", "c")}
    weight = "linear.weight"
    assert programs["a"].state_dict[weight] is not programs["b"].state_dict[weight]
    freed = share_equal_weights(programs)
    assert freed == (4 * 4 + 4) * 4  # b's weight and bias, float32
    a, b, c = (programs[n].state_dict for n in ("a", "b", "c"))
    assert b[weight] is a[weight] and b["linear.bias"] is a["linear.bias"]
    assert c[weight] is not a[weight]
    assert b["state"] is not a["state"]  # a buffer: each method's own
    x = torch.randn(2, 4)
    torch.testing.assert_close(programs["b"].module()(x), programs["a"].module()(x))


class _Frozen(torch.nn.Module):
    """PT2E-quantized weights are registered as buffers that no method writes."""

    codes: torch.Tensor
    state: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("codes", torch.arange(4, dtype=torch.float32))
        self.register_buffer("state", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.state.add_(x.sum(0))
        out: torch.Tensor = x * self.codes + self.state
        return out


def test_buffers_no_method_writes_are_weights_and_shared(tmp_path: Path) -> None:
    for name in ("a", "b"):
        save_program(tmp_path / f"{name}.pt2", _export(_Frozen()))
    programs = {n: load_program(tmp_path / f"{n}.pt2") for n in ("a", "b")}
    assert share_equal_weights(programs) == 16  # the codes; the written state stays apart
    a, b = (programs[n].state_dict for n in ("a", "b"))
    assert b["codes"] is a["codes"] and b["state"] is not a["state"]
