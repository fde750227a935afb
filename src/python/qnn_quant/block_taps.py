"""Each decoder block's output (the residual stream after block i) recorded as a causal LM's
methods run in Python: where a fake-quantized model's error enters and how it grows, block by
block (`qnn_infer.evaluation.blocks` pairs two models' records). A .pte has no such tap."""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from qnn_quant.layers import module_path

# A decoder block's module path: Hugging Face's `model.layers.N` under whatever wraps it.
_BLOCK = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


class BlockTap:
    """Records, while `active`, the output of each decoder block of the modules it is attached
    to: the last op under the block's module path (its residual add, or that add's rounding).
    Attach after every graph rewrite: a rewrite's dead-code pass drops a recorder, which nothing
    reads."""

    def __init__(self) -> None:
        self.active = False
        self._records: dict[int, list[torch.Tensor]] = {}

    def attach(self, gm: torch.fx.GraphModule) -> int:
        """Record each block's output of `gm`; returns how many blocks it has."""
        last: dict[int, torch.fx.Node] = {}
        for node in gm.graph.nodes:
            found = _BLOCK.search(module_path(node) or "") if node.op == "call_function" else None
            if found:
                last[int(found.group(1))] = node
        for block, node in last.items():
            with gm.graph.inserting_after(node):
                gm.graph.call_function(self._recorder(block), (node,))
        if last:
            gm.recompile()
        return len(last)

    def take(self) -> dict[int, list[torch.Tensor]]:
        """What was recorded since the last take, per block in call order; then forgets it."""
        out, self._records = self._records, {}
        return out

    def _recorder(self, block: int) -> Callable[[object], None]:
        def record(value: object) -> None:
            if self.active and isinstance(value, torch.Tensor):
                self._records.setdefault(block, []).append(value.detach().float().clone())

        record.__name__ = f"record_block_{block}"
        return record
