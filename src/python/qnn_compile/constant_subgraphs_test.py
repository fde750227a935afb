from __future__ import annotations

import torch

from qnn_compile.constant_subgraphs import QUANT_ATTRS, constant_nodes, fold_constant_subgraphs


class _Masked(torch.nn.Module):
    """Scores masked by a causal mask built from constants (what sdpa's decomposition does)."""

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(6).unsqueeze(1)
        cols = torch.arange(6).unsqueeze(0)
        mask = torch.where(cols <= rows, 0.0, float("-inf"))
        return torch.softmax(scores + mask, dim=-1)


def _graph(module: torch.nn.Module, *args: torch.Tensor) -> torch.fx.GraphModule:
    return torch.export.export(module, args, strict=False).module()


def _targets(gm: torch.fx.GraphModule) -> set[str]:
    return {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}


def test_a_mask_from_constants_becomes_one_constant_and_computes_the_same() -> None:
    scores = torch.randn(2, 6, 6, generator=torch.Generator().manual_seed(0))
    gm = _graph(_Masked(), scores)
    expected = gm(scores)
    assert any("arange" in t for t in _targets(gm))

    result = fold_constant_subgraphs(gm)

    assert result.modified
    assert not any("arange" in t or "where" in t for t in _targets(result.graph_module))
    folded = [n for n in result.graph_module.graph.nodes if n.op == "get_attr"
              and str(n.target).startswith("_folded_constant")]
    assert len(folded) == 1
    assert folded[0].users and all(u.op == "call_function" for u in folded[0].users)
    torch.testing.assert_close(result.graph_module(scores), expected, rtol=0, atol=0)


def test_inputs_random_ops_and_nothing_to_fold_are_left_alone() -> None:
    class _Noisy(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2.0 + torch.rand(3)

    gm = _graph(_Noisy(), torch.randn(3))
    assert not constant_nodes(gm)
    before = _targets(gm)
    assert not fold_constant_subgraphs(gm).modified
    assert _targets(gm) == before


def test_a_subgraph_holding_a_16_bit_value_stays_computed() -> None:
    scores = torch.randn(2, 6, 6)
    gm = _graph(_Masked(), scores)
    where = next(n for n in gm.graph.nodes if "where" in str(n.target))
    where.meta[QUANT_ATTRS] = {"scale": 1.0, "zero_point": 65535, "quant_min": 0,
                               "quant_max": 65535, "dtype": torch.int32}
    assert not constant_nodes(gm)  # the whole connected mask subgraph, not only the 16-bit node
    assert not fold_constant_subgraphs(gm).modified

    where.meta[QUANT_ATTRS] = {"scale": 1.0, "zero_point": 255, "quant_min": 0,
                               "quant_max": 255, "dtype": torch.uint8}
    folded = fold_constant_subgraphs(gm)
    assert folded.modified
    (const,) = (n for n in folded.graph_module.graph.nodes
                if str(n.target).startswith("_folded_constant"))
    assert const.meta[QUANT_ATTRS]["quant_max"] == 255  # QNN quantizes the constant with them


def test_a_dequantize_stays_for_qnn_to_read() -> None:
    import torch.ao.quantization.fx._decomposed  # registers the quantized_decomposed ops

    class _Dequantized(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            codes = torch.full((4, 4), 3, dtype=torch.int8)
            weight: torch.Tensor = torch.ops.quantized_decomposed.dequantize_per_tensor(
                codes, 0.01, 0, -127, 127, torch.int8)
            return x @ weight

    gm = _graph(_Dequantized(), torch.randn(2, 4))
    folded = fold_constant_subgraphs(gm).graph_module
    # The int8 codes may become a constant; their dequantize stays, so QNN sees an 8-bit weight.
    assert any("dequantize_per_tensor" in t for t in _targets(folded))
    const = [n for n in folded.graph.nodes if str(n.target).startswith("_folded_constant")]
    assert all(getattr(folded, str(n.target)).dtype == torch.int8 for n in const)
