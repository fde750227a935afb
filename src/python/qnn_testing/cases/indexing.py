"""Indexing, gather / scatter / index_put, masking, slicing and embeddings."""

from __future__ import annotations

import torch
from torch import nn

from qnn_testing.cases.base import OpCase, concat, fn_case, index, lin_case, mod_case, randn

F = "indexing"
X = (4, 16)
x = randn(X)


class _Embed(nn.Module):
    """An embedding lookup into a linear layer: the token-model front end."""

    def __init__(self, padding_idx: int | None = None) -> None:
        super().__init__()
        self.emb = nn.Embedding(32, 16, padding_idx=padding_idx)
        self.fc = nn.Linear(16, 16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(self.emb(ids))
        return out


_idx = torch.tensor([3, 0, 2])
_cols = torch.tensor([[0, 5, 9], [1, 1, 15], [2, 7, 3], [15, 14, 0]])

CASES: tuple[OpCase, ...] = (
    lin_case("index_select", F, lambda a: torch.index_select(a, 0, _idx), x),
    lin_case(
        "index_select_input",
        F,
        lambda a, i: torch.index_select(a, 1, i),
        concat(x, index((5,), 16)),
    ),
    lin_case("gather", F, lambda a: torch.gather(a, 1, _cols), x),
    lin_case(
        "gather_input_index", F, lambda a, i: torch.gather(a, 1, i), concat(x, index((4, 3), 16))
    ),
    lin_case("scatter", F, lambda a, s: torch.scatter(a, 1, _cols, s), randn(X, (4, 3))),
    lin_case("scatter_add", F, lambda a, s: torch.scatter_add(a, 1, _cols, s), randn(X, (4, 3))),
    # scatter_reduce has no kernel in the 1.5.1 runtime: rewritten through a one-hot match of
    # the index (qnn_compile.decompositions).
    *(
        lin_case(
            f"scatter_reduce_{how}",
            F,
            lambda a, i, s, how=how, own=own: a.scatter_reduce(1, i, s, how, include_self=own),
            concat(x, index(X, 16), randn(X)),
            note=f"include_self={own}",
        )
        for how, own in (("sum", True), ("amax", True), ("amin", False), ("mean", True))
    ),
    lin_case("index_put", F, lambda a, v: torch.index_put(a, (_idx,), v), randn(X, (3, 16))),
    lin_case("index_tensor", F, lambda a: a[_idx], x),
    lin_case("masked_fill", F, lambda a: a.masked_fill(a > 0.5, -1.0), x),
    lin_case("where_scalar", F, lambda a: torch.where(a > 0, a, 0.0), x),
    lin_case("select_neg", F, lambda a: a[:, -1], x),
    lin_case("slice_step", F, lambda a: a[::2, 1:13:3], x),
    lin_case("narrow", F, lambda a: torch.narrow(a, 1, 2, 5), x),
    lin_case("slice_empty", F, lambda a: a[:, 4:4] + 1.0, x, note="empty output (4, 0)"),
    mod_case("embedding", F, _Embed, index((2, 8), 32), linear=True),
    fn_case(
        "index_int",
        F,
        lambda a: a[_idx],
        lambda g: (torch.randint(0, 9, X, generator=g),),
        integer=True,
    ),
    fn_case(
        "gather_int",
        F,
        lambda a: torch.gather(a, 1, _cols),
        lambda g: (torch.randint(0, 9, X, generator=g),),
        integer=True,
    ),
)
