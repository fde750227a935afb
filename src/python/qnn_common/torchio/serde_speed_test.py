"""The cached type hints give torch.export.load exactly what typing.get_type_hints gives."""

from __future__ import annotations

import dataclasses
import io
import typing

import torch

from qnn_common.torchio import serde_speed
from qnn_common.torchio.programs import load_program, save_program


def test_hints_are_typings_own_for_every_schema_class() -> None:
    from torch._export.serde import schema

    namespace = vars(schema)
    stand_in = serde_speed._TypingWithCachedHints(namespace)
    union = namespace["_Union"]  # the schema's tagged-union base (private to torch)
    classes = [c for c in namespace.values() if isinstance(c, type) and (
        dataclasses.is_dataclass(c) or issubclass(c, union))]
    assert len(classes) > 20
    for cls in classes:
        expected = typing.get_type_hints(cls, globalns=namespace)
        assert stand_in.get_type_hints(cls, globalns=namespace) == expected
        assert stand_in.get_type_hints(cls, globalns=namespace) is stand_in.get_type_hints(
            cls, globalns=namespace)  # computed once
    # Anything else is typing's, uncached.
    assert stand_in.get_type_hints(serde_speed._TypingWithCachedHints) == typing.get_type_hints(
        serde_speed._TypingWithCachedHints)
    assert stand_in.Union is typing.Union


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.relu(self.fc(x))
        return out


def test_a_program_loads_the_same_with_the_cache(tmp_path: typing.Any) -> None:
    from torch._export.serde import serialize

    program = torch.export.export(_Net().eval(), (torch.randn(2, 8),))
    path = tmp_path / "p.pt2"
    save_program(path, program)
    plain = torch.export.load(io.BytesIO(path.read_bytes()))  # before install: stock load
    loaded = load_program(path)
    assert isinstance(vars(serialize)["typing"], serde_speed._TypingWithCachedHints)
    assert str(loaded.graph) == str(plain.graph)
    assert loaded.graph_signature == plain.graph_signature
    again = tmp_path / "again.pt2"
    save_program(again, loaded)
    assert again.read_bytes() == path.read_bytes()
