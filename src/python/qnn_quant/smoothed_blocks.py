"""Per-token int8 activations kept fine where one block of channels is far larger than the rest:
that block divided by a power of two in the norm before the linears, and multiplied back into
their weights' columns.

Why: 8da4w quantizes each token's input to a linear with one int8 scale, set by its largest
value. A decoder's residual stream carries a few channels far larger than the others (largest at
the first position, the token every later one attends to most: an "attention sink"), so after
the RMSNorm those channels set the scale and the rest of the token is rounded to a few levels.
Dividing the block of `group_size` channels that holds them by f (in the norm's weight, which
feeds nothing else) and multiplying the same columns of every linear that reads it by f gives
the same float function, and lets the other channels keep their precision. A gated MLP's down
projection reads ``act(gate(x)) * up(x)``: its block is divided in up's weight rows (and bias).

Exact, as a transform: f is a power of two, so the scaled norm weight, the scaled columns and
the products are the float model's values bit for bit; and a whole group of the weights is
scaled, so 4-bit groups on a grid stay on it (scale and offset times f). What changes is what
the run-time int8 rounding sees.

f is chosen per input from the calibration texts' activations: of 1, 2, 4, 8, 16, the one with
the least squared error of the linears' outputs with the input rounded per token as 8da4w
rounds it (too large an f leaves the block itself too coarse). This is the one use of the
calibration texts by 8da4w, and it needs only a few.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

FACTORS = (1, 2, 4, 8, 16)
# Rows of each input kept for choosing f (a few calibration texts' tokens).
MAX_ROWS = 2048


@dataclass(frozen=True)
class BlockScale:
    """One input's smoothing: `block` (of `size` channels) divided by `factor` in the constants
    `divided`; the linears' output error with it, as a fraction of the error without it."""

    # Parameter paths (the same in every method): a norm's weight, or a linear's weight and bias.
    divided: tuple[str, ...]
    block: int
    size: int
    factor: int
    error_ratio: float


def _constant(gm: torch.fx.GraphModule, node: object, dims: int) -> str | None:
    """The path of `node` when it is a get_attr of a `dims`-D tensor that only one node reads."""
    if not isinstance(node, torch.fx.Node) or node.op != "get_attr" or len(node.users) != 1:
        return None
    value = operator.attrgetter(str(node.target))(gm)
    return str(node.target) if isinstance(value, torch.Tensor) and value.dim() == dims else None


def _divisors(
    gm: torch.fx.GraphModule, x: torch.fx.Node,
    eligible: Callable[[torch.fx.Node, torch.Tensor], bool],
) -> tuple[str, ...] | None:
    """The constants whose entries along their first dimension are `x`'s channels, when `x` is
    a product with one of them: ``mul(weight, y)`` (an RMSNorm's last step: the norm's weight)
    or ``mul(y, linear(z, W, b))`` (a gated MLP's down projection input: W's rows and b), each
    read by nothing else. Dividing those entries divides `x`'s channels exactly."""
    if x.op != "call_function" or x.target is not torch.ops.aten.mul.Tensor:
        return None
    for arg in x.args:
        norm = _constant(gm, arg, 1)
        if norm is not None:
            return (norm,)
    for arg in x.args:
        if (
            isinstance(arg, torch.fx.Node) and arg.op == "call_function"
            and arg.target is torch.ops.aten.linear.default and len(arg.users) == 1
        ):
            weight = _constant(gm, arg.args[1], 2)
            bias = arg.args[2] if len(arg.args) > 2 else None
            bias_path = None if bias is None else _constant(gm, bias, 1)
            if weight is None or (bias is not None and bias_path is None):
                continue
            if not eligible(arg, operator.attrgetter(weight)(gm)):
                continue
            return (weight,) if bias_path is None else (weight, bias_path)
    return None


def smoothable_inputs(
    gm: torch.fx.GraphModule, eligible: Callable[[torch.fx.Node, torch.Tensor], bool],
    group_size: int,
) -> dict[torch.fx.Node, tuple[tuple[str, ...], list[torch.fx.Node]]]:
    """Inputs that only `eligible` ``aten.linear`` nodes read (as their input), made with
    constants that divide their channels exactly (`_divisors`): input node -> (those
    constants' paths, the linears)."""
    found: dict[torch.fx.Node, tuple[tuple[str, ...], list[torch.fx.Node]]] = {}
    for x in gm.graph.nodes:
        users = list(x.users)
        if not users or any(
            u.op != "call_function" or u.target is not torch.ops.aten.linear.default
            or u.args[0] is not x for u in users
        ):
            continue
        weights = [u.args[1] for u in users]
        # Each weight read by its linear alone: a tied one's columns are another op's too.
        if not all(
            isinstance(w, torch.fx.Node) and w.op == "get_attr" and len(w.users) == 1
            for w in weights
        ):
            continue
        values = [operator.attrgetter(str(w.target))(gm) for w in weights]
        width = values[0].shape[-1]
        if width % group_size or width // group_size < 2 or not all(
            eligible(u, v) for u, v in zip(users, values, strict=True)
        ):
            continue
        divisors = _divisors(gm, x, eligible)
        if divisors is not None and all(
            operator.attrgetter(d)(gm).shape[0] == width for d in divisors
        ):
            found[x] = (divisors, users)
    return found


def weight_path(linear: torch.fx.Node) -> str:
    """The path of a smoothable input's linear's weight (`smoothable_inputs` checked it is a
    get_attr)."""
    weight = linear.args[1]
    assert isinstance(weight, torch.fx.Node)
    return str(weight.target)


def per_token_int8(x: torch.Tensor) -> torch.Tensor:
    """`x` rounded as 8da4w's activations are: asymmetric int8, one scale per row."""
    low = x.amin(-1, keepdim=True).clamp(max=0)
    high = x.amax(-1, keepdim=True).clamp(min=0)
    scale = ((high - low) / 255).clamp(min=1e-9)
    zero = (-128 - torch.round(low / scale)).clamp(-128, 127)
    return ((torch.round(x / scale) + zero).clamp(-128, 127) - zero) * scale


def choose_scale(
    divided: tuple[str, ...], rows: torch.Tensor, weights: Sequence[torch.Tensor],
    group_size: int,
) -> BlockScale:
    """The block whose largest |value| over `rows` is largest, and the factor of FACTORS with
    the least output error of `weights` (stacked) over `rows` rounded per token."""
    x = rows.float()
    w = torch.cat([t.detach().float() for t in weights])
    block = int(x.abs().amax(0).reshape(-1, group_size).amax(-1).argmax())
    reference = x @ w.T
    errors: dict[int, float] = {}
    for factor in FACTORS:
        divide = torch.ones(x.shape[-1])
        divide[block * group_size : (block + 1) * group_size] = factor
        errors[factor] = float(((per_token_int8(x / divide) * divide) @ w.T - reference)
                               .square().sum())
    best = min(FACTORS, key=lambda f: (errors[f], f))
    ratio = errors[best] / errors[1] if errors[1] > 0 else 1.0
    return BlockScale(divided, block, group_size, best, round(ratio, 4))


def apply_scales(gm: torch.fx.GraphModule, scales: Mapping[str, BlockScale],
                 group_size: int) -> list[BlockScale]:
    """Divide each scaled input's block by its factor in the constants that make it and multiply
    the same columns of the linears reading it (new tensors: the originals may be shared with the
    source program). `scales` are keyed by their first divided constant. Returns the scales
    applied (an input `gm` does not have, or not as a smoothable one, is skipped)."""
    applied = []
    for divided, linears in smoothable_inputs(gm, lambda n, w: True, group_size).values():
        scale = scales.get(divided[0])
        if scale is None or scale.factor == 1 or scale.divided != divided:
            continue
        cols = slice(scale.block * scale.size, (scale.block + 1) * scale.size)
        for path in divided:
            _scale(gm, path, (cols,), 1 / scale.factor)
        for linear in linears:
            _scale(gm, weight_path(linear), (slice(None), cols), scale.factor)
        applied.append(scale)
    return applied


def _scale(
    gm: torch.fx.GraphModule, path: str, index: tuple[slice, ...], factor: float
) -> None:
    """Replace constant `path` of `gm` by a copy with `index` times `factor`."""
    parent, _, leaf = path.rpartition(".")
    holder = gm.get_submodule(parent) if parent else gm
    old = getattr(holder, leaf)
    new = old.detach().clone()
    new[index] *= factor
    if isinstance(old, torch.nn.Parameter):
        setattr(holder, leaf, torch.nn.Parameter(new, requires_grad=False))
    else:
        setattr(holder, leaf, new)
