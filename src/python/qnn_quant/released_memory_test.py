from __future__ import annotations

import sys

import pytest
import torch

from qnn_quant.released_memory import return_freed_heap


def _rss() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc: Linux")
def test_freed_heap_tensors_go_back_to_the_system() -> None:
    # Freeing a 16 MB mapping raises glibc's mmap threshold past it: the 4 MB tensors after it
    # live on the heap, like a model's weights and GPTQ's Hessians do.
    mapping = torch.ones(4 * 2**20)
    del mapping
    blocks = [torch.ones(2**20) for _ in range(50)]  # 200 MB
    kept = torch.ones(2**20)  # above them: the heap cannot just shrink from its top
    before = _rss()
    del blocks
    freed = _rss()
    assert return_freed_heap()
    after = _rss()
    assert kept.sum() == 2**20
    assert freed - after > 100 * 2**20, (before, freed, after)


def test_a_full_collection_runs_only_for_weights_worth_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    from qnn_quant import released_memory

    runs: list[int] = []

    def collect() -> int:
        runs.append(1)
        return 0

    monkeypatch.setattr(gc, "collect", collect)
    assert not released_memory.collect_if_worth_it(released_memory.WORTH_COLLECTING - 1)
    assert runs == []
    assert released_memory.collect_if_worth_it(released_memory.WORTH_COLLECTING)
    assert runs == [1]


def test_weight_bytes_counts_a_shared_tensor_once() -> None:
    from qnn_quant.released_memory import weight_bytes

    linear = torch.nn.Linear(16, 8)  # 16 * 8 + 8 floats
    ep = torch.export.export(linear, (torch.randn(2, 16),), strict=False)
    assert weight_bytes([ep]) == (16 * 8 + 8) * 4
    assert weight_bytes([ep, ep]) == (16 * 8 + 8) * 4
