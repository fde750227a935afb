"""Factories for ``package.module:function`` models that keep state in a registered buffer they
update in place (issue 23, class 1): the static-KV-cache pattern. The buffer starts at non-zero
values, so a program that loses its initial state, or starts from a calibration run's, is wrong
where it shows.
"""

from __future__ import annotations

import torch
from torch import nn

ROWS, WIDTH = 8, 16


class StaticCache(nn.Module):
    """Projects `x` into new rows, writes them at `pos` of its cache, returns the whole cache."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.register_buffer("cache", initial_cache())

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cache = self.get_buffer("cache")
        cache.index_put_((pos,), self.proj(x))
        return cache * 2.0


def initial_cache() -> torch.Tensor:
    """The cache's registered value."""
    return torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(9))


def static_cache() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Two rows written at positions 1 and 5."""
    x = torch.randn(2, WIDTH, generator=torch.Generator().manual_seed(3))
    return StaticCache(), (x, torch.tensor([1, 5]))


class SliceCache(StaticCache):
    """Writes its new rows into a slice of its cache (`cache[2:4] = ...`), then reads the cache:
    a read PT2E used to quantize before the write (the program returned the old rows)."""

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cache = self.get_buffer("cache")
        cache[2:4] = self.proj(x)
        return cache * 2.0


def slice_cache() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Two rows written at rows 2 and 3 (`pos` is unused, as in a fixed-position write)."""
    x = torch.randn(2, WIDTH, generator=torch.Generator().manual_seed(3))
    return SliceCache(), (x, torch.tensor([1, 5]))
