"""`module:function` models for the sweep tests: a tiny MLP, and a factory that always fails."""

from __future__ import annotations

import torch


def mlp() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """A seeded 16 -> 32 -> 8 MLP and one example input: seconds per stage."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    return model, (torch.randn(1, 16),)


def broken() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """Fails in prepare, as a model whose factory has a bug does."""
    raise RuntimeError("this factory is broken on purpose")
