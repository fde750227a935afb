"""GPTQ weight rounding for the linear layers of exported programs (Frantar et al. 2022).

Round-to-nearest puts each weight on its grid alone. GPTQ rounds a layer's input columns one by
one and spreads each column's rounding error over the columns not yet rounded, weighted by the
inverse of the layer's input Hessian ``H = X^T X`` from calibration, so the layer's *output* on
the calibration inputs moves as little as possible. Layers are done in program order and each
layer's Hessian is taken with the layers before it already rounded, so later layers also absorb
earlier layers' error ("sequential" GPTQ).

Fitting in the PT2E flow: the scales are round-to-nearest's (symmetric, per output channel, from
the float weights' absolute maximum). This pass runs on the float graph before `prepare_pt2e`
and leaves every weight exactly on that grid; after calibration, `pin_weight_scales` sets each
weight observer's range to that scale, since an observer seeing the rounded weights could
otherwise pick a smaller one (a channel whose largest weight rounded inwards) and re-round.
The quantized program then holds exactly the GPTQ integers.

Sequential GPTQ runs the calibration once per group of weights that read one input, through the
whole program: for a deep decoder (SmolLM2-135M: 120 groups) that is quadratic in its depth.
Past `SEQUENTIAL_GROUPS` groups one calibration pass records every layer's Hessian from the
float model's inputs (each layer then corrects its own rounding, not its predecessors'), the
trade GPTQ implementations make for speed; `sequential=True` forces the exact form.

Several methods (a causal LM's prefill and decode) are rounded together: each layer's Hessian
sums its inputs in every method, and every method gets the same weights, so they still share
their quantized bytes.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import reduce
from typing import Any

import torch

from qnn_common.errors import StageError
from qnn_quant.graph_params import replace_tensor
from qnn_quant.input_products import record_input_products

log = logging.getLogger(__name__)

_LINEAR = torch.ops.aten.linear.default
# Above this many weight groups (eight Llama decoder layers), Hessians come from one pass.
SEQUENTIAL_GROUPS = 32
# Hessian damping: a fraction of its mean diagonal added to the diagonal (the paper's 1 %), so
# a layer whose calibration inputs do not span every direction still inverts.
DAMPING = 0.01
_BLOCK = 128  # columns rounded per lazy update (the paper's batching; exact either way)


@dataclass(frozen=True)
class GptqResult:
    """What the pass did: per weight (its attribute path) the scale it rounded to, and numbers."""

    scales: Mapping[str, torch.Tensor]
    calibration_passes: int
    seconds: float
    # Output error on the calibration inputs, tr((W-Q) H (W-Q)^T), of round-to-nearest over
    # that of GPTQ, in dB, averaged over layers (> 0: GPTQ's outputs are closer).
    mean_gain_db: float

    def to_json(self) -> dict[str, Any]:
        """The manifest's record."""
        return {
            "weights": len(self.scales),
            "calibration_passes": self.calibration_passes,
            "seconds": round(self.seconds, 3),
            "mean_output_error_gain_db_vs_nearest": round(self.mean_gain_db, 2),
        }


def round_weights(
    modules: Mapping[str, torch.fx.GraphModule],
    calibrate: Callable[[], None],
    *,
    bits: int,
    skip: Callable[[torch.fx.Node], bool] = lambda node: False,
    sequential: bool | None = None,
) -> GptqResult:
    """GPTQ-round every linear weight of `modules` that only linears read: each module gets the
    rounded weight as a new tensor, and the tensors it held (a program's, the caller's) keep
    their float values.

    `calibrate()` runs the calibration data through all of `modules` (the pass swaps in
    recording linears around it). `bits`: the symmetric weight grid, ±(2^(bits-1) - 1).
    `skip(node)` leaves a linear node's weight alone (layers kept in float). A weight that
    another op also reads (an LM head tied to the embedding table) is left to round-to-nearest.
    `sequential`: one calibration pass per weight group, each with the groups before it rounded
    (None: when there are at most `SEQUENTIAL_GROUPS`); else one pass for every Hessian.
    """
    t = time.perf_counter()
    qmax = 2 ** (bits - 1) - 1
    groups = _groups(next(iter(modules.values())), skip)
    if sequential is None:
        sequential = len(groups) <= SEQUENTIAL_GROUPS
    # Sequential: a pass per group; else one pass for all, each Hessian in float32 (a deep
    # decoder's float64 Hessians alone would be a GB).
    passes = [[group] for group in groups] if sequential else [groups]
    dtype = torch.float64 if sequential else torch.float32
    scales: dict[str, torch.Tensor] = {}
    gains: list[float] = []
    for pass_groups in passes:
        hessians = _hessians(modules, calibrate, pass_groups, dtype)
        for name in (name for group in pass_groups for name in group):
            if name not in hessians:
                continue  # no calibration input reached it: nearest rounding will do
            weight = _attr(modules, name).detach()
            scale = weight.detach().abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / qmax
            hessian = hessians[name].to(torch.float64)
            rounded = gptq(weight, hessian, scale, qmax)
            gains.append(gain_db(weight, rounded, nearest(weight, scale, qmax), hessian))
            for module in modules.values():
                if has_attr(module, name):
                    replace_tensor(module, name, rounded)
            scales[name] = scale.squeeze(1)
    seconds = time.perf_counter() - t
    mean_gain = sum(gains) / len(gains) if gains else 0.0
    log.info(
        "GPTQ rounded %d weights in %d calibration passes (%s, %.1f s), output error %.1f dB "
        "below round-to-nearest on average",
        len(scales),
        len(passes),
        "sequential" if sequential else f"one pass for {len(groups)} groups",
        seconds,
        mean_gain,
    )
    return GptqResult(scales, len(passes), seconds, mean_gain)


def gptq(
    weight: torch.Tensor, hessian: torch.Tensor, scale: torch.Tensor, qmax: int,
    qmin: int | None = None,
) -> torch.Tensor:
    """`weight` (out x in) rounded onto ``scale * [qmin, qmax]`` (qmin None: -qmax) by GPTQ with
    input Hessian `hessian` (in x in); columns in order of decreasing Hessian diagonal. `scale`
    is out x 1 (one per output channel) or out x in (a scale per weight: LPBQ's blocks,
    `qnn_quant.quantizers.lpbq_gptq`)."""
    low = -qmax if qmin is None else qmin
    w = weight.detach().to(torch.float64).clone()
    h = hessian.to(torch.float64).clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1  # inputs that were always zero: their weights cannot matter
    w[:, dead] = 0
    order = torch.argsort(torch.diag(h), descending=True)
    s = scale.to(torch.float64).expand_as(w)[:, order]
    w, h = w[:, order], h[order][:, order]
    h += DAMPING * torch.mean(torch.diag(h)) * torch.eye(h.shape[0], dtype=h.dtype)
    # Upper Cholesky factor of H^-1: row i holds the update of columns i.. after rounding i.
    h_inv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    out = torch.zeros_like(w)
    columns = w.shape[1]
    for start in range(0, columns, _BLOCK):
        end = min(start + _BLOCK, columns)
        block = w[:, start:end].clone()
        errors = torch.zeros_like(block)
        h_block = h_inv[start:end, start:end]
        for i in range(end - start):
            column = block[:, i : i + 1]
            step = s[:, start + i : start + i + 1]
            q = torch.clamp(torch.round(column / step), low, qmax) * step
            out[:, start + i : start + i + 1] = q
            error = (column - q) / h_block[i, i]
            block[:, i:] -= error @ h_block[i : i + 1, i:]
            errors[:, i : i + 1] = error
        w[:, end:] -= errors @ h_inv[start:end, end:]
    inverse = torch.argsort(order)
    return out[:, inverse].to(weight.dtype)


def pin_weight_scales(prepared: torch.fx.GraphModule, result: GptqResult, bits: int) -> int:
    """Set the observer of each GPTQ-rounded weight in `prepared` (after calibration) to the
    scale GPTQ rounded to; returns how many. Refuses an observer whose grid is not the one GPTQ
    rounded onto (symmetric ±(2^(bits-1) - 1), per output channel)."""
    qmax = 2 ** (bits - 1) - 1
    pinned = 0
    for node in prepared.graph.nodes:
        if node.op != "get_attr" or node.target not in result.scales:
            continue
        scale = result.scales[str(node.target)]
        for user in node.users:
            if user.op != "call_module":
                continue
            observer = prepared.get_submodule(str(user.target))
            grid = (getattr(observer, "quant_min", None), getattr(observer, "quant_max", None))
            if grid != (-qmax, qmax) or getattr(observer, "ch_axis", None) != 0:
                raise StageError(
                    "quantize",
                    f"the weight {node.target} is observed on grid {grid} (axis "
                    f"{getattr(observer, 'ch_axis', None)}), but GPTQ rounded it per output "
                    f"channel onto [-{qmax}, {qmax}]; use weight_rounding nearest for this "
                    "quantizer",
                )
            limit = scale * qmax
            observer.min_val = -limit.to(observer.min_val.dtype)
            observer.max_val = limit.to(observer.max_val.dtype)
            pinned += 1
    return pinned


def nearest(
    weight: torch.Tensor, scale: torch.Tensor, qmax: int, qmin: int | None = None
) -> torch.Tensor:
    """`weight` rounded to the nearest level of ``scale * [qmin, qmax]`` (qmin None: -qmax)."""
    low = -qmax if qmin is None else qmin
    return torch.clamp(torch.round(weight / scale), low, qmax) * scale


def gain_db(
    weight: torch.Tensor, gptq_w: torch.Tensor, nearest_w: torch.Tensor, hessian: torch.Tensor
) -> float:
    """How much less output error, tr((W-Q) H (W-Q)^T), `gptq_w` has than `nearest_w`, in dB."""
    def error(q: torch.Tensor) -> float:
        d = (weight - q).to(torch.float64)
        return float(((d @ hessian.to(torch.float64)) * d).sum())

    nearest, ours = error(nearest_w), error(gptq_w)
    return 10 * math.log10(max(nearest, 1e-30) / max(ours, 1e-30))


def _linear_weights(
    gm: torch.fx.GraphModule, skip: Callable[[torch.fx.Node], bool]
) -> dict[torch.fx.Node, str]:
    """Linear nodes whose weight is a 2-D attribute that only linears read, to its path."""
    out: dict[torch.fx.Node, str] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not _LINEAR or skip(node):
            continue
        weight = node.args[1]
        if not isinstance(weight, torch.fx.Node) or weight.op != "get_attr":
            continue
        if any(u.target is not _LINEAR or u.args[1] is not weight for u in weight.users):
            continue
        if _get(gm, str(weight.target)).dim() == 2:
            out[node] = str(weight.target)
    return out


def _groups(gm: torch.fx.GraphModule, skip: Callable[[torch.fx.Node], bool]) -> list[list[str]]:
    """The weights in program order, grouped by the input they read (q / k / v, gate / up):
    one calibration pass records the Hessian of a whole group."""
    by_input: dict[Any, list[str]] = {}
    for node, name in _linear_weights(gm, skip).items():
        names = by_input.setdefault(node.args[0], [])
        if name not in names:
            names.append(name)
    return list(by_input.values())


def _hessians(
    modules: Mapping[str, torch.fx.GraphModule], calibrate: Callable[[], None],
    groups: list[list[str]], dtype: torch.dtype = torch.float64,
) -> dict[str, torch.Tensor]:
    """``X^T X / rows`` of the inputs of the linears reading each group's weights, over one
    calibration: one matrix per group (its weights read one input), kept in `dtype`."""
    first = {name: group[0] for group in groups for name in group}
    nodes: list[tuple[torch.fx.GraphModule, torch.fx.Node, str]] = []
    for module in modules.values():
        recorded: set[Any] = set()
        for node, name in _linear_weights(module, lambda n: False).items():
            # The group's first linear records its input; the others read the same tensor.
            if name in first and first[name] == name and node.args[0] not in recorded:
                recorded.add(node.args[0])
                nodes.append((module, node, name))
    products = record_input_products(
        nodes, calibrate, rows_of=lambda x: x.reshape(-1, x.shape[-1]), dtype=dtype
    )
    return {
        name: products[key][0] / products[key][1]
        for name, key in first.items() if key in products and products[key][1]
    }


def _get(module: torch.nn.Module, path: str) -> torch.Tensor:
    value = reduce(getattr, path.split("."), module)
    assert isinstance(value, torch.Tensor), path
    return value


def has_attr(module: torch.nn.Module, path: str) -> bool:
    """Whether `module` has a (dotted) attribute `path`."""
    try:
        reduce(getattr, path.split("."), module)
    except AttributeError:
        return False
    return True


def _attr(modules: Mapping[str, torch.fx.GraphModule], path: str) -> torch.Tensor:
    for module in modules.values():
        if has_attr(module, path):
            return _get(module, path)
    raise KeyError(path)
