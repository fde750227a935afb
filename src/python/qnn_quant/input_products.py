"""The ``X^T X`` of chosen graph nodes' inputs over a calibration run: what GPTQ's Hessians are
made of (`qnn_quant.gptq` for linears, `quantizers.lpbq_gptq` for LPBQ's 1x1 convolutions).

Each chosen node's target is swapped, for the run, for a recorder that adds its input's product
to a sum and calls the original op. An fx graph keeps every call target it has held as a key of
its node lookup table (`torch.fx.graph._FindNodesLookupTable.remove` leaves the key), and these
graphs live on in the quantized program: so a recorder must not keep what it recorded once the
run is over, or every Hessian of the model stays in memory until the program is freed.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import torch

K = TypeVar("K", bound=Hashable)


def record_input_products(
    nodes: Sequence[tuple[torch.fx.GraphModule, torch.fx.Node, K]],
    calibrate: Callable[[], None],
    *,
    rows_of: Callable[[torch.Tensor], torch.Tensor],
    dtype: torch.dtype,
) -> dict[K, tuple[torch.Tensor, int]]:
    """Run `calibrate()` with each node of `nodes` (a graph module, a node of it, a key)
    recording the node's first input, as a matrix of rows (`rows_of(x)`, one row per position,
    features last): per key, the sum of ``X^T X`` (computed in float64, kept in `dtype`) and
    the number of rows. Nodes under one key (methods reading the same weights) add to one sum.
    The nodes' targets are restored and their graphs recompiled after, whatever happened."""
    sums: dict[K, torch.Tensor] = {}
    rows: dict[K, int] = {}

    def recorder(key: K, op: Callable[..., Any]) -> Callable[..., Any]:
        def call(x: torch.Tensor, *args: Any) -> Any:
            flat = rows_of(x.detach()).to(torch.float64)
            product = (flat.T @ flat).to(dtype)
            sums[key] = sums[key] + product if key in sums else product
            rows[key] = rows.get(key, 0) + flat.shape[0]
            return op(x, *args)

        return call

    graphs = {id(gm): gm for gm, _, _ in nodes}
    originals: list[tuple[torch.fx.Node, Callable[..., Any]]] = []
    try:
        for _, node, key in nodes:
            op = node.target
            assert callable(op), f"{node.format_node()}: only a called op can be recorded"
            originals.append((node, op))
            node.target = recorder(key, op)
        for gm in graphs.values():
            gm.recompile()
        with torch.no_grad():
            calibrate()
        return {key: (sums[key], rows[key]) for key in sums}
    finally:
        for node, target in originals:
            node.target = target
        for gm in graphs.values():
            gm.recompile()
        # The recorders outlive this call in their graphs' lookup tables (module docstring).
        sums.clear()
        rows.clear()
