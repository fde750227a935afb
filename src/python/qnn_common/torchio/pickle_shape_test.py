from __future__ import annotations

import io
import pickle
import zipfile

import pytest
import torch

from qnn_common.torchio.pickle_shape import MAX_DEPTH, PickleShapeError, scan_pickle


def _data_pkl(value: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as archive:
        (name,) = (n for n in archive.namelist() if n.endswith("/data.pkl"))
        return archive.read(name)


def test_an_honest_file_is_measured_as_a_tree() -> None:
    t = torch.ones(2)
    shape = scan_pickle(_data_pkl({"qnn_inputs": 1, "samples": [{"args": (t, [1, None])}] * 3}))
    assert shape.depth < 12 and 20 < shape.values < 200
    assert "torch._utils._rebuild_tensor_v2" in shape.globals


def test_shared_children_are_counted_once_and_refused_expanded() -> None:
    value: list[object] = [torch.zeros(1)]
    for _ in range(40):
        value = [value, value]
    with pytest.raises(PickleShapeError, match="shared parts are expanded"):
        scan_pickle(_data_pkl(value))


def test_nesting_self_reference_and_container_keys_are_refused() -> None:
    deep: object = 1
    for _ in range(MAX_DEPTH):
        deep = [deep]
    with pytest.raises(PickleShapeError, match="nests deeper"):
        scan_pickle(pickle.dumps(deep, protocol=2))
    cycle: list[object] = []
    cycle.append(cycle)
    with pytest.raises(PickleShapeError, match="contains itself"):
        scan_pickle(pickle.dumps(cycle, protocol=2))
    with pytest.raises(PickleShapeError, match="dict key that is a container"):
        scan_pickle(pickle.dumps({(1, 2): 3}, protocol=2))


@pytest.mark.parametrize(
    "data", [b"", b"\x80\x02]", b"\x80\x02]a.", b"\x80\x02h\x07.", b"\x80\x02K\x01K\x02."],
    ids=["empty", "no-stop", "append-on-empty", "unknown-memo", "two-values"],
)
def test_malformed_pickles_are_refused(data: bytes) -> None:
    with pytest.raises(PickleShapeError):
        scan_pickle(data)


def test_opcodes_torch_save_never_writes_are_refused() -> None:
    with pytest.raises(PickleShapeError, match="opcode INST"):
        scan_pickle(b"(ios\nsystem\n.")
