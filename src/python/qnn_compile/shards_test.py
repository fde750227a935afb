"""Where --num-shards cuts a decoder (the compile on the emulator: tests/qnn/qnn_llm_test.py)."""

from __future__ import annotations

import itertools

import pytest
import torch

from qnn_common.errors import ConfigValidationError
from qnn_compile.shards import boundaries, layer_of


@pytest.mark.parametrize("layers", [2, 16, 24, 30])
@pytest.mark.parametrize("shards", [1, 2, 3, 4, 5])
def test_shards_differ_by_at_most_one_layer(layers: int, shards: int) -> None:
    if shards > layers:
        return
    starts = [0, *boundaries(layers, shards), layers]
    sizes = [b - a for a, b in itertools.pairwise(starts)]
    assert len(sizes) == shards and sum(sizes) == layers
    assert max(sizes) - min(sizes) <= 1, sizes


def test_examples_and_refusals() -> None:
    assert boundaries(30, 3) == [10, 20]
    assert boundaries(16, 3) == [5, 11]  # upstream's layers // N would cut at 5, 10, 15: 4 shards
    with pytest.raises(ConfigValidationError, match="the decoder has 2 layer"):
        boundaries(2, 3)
    with pytest.raises(ConfigValidationError, match="1..30"):
        boundaries(30, 0)


class _Decoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x).relu()
        out: torch.Tensor = self.head(x)
        return out


def test_nodes_know_their_layer_from_the_module_stack() -> None:
    ep = torch.export.export(_Decoder(), (torch.randn(1, 4),))
    seen = [layer_of(n) for n in ep.graph.nodes if n.op == "call_function"]
    assert [x for i, x in enumerate(seen) if x is not None and x not in seen[:i]] == [0, 1, 2]
    assert seen[-1] is None  # the head is in no layer
