from __future__ import annotations

import pytest
import torch

from qnn_compile.constant_subgraphs import (
    QUANT_ATTRS,
    constant_nodes,
    fold_constant_subgraphs,
    folding_pass,
    lifted_literals,
)


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


@pytest.mark.parametrize("bits", [8, 16])
def test_a_quantized_constant_keeps_its_quantization(bits: int) -> None:
    scores = torch.randn(2, 6, 6)
    gm = _graph(_Masked(), scores)
    where = next(n for n in gm.graph.nodes if "where" in str(n.target))
    top = 2**bits - 1
    where.meta[QUANT_ATTRS] = {"scale": 1.0, "zero_point": top, "quant_min": 0,
                               "quant_max": top, "dtype": torch.int32}
    folded = fold_constant_subgraphs(gm)
    assert folded.modified
    (const,) = (n for n in folded.graph_module.graph.nodes
                if str(n.target).startswith("_folded_constant"))
    assert const.meta[QUANT_ATTRS]["quant_max"] == top  # QNN quantizes the constant with them


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


class _Shifted(torch.nn.Module):
    """A literal tensor in forward (export lifts it), scaled, added to the input; and a buffer
    the module writes, which is no constant."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: torch.Tensor
        self.register_buffer("seen", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.add_(x)
        return x + torch.tensor([1.0, 2.0, 3.0]) * 2.0


def test_a_value_computed_from_a_lifted_literal_folds_in_the_program() -> None:
    from executorch.exir import to_edge

    x = torch.randn(3)
    program = to_edge(torch.export.export(_Shifted(), (x,), strict=False)).exported_program()
    literals = lifted_literals(program)
    assert [1.0, 2.0, 3.0] in [v.tolist() for v in literals.values()]
    signature = program.graph_signature
    mutated = set(signature.buffers_to_mutate.values())
    written = {n for n, b in signature.inputs_to_buffers.items() if b in mutated}  # `seen`
    assert written and not written & set(literals)
    literal = next(n for n, v in literals.items() if v.tolist() == [1.0, 2.0, 3.0])
    # As a graph-module pass it cannot see the literal's value: the product stays computed.
    assert not constant_nodes(program.graph_module)

    result = folding_pass()(program)

    assert result.modified
    graph = result.exported_program.graph_module.graph
    folded = [n for n in graph.nodes if str(n.target).startswith("_folded_constant")]
    assert len(folded) == 1
    assert not any("mul" in str(n.target) for n in graph.nodes)
    assert torch.equal(getattr(result.exported_program.graph_module, str(folded[0].target)),
                       torch.tensor([2.0, 4.0, 6.0]))
    assert any(n.name == literal for n in graph.nodes)  # the signature still lists it
