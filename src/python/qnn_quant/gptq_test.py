"""GPTQ weight rounding: the algorithm alone, and through the real PT2E flow for the HTP."""

from __future__ import annotations

import pytest
import torch
from torch.export import ExportedProgram

from qnn_common.config import QuantizeConfig
from qnn_common.errors import ConfigValidationError
from qnn_common.recipes import Backend, Recipe, WeightRounding
from qnn_common.soc import lookup_soc
from qnn_common.target import Target
from qnn_quant.engine import quantize_one
from qnn_quant.gptq import GptqResult, gptq, round_weights
from qnn_testing.rounding import each_rounding, held_out_sqnr, low_rank_batches

HTP = Target(Backend.QNN, lookup_soc("SM8650"))


def _output_error(weight: torch.Tensor, rounded: torch.Tensor, hessian: torch.Tensor) -> float:
    d = (weight - rounded).double()
    return float(((d @ hessian.double()) * d).sum())


def test_gptq_stays_on_the_grid_and_moves_outputs_less_than_nearest() -> None:
    torch.manual_seed(1126)
    weight = torch.randn(24, 48)
    # Correlated inputs, as a layer's activations are: where GPTQ has error to redistribute.
    inputs = torch.randn(512, 8) @ torch.randn(8, 48) + 0.1 * torch.randn(512, 48)
    hessian = inputs.T @ inputs / len(inputs)
    scale = weight.abs().amax(dim=1, keepdim=True) / 7
    rounded = gptq(weight, hessian, scale, 7)
    levels = rounded / scale
    assert torch.allclose(levels, levels.round(), atol=1e-4) and levels.abs().max() <= 7 + 1e-4
    nearest = torch.clamp(torch.round(weight / scale), -7, 7) * scale
    ours, theirs = (_output_error(weight, r, hessian) for r in (rounded, nearest))
    assert ours < 0.5 * theirs, (ours, theirs)


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc2(torch.relu(self.fc1(x)))
        return out


def _weights(program: ExportedProgram) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(integer weights, per-channel scales) of each 4-bit dequantize_per_channel, in order."""
    sig = program.graph_signature
    names = {**sig.inputs_to_parameters, **sig.inputs_to_buffers}
    values = {**program.state_dict, **program.constants}
    out = []
    for node in program.graph.nodes:
        if "dequantize_per_channel" in str(node.target) and node.args[5] == 7:
            weight, scale = (values[names[a.name]] for a in node.args[:2])
            out.append((weight, scale))
    return out


def test_gptq_through_pt2e_keeps_its_scales_and_beats_nearest() -> None:
    samples = low_rank_batches()
    fp32 = torch.export.export(_Mlp().eval(), samples[0], strict=False)
    # The caller's weights are kept (GPTQ once rounded them in place, and the reference with them).
    programs, results = each_rounding(fp32, lambda rounding: quantize_one(
        fp32, QuantizeConfig(backend=Backend.QNN, soc="SM8650", recipe=Recipe.A16W4,
                             weight_rounding=rounding), samples[:8], progress=False))
    result = results[WeightRounding.GPTQ]
    assert isinstance(result, GptqResult) and results[WeightRounding.NEAREST] is None
    assert sorted(result.scales) == ["fc1.weight", "fc2.weight"] and result.mean_gain_db > 1
    # The program holds GPTQ's integers on GPTQ's scales (the observers were pinned) ...
    ours = _weights(programs[WeightRounding.GPTQ])
    nearest = _weights(programs[WeightRounding.NEAREST])
    for (weight, scale), (nearest_weight, _), name in zip(ours, nearest, ("fc1", "fc2"),
                                                          strict=True):
        assert torch.allclose(scale.float(), result.scales[f"{name}.weight"], rtol=1e-6)
        assert weight.dtype == torch.int8 and int(weight.abs().max()) <= 7
        assert not torch.equal(weight, nearest_weight)
    # ... and its outputs are closer to fp32 on held-out inputs of the same distribution.
    sqnr = held_out_sqnr(fp32, programs, samples[8:])
    assert sqnr[WeightRounding.GPTQ] > sqnr[WeightRounding.NEAREST] + 1, sqnr


def test_default_rounding_and_refusals() -> None:
    assert QuantizeConfig(backend=Backend.QNN, soc="SM8650", recipe=Recipe.A16W4).rounding \
        is WeightRounding.GPTQ
    assert QuantizeConfig(recipe=Recipe.A8W8).rounding is WeightRounding.NEAREST
    assert QuantizeConfig(backend=Backend.QNN, soc="SM8650", recipe=Recipe.A16W4,
                          per_channel=False).rounding is WeightRounding.NEAREST
    # Strings on purpose, as a TOML file or the CLI passes them: the config parses them.
    explicit = QuantizeConfig(recipe=Recipe.A8W8, weight_rounding="gptq")  # type: ignore[arg-type]
    assert explicit.rounding is WeightRounding.GPTQ
    assert QuantizeConfig(backend=Backend.QNN, soc="SM8650", recipe=Recipe.A16W4_BLOCK).rounding \
        is WeightRounding.GPTQ  # onto LPBQ's block scales (qnn_quant.quantizers.lpbq_gptq)
    with pytest.raises(ConfigValidationError, match="8da4w takes none"):
        QuantizeConfig(recipe=Recipe.A8DW4, weight_rounding=WeightRounding.GPTQ)
    with pytest.raises(ConfigValidationError, match="per_channel"):
        QuantizeConfig(recipe=Recipe.A8W8, per_channel=False, weight_rounding=WeightRounding.GPTQ)
    with pytest.raises(ConfigValidationError, match="nearest, gptq|allowed"):
        # An unknown string, as a typo in a TOML file would give: refused with the choices.
        QuantizeConfig(recipe=Recipe.A8W8, weight_rounding="adaround")  # type: ignore[arg-type]


def test_one_pass_hessians_round_the_first_layer_alike_and_still_beat_nearest() -> None:
    samples = [x for (x,) in low_rank_batches(count=8)]
    rounded, results = {}, {}
    for sequential in (True, False):
        torch.manual_seed(7)  # the same float weights each time
        gm = torch.export.export(_Mlp().eval(), (samples[0],), strict=False).module()

        def calibrate(gm: torch.fx.GraphModule = gm) -> None:
            with torch.no_grad():
                for x in samples:
                    gm(x)

        results[sequential] = round_weights(
            {"forward": gm}, calibrate, bits=4, sequential=sequential
        )
        rounded[sequential] = {n: p.detach().clone() for n, p in gm.named_parameters()}
    assert results[True].calibration_passes == 2 and results[False].calibration_passes == 1
    # fc1 reads the program's input, so its Hessian is the same either way (fc2's comes from the
    # float fc1's outputs in one pass, from the rounded one's sequentially).
    assert torch.equal(rounded[True]["fc1.weight"], rounded[False]["fc1.weight"])
    assert sorted(results[False].scales) == ["fc1.weight", "fc2.weight"]
    assert results[False].mean_gain_db > 1
