"""A saved program goes to the next load of its file in memory, while the file is unchanged."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import torch

from qnn_common import program_handoff
from qnn_common.tensorio import load_program, save_program


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


def test_outside_a_chained_run_every_load_reads_the_file(tmp_path: Path) -> None:
    program = _export()
    save_program(tmp_path / "p.pt2", program)
    assert load_program(tmp_path / "p.pt2") is not program


def test_a_chained_run_hands_the_program_over_once(tmp_path: Path) -> None:
    program = _export()
    with program_handoff.handing_over():
        save_program(tmp_path / "p.pt2", program)
        assert load_program(tmp_path / "p.pt2") is program
        again = load_program(tmp_path / "p.pt2")  # the first taker owns it: this one is read
    assert again is not program
    x = torch.randn(2, 4)
    assert torch.equal(again.module()(x), program.module()(x))


def test_the_handoff_survives_the_staging_rename(tmp_path: Path) -> None:
    """Sealing renames the stage's directory: the file is the same file under another path."""
    program = _export()
    (tmp_path / "staging").mkdir()
    with program_handoff.handing_over():
        save_program(tmp_path / "staging" / "p.pt2", program)
        os.replace(tmp_path / "staging", tmp_path / "sealed")
        assert load_program(tmp_path / "sealed" / "p.pt2") is program


def test_a_replaced_file_is_read_not_handed_over(tmp_path: Path) -> None:
    program, other = _export(), _export(torch.nn.Sequential(torch.nn.Linear(4, 3)))
    with program_handoff.handing_over():
        save_program(tmp_path / "p.pt2", program)
        save_program(tmp_path / "q.pt2", other)
        os.replace(tmp_path / "q.pt2", tmp_path / "p.pt2")  # a new file under the saved name
        loaded = load_program(tmp_path / "p.pt2")
    assert loaded is not program and loaded is not other
    assert loaded.module()(torch.randn(2, 4)).shape == (2, 3)


def test_a_file_edited_in_place_is_read_not_handed_over(tmp_path: Path) -> None:
    """Same inode, same size, mtime set back: ctime still moves, and the bytes are checked."""
    program = _export()
    path = tmp_path / "p.pt2"
    with program_handoff.handing_over():
        save_program(path, program)
        st = os.stat(path)
        data = bytearray(path.read_bytes())
        data[-30] ^= 0xFF  # inside the zip's directory: the archive no longer reads
        with open(path, "r+b") as fh:
            fh.write(bytes(data))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert program_handoff.take(path) is None


def test_programs_sharing_tensors_are_read_from_their_files(tmp_path: Path) -> None:
    """Two methods exported from one stateful model share its buffer; run as loaded from their
    files, each has its own, so neither is handed over (running one must not change the
    other)."""
    model = _Cache()
    first, second = _export(model), _export(model)
    with program_handoff.handing_over():
        save_program(tmp_path / "a.pt2", first)
        save_program(tmp_path / "b.pt2", second)
        a, b = load_program(tmp_path / "a.pt2"), load_program(tmp_path / "b.pt2")
    assert a is not first and b is not second
    (state_a,) = a.buffers()
    (state_b,) = b.buffers()
    assert state_a.untyped_storage().data_ptr() != state_b.untyped_storage().data_ptr()


def test_discard_drops_what_was_not_taken(tmp_path: Path) -> None:
    program = _export()
    with program_handoff.handing_over():
        save_program(tmp_path / "p.pt2", program)
        program_handoff.discard()
        assert load_program(tmp_path / "p.pt2") is not program


def test_another_thread_does_not_see_this_runs_programs(tmp_path: Path) -> None:
    program = _export()
    seen: list[object] = []
    with program_handoff.handing_over():
        save_program(tmp_path / "p.pt2", program)
        worker = threading.Thread(target=lambda: seen.append(program_handoff.take(
            tmp_path / "p.pt2")))
        worker.start()
        worker.join()
        assert seen == [None]
        assert load_program(tmp_path / "p.pt2") is program
