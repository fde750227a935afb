"""The value rewrites behind `qnn_compile.decompositions` (sort / argsort through topk,
scatter_reduce, max.dim, lerp with a scalar weight, rand_like / randn_like; the spatial ones are
in `op_rewrites`), written like those: plain torch, NotImplemented for arguments a rewrite does
not compute exactly.
"""

from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten


def sort(x: torch.Tensor, dim: int = -1, descending: bool = False) -> Any:
    """aten.sort as topk over the whole dimension (ties in arbitrary order)."""
    if x.dim() == 0 or x.numel() == 0:
        return NotImplemented
    values, indices = aten.topk.default(x, x.shape[dim], dim, descending, True)
    return values, indices


def sort_stable(
    x: torch.Tensor, *, stable: bool | None = None, dim: int = -1, descending: bool = False
) -> Any:
    """aten.sort.stable: as `sort` (stability of ties is not kept)."""
    return sort(x, dim, descending)


def argsort(x: torch.Tensor, dim: int = -1, descending: bool = False) -> Any:
    """aten.argsort: the indices of `sort`."""
    out = sort(x, dim, descending)
    return out if out is NotImplemented else out[1]


def argsort_stable(
    x: torch.Tensor, *, stable: bool, dim: int = -1, descending: bool = False
) -> Any:
    """aten.argsort.stable: as `argsort`."""
    return argsort(x, dim, descending)


def scatter_reduce(
    x: torch.Tensor,
    dim: int,
    index: torch.Tensor,
    src: torch.Tensor,
    reduce: str,
    *,
    include_self: bool = True,
) -> Any:
    """Through a one-hot match of `index` against every output position along `dim`: exact for
    sum, prod, mean, amax and amin when index and src have one shape and `x` matches it outside
    `dim` (the common case); other shapes are left to the kernel check."""
    if x.dim() == 0 or tuple(index.shape) != tuple(src.shape):
        return NotImplemented
    dim = dim % x.dim()
    if any(a != b for i, (a, b) in enumerate(zip(x.shape, index.shape, strict=True)) if i != dim):
        return NotImplemented
    m = x.shape[dim]
    shape = [1] * (x.dim() + 1)
    shape[dim + 1] = m
    positions = torch.arange(m, dtype=index.dtype).reshape(shape)
    match = index.unsqueeze(dim + 1) == positions  # (..., n, m, ...)
    values = src.unsqueeze(dim + 1)
    count = match.sum(dim)
    floating = x.dtype.is_floating_point
    if reduce in ("sum", "mean"):
        acc = torch.where(match, values, torch.zeros_like(values)).sum(dim).to(x.dtype)
    elif reduce == "prod":
        acc = torch.where(match, values, torch.ones_like(values)).prod(dim).to(x.dtype)
    elif reduce in ("amax", "amin"):
        big = float("inf") if floating else torch.iinfo(x.dtype).max
        fill = -big if reduce == "amax" else big
        masked = torch.where(match, values, torch.full_like(values, fill))
        acc = masked.amax(dim) if reduce == "amax" else masked.amin(dim)
    else:
        return NotImplemented
    hit = count > 0
    if reduce == "mean":
        total = acc + x if include_self else acc
        n = (count + 1) if include_self else count.clamp(min=1)
        mean = total / n if floating else torch.div(total, n, rounding_mode="floor")
        return torch.where(hit, mean.to(x.dtype), x)
    if include_self:
        combined = {
            "sum": lambda: x + acc,
            "prod": lambda: x * acc,
            "amax": lambda: torch.maximum(x, acc),
            "amin": lambda: torch.minimum(x, acc),
        }[reduce]()
        return torch.where(hit, combined, x)
    return torch.where(hit, acc, x)


def lerp_scalar(x: torch.Tensor, end: torch.Tensor, weight: float) -> Any:
    """aten.lerp.Scalar in PyTorch's own two forms (the weight is a number, so the branch is
    taken here): ``x + w * (end - x)`` below 0.5, ``end - (end - x) * (1 - w)`` from it."""
    w = float(weight)
    diff = end - x
    return x + diff * w if abs(w) < 0.5 else end - diff * (1.0 - w)


def max_dim(x: torch.Tensor, dim: int, keepdim: bool = False) -> Any:
    """aten.max.dim as amax (the values) and argmax (the indices: the first maximum, as PyTorch's
    max.dim), two single-output ops."""
    if x.dim() == 0:
        return NotImplemented
    return aten.amax.default(x, [dim], keepdim), aten.argmax.default(x, dim, keepdim)


def rand_like(x: torch.Tensor, *, dtype: torch.dtype | None = None, **_: Any) -> torch.Tensor:
    """aten.rand_like as aten.rand of the same shape (and dtype unless given)."""
    return torch.rand(list(x.shape), dtype=dtype or x.dtype)


def randn_like(x: torch.Tensor, *, dtype: torch.dtype | None = None, **_: Any) -> torch.Tensor:
    """aten.randn_like as aten.randn of the same shape (and dtype unless given)."""
    return torch.randn(list(x.shape), dtype=dtype or x.dtype)
