"""GPTQ for 16a4w_block: LPBQ-blocked weights rounded onto the block scales the HTP holds.

`qnn_quant.gptq` rounds linears on the float graph, before the quantizer rewrites it, onto one
scale per output channel it chooses itself. LPBQ's grid is not known until the quantizer has run:
its weights are the symmetric parts of the offset split (`lpbq.split_group_offsets`) on 1x1
convolutions, and their scales are `LpbqWeightObserver`'s (per block, 4-bit multiples of a
channel scale). So this pass works on the prepared graphs. While calibration runs, it records
the Hessian of each blocked convolution's input; then it rounds each weight by GPTQ onto the
scales its observer returns, -8..7, and writes the result back. A weight observer observes once
(its first forward), so convert quantizes the rounded weights with those same scales: the
program holds exactly the GPTQ integers.

Every Hessian comes from the one calibration pass, from unrounded weights (each layer corrects
its own rounding, not its predecessors'), as `gptq` does past `SEQUENTIAL_GROUPS`. Methods
(a causal LM's prefill and decode) hold the same weight paths: each weight's Hessian sums its
inputs in every method, and every method gets the same rounded weight, so they still share
their quantized bytes.
"""

from __future__ import annotations

import logging
import operator
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from qnn_common.errors import StageError
from qnn_quant.gptq import GptqResult, gain_db, gptq, has_attr, nearest
from qnn_quant.graph_params import replace_tensor
from qnn_quant.input_products import record_input_products
from qnn_quant.quantizers.lpbq_observer import LpbqWeightObserver

log = logging.getLogger(__name__)

_CONV = torch.ops.aten.conv2d.default


def blocked_convs(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, tuple[str, Any]]:
    """The convolutions of prepared `gm` whose weight (a constant) an LpbqWeightObserver
    observes, to the weight's attribute path and that observer."""
    out: dict[torch.fx.Node, tuple[str, Any]] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not _CONV:
            continue
        observed = node.args[1]
        if not isinstance(observed, torch.fx.Node) or observed.op != "call_module":
            continue
        weight = observed.args[0]
        observer = gm.get_submodule(str(observed.target))
        if isinstance(observer, LpbqWeightObserver) and isinstance(weight, torch.fx.Node) \
                and weight.op == "get_attr":
            out[node] = (str(weight.target), observer)
    return out


def round_blocked_weights(
    modules: Mapping[str, torch.fx.GraphModule], calibrate: Callable[[], None]
) -> GptqResult:
    """Run `calibrate()` (the calibration of every prepared module of `modules`) recording the
    blocked convolutions' input Hessians, then GPTQ-round their weights (module docstring),
    each module given new tensors. The result's scales are per block, as the observers return
    them."""
    t = time.perf_counter()
    convs = {method: blocked_convs(gm) for method, gm in modules.items()}
    hessians = _hessians(modules, convs, calibrate)
    scales: dict[str, torch.Tensor] = {}
    gains: list[float] = []
    for method, gm in modules.items():
        for path, observer in convs[method].values():
            hessian = hessians(path) if path not in scales else None
            if hessian is None:
                continue  # done, or no calibration input reached it: nearest will do
            weight = operator.attrgetter(path)(gm)
            scale, per_weight = _scales(path, observer, weight)
            flat = weight.detach().reshape(weight.shape[0], -1)
            low, high = int(observer.quant_min), int(observer.quant_max)
            rounded = gptq(flat, hessian, per_weight, high, low)
            gains.append(gain_db(flat, rounded, nearest(flat, per_weight, high, low), hessian))
            for module in modules.values():
                # A new tensor: a 1x1 convolution's weight may be a view of the caller's.
                if has_attr(module, path):
                    replace_tensor(module, path, rounded.reshape(weight.shape))
            scales[path] = scale
    seconds = time.perf_counter() - t
    mean_gain = sum(gains) / len(gains) if gains else 0.0
    log.info(
        "GPTQ rounded %d LPBQ-blocked weights onto their block scales (one calibration pass, "
        "%.1f s), output error %.1f dB below round-to-nearest on average",
        len(scales), seconds, mean_gain,
    )
    return GptqResult(scales, 1, seconds, mean_gain)


def _scales(path: str, observer: Any, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The observer's block scales, and the same expanded to one per weight (out x in)."""
    scale, zero_point = observer.calculate_qparams()
    size = tuple(observer.block_size)
    if bool((zero_point != 0).any()) or size[0] != 1 or any(s != 1 for s in size[2:]):
        raise StageError(
            "quantize",
            f"the blocked weight {path} is observed with blocks {size} and zero points "
            f"{sorted(set(zero_point.flatten().tolist()))[:3]}; GPTQ here rounds symmetric "
            "blocks along input channels only: use weight_rounding nearest",
        )
    rows = weight.shape[0]
    per_block = scale.reshape(rows, -1).to(torch.float64)
    per_weight = per_block.repeat_interleave(size[1], dim=1)
    return scale, per_weight


def _hessians(
    modules: Mapping[str, torch.fx.GraphModule],
    convs: Mapping[str, Mapping[torch.fx.Node, tuple[str, Any]]],
    calibrate: Callable[[], None],
) -> Callable[[str], torch.Tensor | None]:
    """``X^T X / rows`` of each blocked weight's inputs over `calibrate()`, in every module (one
    recorder per input node: q / k / v read one), summed per weight over the groups it is in;
    None for a weight no calibration input reached."""
    nodes: list[tuple[torch.fx.GraphModule, torch.fx.Node, tuple[str, ...]]] = []
    for method, gm in modules.items():
        by_input: dict[Any, list[torch.fx.Node]] = {}
        for node in convs[method]:
            by_input.setdefault(node.args[0], []).append(node)
        for group in by_input.values():
            nodes.append((gm, group[0], tuple(sorted(convs[method][n][0] for n in group))))
    # A 1x1 convolution's input (N, in, H, W): one row per pixel. Summed in float32: 30 layers'
    # float64 Hessians would be about 1 GB.
    products = record_input_products(
        nodes, calibrate, rows_of=lambda x: x.transpose(1, -1).reshape(-1, x.shape[1]),
        dtype=torch.float32,
    )
    keys: dict[str, list[tuple[str, ...]]] = {}
    for key in products:
        for path in key:
            keys.setdefault(path, []).append(key)

    def hessian(path: str) -> torch.Tensor | None:
        """Built when asked: one float64 matrix at a time, not one per weight at once."""
        if path not in keys:
            return None
        total = sum(
            (products[key][0].to(torch.float64) for key in keys[path]), torch.zeros(())
        )
        return total / sum(products[key][1] for key in keys[path])

    return hessian
