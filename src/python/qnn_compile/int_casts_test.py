"""A float-to-int cast cast again keeps torch's truncation through QNN's cast fusion, on real edge
programs and upstream's own pass (`int_casts`)."""

from __future__ import annotations

import torch
from executorch.backends.qualcomm._passes.fuse_consecutive_cast import FuseConsecutiveCast
from executorch.exir import to_edge

from qnn_compile.constant_subgraphs import QUANT_ATTRS
from qnn_compile.int_casts import (
    code_casts,
    dropped_truncations,
    keep_code_casts_on_cpu,
    truncate_before_int_casts,
)

_X = torch.tensor([[-2.7, -1.5, -1.2, -0.6, -0.2, 0.0, 0.2, 0.6, 1.2, 1.5, 2.5, 3.5]])


class _RoundTrip(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.int32).to(torch.float32) + x  # no constant: the graph takes x alone


class _IntUsed(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.int32) + 1


def _edge(module: torch.nn.Module) -> torch.fx.GraphModule:
    program = to_edge(torch.export.export(module, (_X,))).exported_program()
    gm: torch.fx.GraphModule = program.graph_module
    return gm


def _fused(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """What QNN's preprocess does to the partition's casts."""
    fused: torch.fx.GraphModule = FuseConsecutiveCast()(gm).graph_module
    return fused


def test_upstream_fuses_the_round_trip_into_no_truncation() -> None:
    # Why the pass exists; if this fails, upstream fixed its TODO and the pass may go.
    gm = _fused(_edge(_RoundTrip()))
    (out,) = gm(_X)
    assert torch.equal(out, _X + _X)


def test_the_round_trip_truncates_through_the_fusion() -> None:
    gm = _edge(_RoundTrip())
    assert len(dropped_truncations(gm)) == 1
    assert truncate_before_int_casts(gm) == 1
    assert not dropped_truncations(gm)  # the cast now reads the truncated value: idempotent
    ops = " ".join(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
    assert all(f"aten.{op}.default" in ops for op in ("abs", "floor", "sign"))
    (out,) = _fused(gm)(_X)
    torch.testing.assert_close(out, _RoundTrip()(_X), rtol=0, atol=0)


def test_a_cast_used_as_an_integer_or_in_a_quantized_graph_is_left_alone() -> None:
    gm = _edge(_IntUsed())
    assert not dropped_truncations(gm)
    assert truncate_before_int_casts(gm) == 0

    quantized = _edge(_RoundTrip())
    (cast,) = dropped_truncations(quantized)
    cast.meta[QUANT_ATTRS] = {"scale": 1.0}
    assert not dropped_truncations(quantized)


def test_a_quantized_float_cast_to_an_integer_falls_back_to_the_cpu() -> None:
    from executorch.backends.qualcomm.utils.constants import QCOM_FALLBACK_NODE

    float_graph = _edge(_RoundTrip())
    assert not code_casts(float_graph) and not keep_code_casts_on_cpu(float_graph).modified

    quantized = _edge(_RoundTrip())
    (cast,) = dropped_truncations(quantized)
    source = cast.args[0]
    assert isinstance(source, torch.fx.Node)
    source.meta[QUANT_ATTRS] = {"scale": 0.02}  # what FoldQDQ leaves on a quantized tensor
    assert code_casts(quantized) == [cast]
    assert keep_code_casts_on_cpu(quantized).modified
    marked = [n for n in quantized.graph.nodes if n.meta.get(QCOM_FALLBACK_NODE)]
    assert marked == [cast]  # the int -> float cast after it is not a code cast
