"""Issue 8, class 6: operators the stock ExecuTorch flow cannot run, run through ours.

Each op end to end, on XNNPACK and portable: a real export, `lower_program` (which applies
`qnn_compile.decompositions` before edge conversion), the .pte run by the ExecuTorch runtime, and
the outputs compared with eager PyTorch; the structure too (the op is gone from the program, and
the kernels it now calls exist). What still cannot run fails at compile time, naming the op and
what to do. One op shows the plain calls failing where the pipeline succeeds.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - the usual spelling
from torch import nn

from qnn_common.config import CompileConfig
from qnn_common.recipes import Backend, Recipe
from qnn_compile.backends import lowering_for
from qnn_compile.decompositions import (
    MissingKernelError,
    decompose,
    program_operators,
    registered_kernels,
)
from qnn_compile.lower import LoweredProgram, lower_program

BACKENDS = (Backend.XNNPACK, Backend.PORTABLE)


class _Fn(nn.Module):
    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: torch.Tensor) -> Any:
        return self.fn(*args)


def _g(seed: int = 1126) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _x5() -> torch.Tensor:
    return torch.randn(1, 4, 8, 8, 8, generator=_g())


def _x4() -> torch.Tensor:
    return torch.randn(1, 4, 16, 16, generator=_g())


def _scatter_inputs() -> tuple[torch.Tensor, ...]:
    g = _g()
    return (
        torch.randn(4, 8, generator=g),
        torch.randint(0, 8, (4, 8), generator=g),
        torch.randn(4, 8, generator=g),
    )


def _grid_inputs() -> tuple[torch.Tensor, ...]:
    g = _g()
    grid = torch.rand(1, 3, 4, 5, 3, generator=g) * 2.4 - 1.2  # a little outside [-1, 1] too
    return torch.randn(1, 3, 5, 6, 7, generator=g), grid


_conv3d = nn.Conv3d(4, 6, 3, stride=(2, 1, 1), padding=(1, 1, 0), dilation=(1, 2, 1), groups=2)

# name -> (the op the stock flow cannot run, the function, its inputs)
CASES: dict[str, tuple[str, Callable[..., Any], Callable[[], tuple[torch.Tensor, ...]]]] = {
    "avg_pool3d": ("avg_pool3d", lambda x: F.avg_pool3d(x, 2, 2), lambda: (_x5(),)),
    "avg_pool3d_pad_ceil": (
        "avg_pool3d",
        lambda x: F.avg_pool3d(x, 3, 2, padding=1, ceil_mode=True, count_include_pad=False),
        lambda: (_x5(),),
    ),
    "max_pool3d": ("max_pool3d", lambda x: F.max_pool3d(x, 2, 2), lambda: (_x5(),)),
    "max_pool3d_with_indices": (
        "max_pool3d",
        lambda x: F.max_pool3d(x, 3, 2, padding=1, return_indices=True),
        lambda: (_x5(),),
    ),
    "adaptive_avg_pool3d": (
        "adaptive_avg_pool3d",
        lambda x: F.adaptive_avg_pool3d(x, 2),
        lambda: (_x5(),),
    ),
    "adaptive_avg_pool3d_uneven": (
        "adaptive_avg_pool3d",
        lambda x: F.adaptive_avg_pool3d(x, (3, 5, 2)),
        lambda: (_x5(),),
    ),
    "adaptive_max_pool2d": (
        "adaptive_max_pool2d",
        lambda x: F.adaptive_max_pool2d(x, 4, return_indices=True),
        lambda: (_x4(),),
    ),
    "adaptive_max_pool2d_uneven": (
        "adaptive_max_pool2d",
        lambda x: F.adaptive_max_pool2d(x, (5, 3), return_indices=True),
        lambda: (_x4(),),
    ),
    "sort": ("sort", lambda x: tuple(torch.sort(x, dim=-1)), lambda: (torch.randn(2, 8, 16),)),
    "sort_stable_descending": (
        "sort",
        lambda x: tuple(torch.sort(x, dim=1, descending=True, stable=True)),
        lambda: (torch.randn(2, 8, 16, generator=_g()),),
    ),
    "argsort": ("argsort", lambda x: torch.argsort(x, dim=-1), lambda: (torch.randn(2, 8, 16),)),
    **{
        f"scatter_reduce_{how}_{'self' if own else 'noself'}": (
            "scatter_reduce",
            lambda x, i, s, how=how, own=own: x.scatter_reduce(1, i, s, how, include_self=own),
            _scatter_inputs,
        )
        for how in ("sum", "prod", "mean", "amax", "amin")
        for own in (True, False)
    },
    "grid_sample_3d": (
        "grid_sampler",
        lambda x, g: F.grid_sample(x, g, align_corners=False),
        _grid_inputs,
    ),
    "grid_sample_3d_nearest_border": (
        "grid_sampler",
        lambda x, g: F.grid_sample(x, g, mode="nearest", padding_mode="border", align_corners=True),
        _grid_inputs,
    ),
    "conv3d": ("conv3d", lambda x: _conv3d(x), lambda: (_x5(),)),
}


def _lower(fn: Callable[..., Any], inputs: tuple[torch.Tensor, ...], backend: Backend) -> Any:
    ep = torch.export.export(_Fn(fn).eval(), inputs, strict=False)
    return ep, lower_program(ep, lowering_for(CompileConfig(backend=backend, recipe=Recipe.FP32)))


def _execute(
    lowered: LoweredProgram, tmp_path: Path, inputs: tuple[torch.Tensor, ...]
) -> list[Any]:
    from executorch.runtime import Runtime

    path = tmp_path / "m.pte"
    path.write_bytes(lowered.pte)
    return list(Runtime.get().load_program(path).load_method("forward").execute(list(inputs)))


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
@pytest.mark.parametrize("name", sorted(CASES))
def test_op_runs_and_matches_eager(name: str, backend: Backend, tmp_path: Path) -> None:
    op, fn, make_inputs = CASES[name]
    inputs = make_inputs()
    ep, lowered = _lower(fn, inputs, backend)
    # Structure: the op is gone (rewritten) and every kernel the program calls exists.
    assert not any(op in name for name in lowered.op_counts), lowered.op_counts
    if backend is Backend.PORTABLE:
        assert lowered.partitions == 0
    got = _execute(lowered, tmp_path, inputs)
    with torch.no_grad():
        want = fn(*inputs)
    want = list(want) if isinstance(want, tuple) else [want]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        if w.dtype.is_floating_point:
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
        else:  # indices: exactly PyTorch's (random inputs have no ties)
            assert torch.equal(g, w)


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
@pytest.mark.parametrize("op", ["rand_like", "randn_like"])
def test_random_like_ops_run_with_the_right_distribution(
    op: str, backend: Backend, tmp_path: Path
) -> None:
    fn = getattr(torch, op)
    x = torch.zeros(128, 128)
    _, lowered = _lower(lambda t: fn(t), (x,), backend)
    assert not any(op in name for name in lowered.op_counts), lowered.op_counts
    (got,) = _execute(lowered, tmp_path, (x,))
    assert got.shape == x.shape and got.dtype == x.dtype
    if op == "rand_like":
        assert float(got.min()) >= 0.0 and float(got.max()) < 1.0
        assert abs(float(got.mean()) - 0.5) < 0.02
    else:
        assert abs(float(got.mean())) < 0.03 and abs(float(got.std()) - 1.0) < 0.03


def test_plain_calls_fail_at_run_time_where_ours_run(tmp_path: Path) -> None:
    """The plain ExecuTorch calls lower avg_pool3d, then the program cannot be loaded."""
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    ep = torch.export.export(_Fn(lambda x: F.avg_pool3d(x, 2, 2)).eval(), (_x5(),), strict=False)
    plain = to_edge_transform_and_lower(ep).to_executorch()
    assert "aten::avg_pool3d.out" in program_operators(plain.executorch_program)
    assert "aten::avg_pool3d.out" not in registered_kernels()
    path = tmp_path / "plain.pte"
    path.write_bytes(plain.buffer)
    with pytest.raises(Exception):  # noqa: B017 - the runtime raises a bare RuntimeError
        Runtime.get().load_program(path).load_method("forward").execute([_x5()])


def test_a_program_without_such_ops_is_not_retraced() -> None:
    ep = torch.export.export(nn.Linear(4, 4).eval(), (torch.randn(2, 4),), strict=False)
    assert decompose(ep, Backend.XNNPACK) is ep


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_what_cannot_run_fails_at_compile_naming_the_op(backend: Backend) -> None:
    # A 3-D transposed convolution: no rewrite, and the portable convolution refuses 5-D.
    deconv = nn.ConvTranspose3d(4, 4, 2, stride=2)
    with pytest.raises(MissingKernelError, match="convolution") as info:
        _lower(lambda x: deconv(x), (_x5(),), backend)
    assert info.value.stage == "compile" and "what to do" in str(info.value)
    # scatter_reduce with an index smaller than src: outside the rewrite, and no kernel.
    x, i, s = torch.randn(4, 8), torch.randint(0, 8, (4, 3)), torch.randn(4, 6)
    with pytest.raises(MissingKernelError, match="scatter_reduce") as info:
        _lower(lambda a, b, c: a.scatter_reduce(1, b, c, "amax"), (x, i, s), backend)
    assert "aten::scatter_reduce.two_out" in info.value.ops


# The QNN-only rewrites: checked here against eager in plain torch (their HTP runs are op suite
# cells: max_dim, lerp, adaptive_avg_pool3d_uneven on qnn-v75).
QNN_CASES: dict[str, tuple[Callable[..., Any], torch.Tensor]] = {
    "max_dim": (lambda x: tuple(torch.max(x, dim=-1)), torch.randn(2, 8, 16, generator=_g())),
    "max_dim_keepdim": (
        lambda x: tuple(torch.max(x, dim=0, keepdim=True)),
        torch.randn(4, 6, generator=_g()),
    ),
    "lerp_low": (lambda x: torch.lerp(x, x.flip(-1), 0.3), torch.randn(4, 16, generator=_g())),
    "lerp_high": (lambda x: torch.lerp(x, x.flip(-1), 0.8), torch.randn(4, 16, generator=_g())),
    "adaptive_avg_pool3d_uneven": (
        lambda x: F.adaptive_avg_pool3d(x, (3, 5, 2)),
        torch.randn(1, 2, 8, 8, 8, generator=_g()),
    ),
}
_QNN_REWRITTEN = {"max", "lerp", "adaptive_avg_pool3d"}


@pytest.mark.parametrize("name", sorted(QNN_CASES))
def test_qnn_rewrites_match_eager(name: str) -> None:
    fn, x = QNN_CASES[name]
    ep = torch.export.export(_Fn(fn).eval(), (x,), strict=False)
    out = decompose(ep, Backend.QNN)
    left = {
        str(n.target).split(".")[1].lstrip("_")
        for n in out.graph.nodes
        if n.op == "call_function" and str(n.target).startswith("aten.")
    }
    assert not left & _QNN_REWRITTEN, left
    want, got = fn(x), out.module()(x)
    # Indices and maxima exactly; lerp in PyTorch's own formula, so to float rounding.
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
