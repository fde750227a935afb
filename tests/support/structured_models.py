"""Factories for ``package.module:function`` models whose inputs are not a flat tuple of tensors
(issue 8, class 1): each returns ``(module, args)`` or ``(module, args, kwargs)`` as
`qnn_prepare.models.FACTORY_CONTRACT` describes. Seeded, small, and every one has a linear layer
so that 8a8w really quantizes something.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def _linear(seed: int, features: int = 8) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(features, features)


def _x(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


class IndexPut(nn.Module):
    """Writes `values` at (rows[i], cols[i]) of a projection: a list of index tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = _linear(1)

    def forward(
        self, x: torch.Tensor, indices: list[torch.Tensor], values: torch.Tensor
    ) -> torch.Tensor:
        y: torch.Tensor = self.fc(x)
        return y.index_put(tuple(indices), values)


def index_put_list() -> tuple[nn.Module, tuple[Any, ...]]:
    """A list of index tensors (distinct positions) for index_put."""
    indices = [torch.tensor([0, 1, 3]), torch.tensor([2, 5, 7])]
    return IndexPut(), (_x(2, 4, 8), indices, _x(3, 3))


class DictInput(nn.Module):
    """Reads its inputs from a dict: ``{"x": ..., "bias": ...}``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = _linear(4)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.relu(self.fc(batch["x"])) + batch["bias"]


def dict_input() -> tuple[nn.Module, tuple[Any, ...]]:
    """One argument that is a dict of tensors."""
    return DictInput(), ({"x": _x(5, 2, 8), "bias": _x(6, 8)},)


class KeywordOnly(nn.Module):
    """Keyword arguments: `mask` can go by position, `gain` and `scale` are keyword-only."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = _linear(7)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, *, gain: torch.Tensor, scale: float = 1.0
    ) -> torch.Tensor:
        y: torch.Tensor = self.fc(x * mask)
        return y * gain * scale


def keyword_args() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    """``(module, args, kwargs)``: a keyword that binds by position, a keyword-only tensor and a
    keyword-only float."""
    mask = (torch.arange(8) % 3 != 0).to(torch.float32)
    kwargs = {"mask": mask, "gain": _x(8, 8).abs() + 0.5, "scale": 0.5}
    return KeywordOnly(), (_x(9, 16, 8),), kwargs


class IntAndNone(nn.Module):
    """An int (how many times the output repeats) and an optional tensor left None: both baked
    in by torch.export."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = _linear(10)

    def forward(
        self, x: torch.Tensor, repeats: int, residual: torch.Tensor | None
    ) -> torch.Tensor:
        y = torch.relu(self.fc(x)).repeat(1, repeats)
        return y if residual is None else y + residual


def int_and_none() -> tuple[nn.Module, tuple[Any, ...]]:
    """An int and a None argument."""
    return IntAndNone(), (_x(11, 16, 8), 2, None)


class Nested(nn.Module):
    """A nested tuple: ``(x, (y, (z, flag)))`` with a bool inside."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = _linear(12)

    def forward(self, pair: tuple[torch.Tensor, tuple[torch.Tensor, tuple[Any, bool]]]) -> Any:
        x, (y, (z, flag)) = pair
        h = self.fc(x + y)
        return {"h": h, "z": (h * z) if flag else z}


def nested_tuple() -> tuple[nn.Module, tuple[Any, ...]]:
    """One argument that is a nested tuple holding tensors and a bool; a dict output."""
    return Nested(), ((_x(13, 2, 8), (_x(14, 2, 8), (_x(15, 2, 8), True))),)
