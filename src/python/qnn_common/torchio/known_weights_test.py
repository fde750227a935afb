"""A model's methods loaded from their own files read each equal weight once (`known_weights`,
`programs.load_methods`), and only equal weights: a different value or a written buffer is the
method's own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.export.pt2_archive import _package

from qnn_common.torchio.known_weights import hook_available, reusable_tensors
from qnn_common.torchio.programs import load_methods, load_program, save_program


class _Stateful(torch.nn.Module):
    """Two linears and a buffer it updates in place (state, like a KV cache)."""

    state: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 8)
        self.register_buffer("state", torch.zeros(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.state.add_(x.sum(0))
        out: torch.Tensor = self.down(torch.relu(self.up(x))) + self.state
        return out


def _save(tmp_path: Path, name: str, model: torch.nn.Module, rows: int) -> Path:
    path = tmp_path / f"{name}.pt2"
    save_program(path, torch.export.export(model, (torch.randn(rows, 8),)))
    return path


def _methods(tmp_path: Path, change_down: bool = False) -> dict[str, Path]:
    torch.manual_seed(0)
    model = _Stateful().eval()
    paths = {"prefill": _save(tmp_path, "prefill", model, 4)}
    if change_down:
        with torch.no_grad():
            model.down.weight[0, 0] += 1.0
    paths["decode"] = _save(tmp_path, "decode", model, 1)
    return paths


def _ptr(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def test_this_torch_has_the_loader_function_it_hooks() -> None:
    assert hook_available(), (
        "torch.export.pt2_archive._package._build_file_map(archive_reader, config, base_dir) "
        "is gone or changed: update qnn_common.torchio.known_weights"
    )


def test_equal_weights_are_read_once_and_the_methods_compute_as_loaded_alone(
    tmp_path: Path,
) -> None:
    paths = _methods(tmp_path)
    known = reusable_tensors([load_program(paths["prefill"])])
    decode = load_program(paths["decode"], known=known)
    weights = ("up.weight", "up.bias", "down.weight", "down.bias")
    assert "state" not in known  # written: state, never shared (see below)
    for name in weights:
        assert _ptr(decode.state_dict[name]) == _ptr(known[name]), name

    programs = load_methods(paths)
    alone = {m: load_program(p) for m, p in paths.items()}
    for name in weights:
        assert programs["decode"].state_dict[name] is programs["prefill"].state_dict[name]
    x = torch.randn(1, 8)
    assert torch.equal(programs["decode"].module()(x), alone["decode"].module()(x))


class _Tied(torch.nn.Module):
    """An embedding and a head on one weight (tied, as small LLMs are): one record, two names."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(32, 8)
        self.head = torch.nn.Linear(8, 32, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.embed(ids))
        return out


def test_tied_weights_are_read_once_and_stay_tied(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _Tied().eval()
    paths = {}
    for name, tokens in (("prefill", 4), ("decode", 1)):
        paths[name] = tmp_path / f"{name}.pt2"
        save_program(paths[name], torch.export.export(model, (torch.zeros(1, tokens).long(),)))
    known = reusable_tensors([load_program(paths["prefill"])])
    decode = load_program(paths["decode"], known=known)
    tied = {_ptr(t) for t in decode.state_dict.values()}
    assert tied == {_ptr(next(iter(known.values())))}
    ids = torch.tensor([[3]])
    assert torch.equal(decode.module()(ids), model(ids))


def test_a_written_buffer_stays_each_methods_own_even_when_its_bytes_match(
    tmp_path: Path,
) -> None:
    programs = load_methods(_methods(tmp_path))
    prefill, decode = programs["prefill"].state_dict, programs["decode"].state_dict
    assert torch.equal(prefill["state"], decode["state"])
    assert _ptr(prefill["state"]) != _ptr(decode["state"])


def test_a_weight_that_differs_is_loaded_from_its_own_file(tmp_path: Path) -> None:
    programs = load_methods(_methods(tmp_path, change_down=True))
    prefill, decode = programs["prefill"].state_dict, programs["decode"].state_dict
    assert _ptr(prefill["down.weight"]) != _ptr(decode["down.weight"])
    assert float(decode["down.weight"][0, 0] - prefill["down.weight"][0, 0]) == pytest.approx(1.0)
    assert decode["up.weight"] is prefill["up.weight"]


def test_when_torch_changes_the_hooked_function_loading_copies_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _methods(tmp_path)
    known = reusable_tensors([load_program(paths["prefill"])])
    original = _package._build_file_map

    def changed(archive_reader: Any, config: Any, base_dir: str, mmap: bool = False) -> Any:
        return original(archive_reader, config, base_dir)

    monkeypatch.setattr(_package, "_build_file_map", changed)
    assert not hook_available()
    with pytest.warns(UserWarning, match="equal weights are copied again"):
        decode = load_program(paths["decode"], known=known)
    assert _ptr(decode.state_dict["up.weight"]) != _ptr(known["up.weight"])
    assert torch.equal(decode.state_dict["up.weight"], known["up.weight"])
