"""`module:function` models for the sweep tests: a tiny MLP, a factory that always fails, and one
that kills its process."""

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


def dies() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """Kills its own process (SIGKILL), as an out-of-memory kill or a native crash would: in a
    sweep on Ray, the worker running this cell's prepare dies under it."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable: SIGKILL cannot be caught")
