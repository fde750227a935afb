"""The size model of sharded HTP contexts (against measured contexts: tests/qnn/qnn_llm_test.py)."""

from __future__ import annotations

import torch

from qnn_common.recipes import Recipe
from qnn_compile.shard_sizes import (
    FIRST,
    GRAPH_BYTES_PER_LAYER,
    LAST,
    Tensor,
    estimate,
    pick_shards,
    program_tensors,
)


def _decoder(layers: int) -> list[Tensor]:
    """An embedding table, `layers` layers of one 100x100 weight and a norm, and a head."""
    per_layer = [t for i in range(layers) for t in (Tensor((100, 100), i), Tensor((100,), i))]
    return [Tensor((1000, 100), FIRST), *per_layer, Tensor((1000, 100), LAST)]


def test_each_shard_holds_its_layers_the_first_the_table_and_the_last_the_head() -> None:
    # 16a8w: matrices at 8 bits, vectors and the embedding table (a gather's input) at 16.
    first, middle, last = estimate(_decoder(6), Recipe.A16W8, 6, 3)
    layer = 100 * 100 + 100 * 2
    assert (first.first_layer, first.end_layer) == (0, 2)
    assert first.weight_bytes == 1000 * 100 * 2 + 2 * layer
    assert middle.weight_bytes == 2 * layer
    assert last.weight_bytes == 2 * layer + 1000 * 100
    # Two methods' graphs in each context, each with its own weights.
    assert middle.context_bytes == 2 * (2 * layer + 2 * GRAPH_BYTES_PER_LAYER)


def test_auto_picks_the_fewest_shards_that_fit() -> None:
    tensors = _decoder(8)
    whole = estimate(tensors, Recipe.A16W8, 8, 1)[0].context_bytes
    assert pick_shards(tensors, Recipe.A16W8, 8, limit=whole)[0] == 1
    n, shards = pick_shards(tensors, Recipe.A16W8, 8, limit=whole // 2)
    assert n == 3 and max(s.context_bytes for s in shards) <= whole // 2
    # Nothing fits (the table alone is over the limit): one shard per layer, for the caller to
    # report.
    assert pick_shards(tensors, Recipe.A16W8, 8, limit=1000)[0] == 8


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))
        self.head = torch.nn.Linear(8, 50, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        out: torch.Tensor = self.head(x)
        return out


def test_a_programs_tensors_are_placed_by_the_op_that_reads_them() -> None:
    ep = torch.export.export(_Tiny(), (torch.zeros(1, 4, dtype=torch.long),))
    places = [(t.place, t.shape) for t in program_tensors(ep)]
    assert (FIRST, (50, 8)) in places and (LAST, (50, 8)) in places  # the table, the head
    assert sorted(s for p, s in places if p == 0) == [(8,), (8, 8)]  # layer 0's weight and bias
    assert sorted(s for p, s in places if p == 1) == [(8,), (8, 8)]
    assert len(places) == 6
