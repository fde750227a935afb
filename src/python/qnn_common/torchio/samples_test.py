"""Tensor and program files: reproducible bytes, and nothing loaded that could run code."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest
import torch

from qnn_common.errors import ArtifactError
from qnn_common.torchio.programs import load_program, save_program
from qnn_common.torchio.samples import ModelInputs, load_inputs, load_samples, save_samples


def _export() -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    return torch.export.export(model, (torch.randn(1, 3, 8, 8),))


def test_the_same_program_gives_the_same_bytes_under_any_name(tmp_path: Path) -> None:
    """Two exports (other graph objects, other ids in the provenance) saved under two names."""
    save_program(tmp_path / "a.pt2", _export())
    save_program(tmp_path / "b.pt2", _export())
    assert (tmp_path / "a.pt2").read_bytes() == (tmp_path / "b.pt2").read_bytes()
    program = load_program(tmp_path / "a.pt2")
    x = torch.randn(1, 3, 8, 8)
    assert torch.equal(program.module()(x), _export().module()(x))


def test_saving_leaves_shared_provenance_objects_alone(tmp_path: Path) -> None:
    """The graph ids are renumbered on copies: a NodeSource another program may share (one a
    lowering shared, see qnn_compile.node_sources) keeps its id."""
    program = _export().run_decompositions()  # a pass: its nodes record where they came from
    node = next(n for n in program.graph.nodes if n.meta.get("from_node"))
    source = node.meta["from_node"][0]
    before = source.graph_id
    save_program(tmp_path / "a.pt2", program)
    assert source.graph_id == before and before > 1000  # still torch's id(graph)
    assert node.meta["from_node"][0] is not source
    assert node.meta["from_node"][0].graph_id < 10  # what was saved: the renumbered copy
    save_program(tmp_path / "b.pt2", _export().run_decompositions())
    assert (tmp_path / "a.pt2").read_bytes() == (tmp_path / "b.pt2").read_bytes()


def test_samples_bytes_do_not_depend_on_the_file_name(tmp_path: Path) -> None:
    samples = [(torch.arange(6.0).reshape(2, 3), torch.ones(2, dtype=torch.int64))]
    save_samples(tmp_path / "one.pt", samples)
    save_samples(tmp_path / "two.pt", samples)
    assert (tmp_path / "one.pt").read_bytes() == (tmp_path / "two.pt").read_bytes()
    (loaded,) = load_samples(tmp_path / "one.pt")
    assert all(torch.equal(a, b) for a, b in zip(loaded, samples[0], strict=True))


def _rewritten(src: Path, dst: Path, name: str, edit: dict[str, object]) -> Path:
    """`src` with one weight's entry in the weights config changed by `edit`."""
    with zipfile.ZipFile(src) as archive:
        members = {n: archive.read(n) for n in archive.namelist()}
    config_name = next(n for n in members if n.endswith("model_weights_config.json"))
    config = json.loads(members[config_name])
    config["config"][name].update(edit)
    members[config_name] = json.dumps(config).encode()
    with zipfile.ZipFile(dst, "w") as out:
        for member, data in members.items():
            out.writestr(member, data)
    return dst


def test_a_weight_marked_for_pickling_is_refused_unread(tmp_path: Path) -> None:
    save_program(tmp_path / "ok.pt2", _export())
    bad = _rewritten(tmp_path / "ok.pt2", tmp_path / "bad.pt2", "0.weight", {"use_pickle": True})
    with pytest.raises(ArtifactError, match="'0.weight' is stored as a pickle") as info:
        load_program(bad)
    assert info.value.path == bad


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"not a zip", "not a zip archive"),
        (b"", "not a zip archive"),
        (None, "current .pt2 format"),  # a torch.save file: a zip, but not a .pt2
    ],
)
def test_files_that_are_not_programs_are_refused(
    tmp_path: Path, data: bytes | None, reason: str
) -> None:
    path = tmp_path / "x.pt2"
    if data is None:
        buffer = io.BytesIO()
        torch.save({"weights": torch.ones(3)}, buffer)
        data = buffer.getvalue()
    path.write_bytes(data)
    with pytest.raises(ArtifactError, match="is not an exported program") as info:
        load_program(path)
    assert reason in info.value.reason


def _structured(seed: int) -> ModelInputs:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 6, generator=gen)
    indices = [torch.tensor([0, 2]), torch.tensor([1, 5])]
    nested = (x[:, :2], (torch.ones(3, dtype=torch.bool), (1.5, None)))  # x[:, :2] is a view
    return ModelInputs(
        (x, indices, {"w": torch.randn(3, generator=gen), "n": 3}, nested),
        {"flag": True, "mask": torch.zeros(2, dtype=torch.int64), "eps": None},
    )


def _same(a: object, b: object) -> bool:
    """Equal values, tensors by dtype, shape and content, containers by exact type."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, tuple | list):
        return (isinstance(b, tuple | list) and type(a) is type(b) and len(a) == len(b)
                and all(_same(x, y) for x, y in zip(a, b, strict=True)))
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def test_structured_inputs_round_trip_through_a_weights_only_file(tmp_path: Path) -> None:
    samples = [_structured(0), _structured(1)]
    path = tmp_path / "inputs.pt"
    save_samples(path, samples)
    loaded = load_inputs(path, like=samples[0])
    assert len(loaded) == 2
    for got, want in zip(loaded, samples, strict=True):
        # Lists stay lists and tuples tuples (the program's input spec tells them apart), dict
        # order and the constants survive, and so does the flat order the .pte takes.
        assert _same(got.args, want.args) and _same(dict(got.kwargs), dict(want.kwargs))
        assert len(got.leaves()) == len(want.leaves()) == 12
    # The view was stored as its own data, not its base's whole storage.
    assert loaded[0].args[3][0].untyped_storage().nbytes() == 4 * 2 * 4
    # Readable with nothing but the weights-only unpickler, as any user file must be.
    assert isinstance(torch.load(path, weights_only=True), dict)
    with pytest.raises(ArtifactError, match="load_inputs"):
        load_samples(path)


def test_flat_samples_keep_the_flat_file_format(tmp_path: Path) -> None:
    flat = [(torch.ones(2), torch.zeros(3, dtype=torch.int64))]
    save_samples(tmp_path / "a.pt", flat)
    save_samples(tmp_path / "b.pt", [ModelInputs(flat[0])])
    assert (tmp_path / "a.pt").read_bytes() == (tmp_path / "b.pt").read_bytes()
    assert isinstance(torch.load(tmp_path / "a.pt", weights_only=True), list)
    (got,) = load_inputs(tmp_path / "a.pt")
    assert got.is_flat() and _same(got.args, flat[0])


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([{"args": (torch.ones(2),), "kwargs": {"k": "text"}}], r"kwargs\['k'\] is a str"),
        ([(torch.ones(2), {1: torch.ones(1)})], "dict keys must be str"),
        ([{"args": torch.ones(2)}], "'args' must be a tuple"),
        ([{"x": torch.ones(2)}], "expected a tensor, a tuple of arguments"),
        ({"qnn_inputs": 99, "samples": []}, "unknown version 99"),
        ([], "holds no samples"),
    ],
)
def test_malformed_input_files_are_refused(data: object, message: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.pt"
    torch.save(data, path)
    with pytest.raises(ArtifactError, match=message):
        load_inputs(path)


def test_inputs_that_do_not_fit_the_example_say_where(tmp_path: Path) -> None:
    like = _structured(0)
    path = tmp_path / "inputs.pt"
    other = ModelInputs((like.args[0], like.args[1][:1], like.args[2], like.args[3]), like.kwargs)
    save_samples(path, [other])
    with pytest.raises(ArtifactError, match=r"sample 0 is structured .* the model takes"):
        load_inputs(path, like=like)
    changed = dict(like.kwargs, flag=False)
    save_samples(path, [ModelInputs(like.args, changed)])
    with pytest.raises(ArtifactError, match="expected the constant True, got False"):
        load_inputs(path, like=like)
