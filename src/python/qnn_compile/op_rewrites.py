"""The spatial rewrites behind `qnn_compile.decompositions` (3-D and adaptive pooling, 3-D
convolution, 3-D grid sampling; the others are in `value_rewrites`): each computes an operator the
stock ExecuTorch flow cannot run from operators it can, in plain torch (traced by
`ExportedProgram.run_decompositions`). A rewrite returns NotImplemented for arguments it does not
compute exactly; the operator is then left alone (and `check_kernels` names it at compile time).
"""

from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten


def _triple(v: Any, default: Any = None) -> list[int]:
    if v is None or (isinstance(v, list | tuple) and len(v) == 0):
        v = default
    if isinstance(v, int):
        return [v, v, v]
    vals = [int(x) for x in v]
    return vals * 3 if len(vals) == 1 else vals


def _as_5d(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    return (x.unsqueeze(0), True) if x.dim() == 4 else (x, False)


def max_pool3d_with_indices(
    x: torch.Tensor,
    kernel_size: Any,
    stride: Any = (),
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Separable: 2-D max pooling over (H, W) per depth slice, then over D; the indices are
    composed back into flat D*H*W positions (first maximum in (d, h, w) order, as PyTorch).

    The values come from `max_pool2d` (which XNNPACK takes), the indices from a parallel
    `max_pool2d_with_indices` chain that export drops when nothing reads them.
    """
    k = _triple(kernel_size)
    s = _triple(stride, k)
    p, d = _triple(padding), _triple(dilation)
    x5, squeezed = _as_5d(x)
    n, c, depth, h, w = x5.shape
    planes = x5.reshape(n, c * depth, h, w)
    hw_args = (k[1:], s[1:], p[1:], d[1:], ceil_mode)
    d_args = ([k[0], 1], [s[0], 1], [p[0], 0], [d[0], 1], ceil_mode)
    v1 = aten.max_pool2d.default(planes, *hw_args)
    ho, wo = v1.shape[-2:]
    v2 = aten.max_pool2d.default(v1.reshape(n, c, depth, ho * wo), *d_args)
    do = v2.shape[2]
    values = v2.reshape(n, c, do, ho, wo)
    # The indices: the same two poolings with indices, composed.
    w1, i1 = aten.max_pool2d_with_indices.default(planes, *hw_args)
    _, i2 = aten.max_pool2d_with_indices.default(w1.reshape(n, c, depth, ho * wo), *d_args)
    src_d = torch.div(i2, ho * wo, rounding_mode="floor")
    hw = torch.gather(i1.reshape(n, c, depth, ho * wo), 2, src_d)
    indices = (src_d * (h * w) + hw).reshape(n, c, do, ho, wo)
    if squeezed:
        return values.squeeze(0), indices.squeeze(0)
    return values, indices


def max_pool3d(
    x: torch.Tensor,
    kernel_size: Any,
    stride: Any = (),
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
) -> torch.Tensor:
    """aten.max_pool3d: the values of `max_pool3d_with_indices`."""
    return max_pool3d_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode)[0]


def avg_pool3d(
    x: torch.Tensor,
    kernel_size: Any,
    stride: Any = (),
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Any:
    """Separable: 2-D average pooling over (H, W), then over D. Exact, padding and ceil_mode
    included: a 3-D window's divisor is the product of its per-dimension counts."""
    if divisor_override is not None:
        return NotImplemented
    k = _triple(kernel_size)
    s = _triple(stride, k)
    p = _triple(padding)
    x5, squeezed = _as_5d(x)
    n, c, depth, h, w = x5.shape
    v1 = aten.avg_pool2d.default(
        x5.reshape(n, c * depth, h, w), k[1:], s[1:], p[1:], ceil_mode, count_include_pad
    )
    ho, wo = v1.shape[-2:]
    v2 = aten.avg_pool2d.default(
        v1.reshape(n, c, depth, ho * wo),
        [k[0], 1],
        [s[0], 1],
        [p[0], 0],
        ceil_mode,
        count_include_pad,
    )
    out = v2.reshape(n, c, v2.shape[2], ho, wo)
    return out.squeeze(0) if squeezed else out


def _adaptive_ranges(size: int, out: int) -> list[tuple[int, int]]:
    # PyTorch's adaptive windows: [floor(i * size / out), ceil((i + 1) * size / out)).
    return [(i * size // out, -((-(i + 1) * size) // out)) for i in range(out)]


def adaptive_avg_pool3d(x: torch.Tensor, output_size: Any) -> Any:
    """Divisible sizes: an average pooling (then `_avg_pool3d`); otherwise separable means over
    PyTorch's adaptive windows, one dimension at a time."""
    x5, squeezed = _as_5d(x)
    sizes = list(x5.shape[2:])
    outs = [sizes[i] if o is None else int(o) for i, o in enumerate(_triple(output_size))]
    if all(s % o == 0 for s, o in zip(sizes, outs, strict=True)):
        k = [s // o for s, o in zip(sizes, outs, strict=True)]
        out = avg_pool3d(x5, k, k)
    else:
        out = x5
        for dim, (size, o) in enumerate(zip(sizes, outs, strict=True), start=2):
            parts = [
                out.narrow(dim, a, b - a).mean(dim, keepdim=True)
                for a, b in _adaptive_ranges(size, o)
            ]
            out = torch.cat(parts, dim)
    return out.squeeze(0) if squeezed else out


def adaptive_max_pool2d(x: torch.Tensor, output_size: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Divisible sizes: a max pooling with kernel = stride (torch's own decomposition); otherwise
    one max per adaptive window (indices as flat H*W positions, as PyTorch's)."""
    oh, ow = (int(output_size[0]), int(output_size[1]))
    h, w = x.shape[-2:]
    if h % oh == 0 and w % ow == 0:
        k = [h // oh, w // ow]
        # Values from max_pool2d (XNNPACK takes it); indices from a chain dropped if unread.
        values = aten.max_pool2d.default(x, k, k)
        return values, aten.max_pool2d_with_indices.default(x, k, k)[1]
    rows_v, rows_i = [], []
    for r0, r1 in _adaptive_ranges(h, oh):
        cols_v, cols_i = [], []
        for c0, c1 in _adaptive_ranges(w, ow):
            window = x[..., r0:r1, c0:c1]
            flat = window.reshape(*window.shape[:-2], -1)
            v, i = torch.max(flat, dim=-1, keepdim=True)
            width = c1 - c0
            idx = (torch.div(i, width, rounding_mode="floor") + r0) * w + (i % width + c0)
            cols_v.append(v)
            cols_i.append(idx)
        rows_v.append(torch.cat(cols_v, -1).unsqueeze(-2))
        rows_i.append(torch.cat(cols_i, -1).unsqueeze(-2))
    return torch.cat(rows_v, -2), torch.cat(rows_i, -2)


# 3-D convolution (5-D tensors), which the portable convolution kernel refuses at run time.


def _conv3d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: Any,
    padding: Any,
    dilation: Any,
    groups: int,
) -> torch.Tensor:
    """A sum of 2-D convolutions, one per kernel depth offset, over strided depth slices."""
    s, p, d = _triple(stride), _triple(padding), _triple(dilation)
    x5, squeezed = _as_5d(x)
    n, c, depth, h, w = x5.shape
    kd = weight.shape[2]
    if p[0]:
        x5 = torch.nn.functional.pad(x5, [0, 0, 0, 0, p[0], p[0]])
        depth += 2 * p[0]
    do = (depth - d[0] * (kd - 1) - 1) // s[0] + 1
    out: torch.Tensor | None = None
    for i in range(kd):
        start = i * d[0]
        sl = x5[:, :, start : start + s[0] * (do - 1) + 1 : s[0]]  # (n, c, do, h, w)
        planes = sl.permute(0, 2, 1, 3, 4).reshape(n * do, c, h, w)
        y = aten.convolution.default(
            planes, weight[:, :, i], None, s[1:], p[1:], d[1:], False, [0, 0], groups
        )
        out = y if out is None else out + y
    assert out is not None
    cout, ho, wo = out.shape[1:]
    result = out.reshape(n, do, cout, ho, wo).permute(0, 2, 1, 3, 4)
    if bias is not None:
        result = result + bias.reshape(1, -1, 1, 1, 1)
    return result.squeeze(0) if squeezed else result


def convolution(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: bool,
    output_padding: Any,
    groups: int,
) -> Any:
    """aten.convolution with a 5-D weight, not transposed: `_conv3d`; others left alone."""
    if transposed or weight.dim() != 5:
        return NotImplemented
    return _conv3d(x, weight, bias, stride, padding, dilation, groups)


def conv3d_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Any:
    """aten.conv3d (numeric padding): `_conv3d`."""
    if isinstance(padding, str):  # "same" / "valid": left to the stock flow
        return NotImplemented
    return _conv3d(x, weight, bias, stride, padding, dilation, groups)


def _unnormalize(coord: torch.Tensor, size: int, align_corners: bool) -> torch.Tensor:
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def grid_sampler_3d(
    x: torch.Tensor,
    grid: torch.Tensor,
    interpolation_mode: int,
    padding_mode: int,
    align_corners: bool,
) -> Any:
    """Trilinear (mode 0) or nearest (mode 1) sampling with zeros (0) or border (1) padding,
    as gathers from the flattened input; reflection padding and bicubic are left alone."""
    if interpolation_mode not in (0, 1) or padding_mode not in (0, 1):
        return NotImplemented
    n, c, depth, h, w = x.shape
    do, ho, wo = grid.shape[1:4]
    flat = x.reshape(n, c, depth * h * w)
    coords = []
    for axis, size in ((0, w), (1, h), (2, depth)):
        v = _unnormalize(grid[..., axis], size, align_corners)
        if padding_mode == 1:
            v = v.clamp(0, size - 1)
        coords.append(v.reshape(n, 1, do * ho * wo))
    ix, iy, iz = coords

    def sample(zi: torch.Tensor, yi: torch.Tensor, xi: torch.Tensor) -> torch.Tensor:
        valid = (xi >= 0) & (xi <= w - 1) & (yi >= 0) & (yi <= h - 1)
        valid = valid & (zi >= 0) & (zi <= depth - 1)
        lin = (zi.clamp(0, depth - 1) * h + yi.clamp(0, h - 1)) * w + xi.clamp(0, w - 1)
        got = torch.gather(flat, 2, lin.to(torch.int64).expand(n, c, -1))
        return torch.where(valid, got, torch.zeros_like(got))

    if interpolation_mode == 1:
        out = sample(torch.round(iz), torch.round(iy), torch.round(ix))
    else:
        x0, y0, z0 = torch.floor(ix), torch.floor(iy), torch.floor(iz)
        fx, fy, fz = ix - x0, iy - y0, iz - z0
        out = torch.zeros(n, c, do * ho * wo, dtype=x.dtype)
        for dz, wz in ((0, 1 - fz), (1, fz)):
            for dy, wy in ((0, 1 - fy), (1, fy)):
                for dx, wx in ((0, 1 - fx), (1, fx)):
                    out = out + sample(z0 + dz, y0 + dy, x0 + dx) * (wz * wy * wx)
    return out.reshape(n, c, do, ho, wo)


def grid_sampler(
    x: torch.Tensor,
    grid: torch.Tensor,
    interpolation_mode: int,
    padding_mode: int,
    align_corners: bool,
) -> Any:
    """aten.grid_sampler: 5-D input through `grid_sampler_3d`, 4-D to grid_sampler_2d."""
    if x.dim() == 5:
        return grid_sampler_3d(x, grid, interpolation_mode, padding_mode, align_corners)
    return aten.grid_sampler_2d.default(x, grid, interpolation_mode, padding_mode, align_corners)
