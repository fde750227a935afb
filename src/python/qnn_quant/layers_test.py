"""Layer selection: which nodes stay float, which quantize dynamically, and the real PT2E flow
with dynamic linears (lowering them is tested in tests/feature/dynamic_layers_test.py)."""

from __future__ import annotations

import pytest
import torch

from qnn_common.config import QuantizeConfig
from qnn_common.errors import ConfigValidationError
from qnn_common.numerics.metrics import cosine
from qnn_common.recipes import Backend, Recipe
from qnn_common.soc import lookup_soc
from qnn_common.target import Target
from qnn_quant.engine import quantize_program
from qnn_quant.layers import ENCODER_LINEARS, module_path, plan_layers, post_sublayer_norms
from qnn_quant.pt2e import float_graph
from qnn_quant.quantized_ops import dynamic_op_count, quantized_op_count


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.down(torch.relu(self.up(x)))
        return out


class _Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.ModuleList([_Block(), _Block()])


class TinyEncoder(torch.nn.Module):
    """Module paths like a BERT's (`encoder.layer.N.*`), and a head outside the blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = _Encoder()
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.encoder.layer:
            x = block(x)
        out: torch.Tensor = self.head(x)
        return out


XNNPACK = Target(Backend.XNNPACK)
QNN = Target(Backend.QNN, lookup_soc("SM8650"))


@pytest.fixture(scope="module")
def exported() -> torch.export.ExportedProgram:
    torch.manual_seed(1126)
    return torch.export.export(TinyEncoder().eval(), (torch.randn(8, 16),), strict=False)


def _linears(gm: torch.fx.GraphModule, names: frozenset[str]) -> int:
    return sum(1 for n in gm.graph.nodes if n.name in names and "linear" in str(n.target))


def test_defaults_make_encoder_linears_dynamic_on_xnnpack_only(
    exported: torch.export.ExportedProgram,
) -> None:
    gm = float_graph(exported)
    plan = plan_layers(gm, XNNPACK, Recipe.A8W8)
    assert _linears(gm, plan.dynamic_nodes) == 4  # the blocks' up / down, not the head
    assert plan.dynamic_nodes.isdisjoint(plan.float_nodes)
    qnn = plan_layers(gm, QNN, Recipe.A8W8)
    assert qnn.dynamic_nodes == frozenset()
    assert qnn.float_nodes == frozenset()  # the HTP runs the program whole
    assert plan_layers(gm, QNN, Recipe.A16W8) == plan_layers(gm, XNNPACK, Recipe.A16W8)


def test_explicit_keep_float_wins_over_dynamic(exported: torch.export.ExportedProgram) -> None:
    gm = float_graph(exported)
    plan = plan_layers(gm, XNNPACK, Recipe.A8W8, keep_float=[r"\.down$"])
    assert _linears(gm, plan.dynamic_nodes) == 2
    assert _linears(gm, plan.float_nodes) == 2
    assert plan_layers(gm, XNNPACK, Recipe.A8W8, dynamic_layers=()).dynamic_nodes == frozenset()


def test_a_float_linear_is_refused_on_qnn_before_any_work(
    exported: torch.export.ExportedProgram,
) -> None:
    gm = float_graph(exported)
    with pytest.raises(ConfigValidationError, match=r"encoder\.layer\.0\.down.*16a8w"):
        plan_layers(gm, QNN, Recipe.A8W8, keep_float=[r"\.down$"])
    # A float op that is not a linear runs on the CPU beside the HTP graph: allowed.
    kept = plan_layers(gm, QNN, Recipe.A8W8, keep_float=[r"encoder\.layer\.\d+$"])
    assert kept.float_nodes and _linears(gm, kept.float_nodes) == 0


def test_dynamic_layers_are_refused_on_qnn_with_the_reason(
    exported: torch.export.ExportedProgram,
) -> None:
    with pytest.raises(ConfigValidationError, match="no run-time \\(dynamic\\) quantization"):
        QuantizeConfig(backend=Backend.QNN, soc="SM8650", recipe=Recipe.A8W8,
                       dynamic_layers=ENCODER_LINEARS)
    with pytest.raises(ConfigValidationError, match="dynamic_layers"):
        plan_layers(float_graph(exported), QNN, Recipe.A8W8, dynamic_layers=ENCODER_LINEARS)
    with pytest.raises(ConfigValidationError, match="not a regular expression"):
        QuantizeConfig(dynamic_layers=("(unclosed",))
    assert QuantizeConfig(backend=Backend.QNN, soc="SM8650", dynamic_layers=()).dynamic_layers == ()


def test_real_pt2e_flow_quantizes_encoder_linears_dynamically(
    exported: torch.export.ExportedProgram,
) -> None:
    calibration = [(torch.randn(8, 16),) for _ in range(8)]
    quantized = quantize_program(exported, target=XNNPACK, recipe=Recipe.A8W8,
                                 calibration=calibration, progress=False)
    gm = quantized.graph_module
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count("quantized_decomposed.choose_qparams.tensor") == 4
    assert dynamic_op_count(gm) == 4
    # The four dynamic linears; static: the head and the blocks' adds (no BERT residual names).
    assert quantized_op_count(gm) == 7
    static = quantize_program(exported, target=XNNPACK, recipe=Recipe.A8W8,
                              calibration=calibration, progress=False, dynamic_layers=())
    assert dynamic_op_count(static.graph_module) == 0
    x = torch.randn(8, 16)
    with torch.no_grad():
        ref = exported.module()(x)
        assert cosine(ref.numpy(), quantized.module()(x).numpy()) > 0.99


class TinyRMSNorm(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        return out


class SandwichBlock(torch.nn.Module):
    """A pre-norm before the MLP and a post-norm after it, before the residual add (GLM-4's
    and Gemma 2's shape), then a final norm before the head."""

    def __init__(self) -> None:
        super().__init__()
        self.pre_norm = TinyRMSNorm(16)
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16)
        self.post_norm = TinyRMSNorm(16)
        self.final_norm = TinyRMSNorm(16)
        self.head = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.post_norm(self.down(torch.relu(self.up(self.pre_norm(x)))))
        out: torch.Tensor = self.head(self.final_norm(h))
        return out


def test_a_post_sublayer_norm_stays_float_at_8_bit_activations_where_the_backend_allows() -> None:
    ep = torch.export.export(SandwichBlock().eval(), (torch.randn(1, 4, 16),))
    gm = float_graph(ep)
    post = post_sublayer_norms(gm)
    paths = {module_path(n) for n in gm.graph.nodes if n.name in post}
    assert paths == {"post_norm"}  # not the norms that feed linears
    xnnpack = plan_layers(gm, XNNPACK, Recipe.A8W8)
    assert post <= xnnpack.float_nodes
    # Named by the caller, keep_float replaces the defaults; QNN keeps no float island.
    assert not post & plan_layers(gm, XNNPACK, Recipe.A8W8, keep_float=[r"^up$"]).float_nodes
    assert not post & plan_layers(gm, QNN, Recipe.A16W8).float_nodes
    # Quantized for real: the post-norm's ops are not rounded (its output still is, where the
    # residual add takes it), so it has fewer quantize ops than with nothing left float.
    calibration = [(torch.randn(1, 4, 16),) for _ in range(4)]

    def quantize_ops(keep_float: tuple[str, ...] | None = None) -> int:
        program = quantize_program(ep, target=XNNPACK, recipe=Recipe.A8W8,
                                   calibration=calibration, progress=False,
                                   keep_float=keep_float)
        return sum(1 for n in program.graph.nodes if "quantize_per_tensor" in str(n.target)
                   and "dequantize" not in str(n.target))

    assert 0 < quantize_ops() < quantize_ops(keep_float=())
