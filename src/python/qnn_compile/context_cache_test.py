"""The context cache's store and digest, without QNN (the real compiles that resume and reuse are
in tests/qnn/qnn_context_cache_test.py)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest
import torch

from qnn_compile.context_cache import ContextCache, program_digest

METHODS = ("prefill", "decode")


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


def _exported(seed: int = 0) -> torch.export.ExportedProgram:
    torch.manual_seed(seed)
    return torch.export.export(_Block().eval(), (torch.randn(2, 8),))


def test_methods_sharing_a_context_store_it_once_and_read_it_back(tmp_path: Path) -> None:
    cache = ContextCache(tmp_path)
    blob = os.urandom(4096)
    cache.put("k", METHODS, [blob, blob])
    (entry,) = tmp_path.glob("*.ctx")
    assert entry.stat().st_size < 4096 + 512  # one copy and a header
    assert cache.get("k", METHODS) == [blob, blob]
    assert cache.get("absent", METHODS) is None


def test_methods_with_their_own_payloads_keep_each(tmp_path: Path) -> None:
    cache = ContextCache(tmp_path)
    cache.put("k", METHODS, [b"one", b"two"])
    assert cache.get("k", METHODS) == [b"one", b"two"]


def test_a_damaged_entry_is_removed_and_never_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = ContextCache(tmp_path)
    cache.put("k", METHODS, [b"x" * 100, b"x" * 100])
    (entry,) = tmp_path.glob("*.ctx")
    data = bytearray(entry.read_bytes())
    data[-1] ^= 0xFF
    entry.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        assert cache.get("k", METHODS) is None
    assert "does not match its sha256" in caplog.text
    assert not entry.exists()


def test_an_entry_for_other_methods_is_not_used(tmp_path: Path) -> None:
    cache = ContextCache(tmp_path)
    cache.put("k", ("forward",), [b"x"])
    assert cache.get("k", METHODS) is None


def test_pruning_evicts_least_recently_used_beyond_the_budget_but_never_kept_ones(
    tmp_path: Path,
) -> None:
    cache = ContextCache(tmp_path, budget_bytes=2500)
    for i, key in enumerate(("old", "kept", "new")):
        cache.put(key, ("forward",), [bytes(1000)])
        os.utime(tmp_path / f"{key}.ctx", (time.time() - 100 + i, time.time() - 100 + i))
    stale = tmp_path / ".x.abcdefgh.tmp"  # what a write killed mid-way leaves
    stale.write_bytes(b"partial")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    cache.get("old", ("forward",))  # read: now the most recently used
    cache.prune(keep={"kept"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.ctx", "old.ctx"]


def test_the_digest_is_stable_across_exports_and_follows_weights_and_metadata() -> None:
    a, b = _exported(), _exported()
    assert program_digest(a) == program_digest(b)
    assert program_digest(_exported(seed=1)) != program_digest(a)

    relu = next(n for n in b.graph.nodes if n.op == "call_function" and "relu" in str(n.target))
    relu.meta["stack_trace"] = "elsewhere"  # where a node came from shapes no context
    relu.meta["from_node"] = [object()]
    assert program_digest(b) == program_digest(a)
    relu.meta["quant_attrs"] = {"scale": 0.1, "zero_point": 0}  # what QNN reads does
    scaled = program_digest(b)
    assert scaled != program_digest(a)
    relu.meta["quant_attrs"] = {"scale": 0.2, "zero_point": 0}
    assert program_digest(b) != scaled


def test_metadata_without_a_faithful_form_never_repeats_a_digest() -> None:
    a, b = _exported(), _exported()
    for program in (a, b):
        node = next(n for n in program.graph.nodes if n.op == "call_function")
        node.meta["opaque"] = object()  # its repr names its address
    assert program_digest(a) != program_digest(b)
