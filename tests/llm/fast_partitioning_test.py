"""A decoder lowered for XNNPACK with our partitioning (qnn_compile.partition_merge and
qnn_compile.partition_recompile) and skipping XNNPACK's passes that cannot change a partition
(qnn_compile.xnnpack_passes), and with ExecuTorch's own: the same .pte bytes; the passes skipped
or not on a convolutional model that every one of those passes has work in: the same bytes."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn

from qnn_common.config import CompileConfig, QuantizeConfig
from qnn_common.recipes import Backend, Recipe
from qnn_compile import xnnpack_passes
from qnn_compile.backends import lowering_for
from qnn_compile.lower import lower_program
from qnn_prepare.causal_lm.export import export_methods, load_causal_lm, text_sequences
from qnn_quant.calibration import causal_lm_calibration
from qnn_quant.engine import quantize_methods


def _quantized_decoder() -> dict[str, torch.export.ExportedProgram]:
    """tiny-llama's prefill and decode over a KV cache, 8a8w for XNNPACK: graphs the XNNPACK
    partitioner splits into many partitions (cache writes and rotary ops stay outside)."""
    lm = load_causal_lm("tiny-llama", max_seq_len=32, prefill_len=8)
    quantized, _ = quantize_methods(
        export_methods(lm), QuantizeConfig(backend=Backend.XNNPACK, recipe=Recipe.A8W8),
        causal_lm_calibration(lm.spec, text_sequences(lm, 2, 16), progress=False),
    )
    return quantized


def _counting(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Count, per XNNPACK pass, the partitions each was found to have work in (and so ran on)."""
    ran: Counter[str] = Counter()
    applies = dict(xnnpack_passes.PASS_APPLIES)

    def counted(name: str) -> object:
        def check(present: frozenset[object]) -> bool:
            hit = applies[name](present)
            ran[name] += hit
            return hit

        return check

    monkeypatch.setattr(xnnpack_passes, "PASS_APPLIES", {n: counted(n) for n in applies})
    return ran


# The passes that have work in convolutional models only.
CONVOLUTIONAL = {"FuseBatchNormPass", "DecomposeBatchNorm", "FuseActivationPass",
                 "DecomposeConcatenate", "InsertPadQDQPass", "Conv1dUnsqueezePass",
                 "ConvertToUpsampleBilinear2d"}


def test_fast_partitioning_and_skipped_passes_lower_a_decoder_to_the_same_pte(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ours (partitions merged and recompiled, idle passes skipped) against ExecuTorch's own
    (neither): one comparison for both, the stock lowering being the slow part. The decode
    method alone: the same partitioning as prefill's, at half the cost (bench/compile_bench.py
    compares whole models)."""
    programs = {"decode": _quantized_decoder()["decode"]}
    lowering = lowering_for(CompileConfig(backend=Backend.XNNPACK, recipe=Recipe.A8W8))
    ran = _counting(monkeypatch)
    ours = lower_program(programs, lowering)
    monkeypatch.setattr(xnnpack_passes, "PASS_APPLIES", {})  # every pass runs, as upstream's
    stock = lower_program(programs, lowering, fast_partitioning=False)
    assert stock.partitions > 2  # the merge had work to do
    assert ours.pte == stock.pte and ours.partitions == stock.partitions
    # A decoder's partitions: nothing for the convolutional passes but RoPE's concatenations.
    assert not any(ran[name] for name in CONVOLUTIONAL - {"DecomposeConcatenate"}), ran


class _EveryPass(nn.Module):
    """Batch norm after a convolution and alone, ReLU after a convolution, a 1-d convolution,
    PReLU, padding, bilinear upsampling and a concatenation of many inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.lone_bn = nn.BatchNorm2d(8)
        self.conv1d = nn.Conv1d(8, 8, 3, padding=1)
        self.prelu = nn.PReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))  # [1, 8, 8, 8]
        y = self.lone_bn(y + 1)
        z = self.conv1d(y.flatten(2)).reshape(1, 8, 8, 8)
        z = nn.functional.pad(self.prelu(z), (1, 1, 1, 1))[:, :, 1:-1, 1:-1]
        up = nn.functional.interpolate(z, scale_factor=2.0, mode="bilinear", align_corners=False)
        return torch.cat([up[:, i : i + 1] for i in range(8)], dim=1)


def _every_pass() -> dict[str, torch.export.ExportedProgram]:
    torch.manual_seed(0)
    model = _EveryPass().eval()
    for bn in (model.bn, model.lone_bn):  # statistics that are not the identity
        mean, var = bn.running_mean, bn.running_var
        assert mean is not None and var is not None
        mean.uniform_(-1, 1)
        var.uniform_(0.5, 2)
    return {"forward": torch.export.export(model, (torch.randn(1, 3, 8, 8),))}


def test_skipping_idle_xnnpack_passes_gives_the_same_pte(monkeypatch: pytest.MonkeyPatch) -> None:
    """A convolutional model every one of those passes has work in (the decoder: above)."""
    exported = _every_pass()
    lowering = lowering_for(CompileConfig(backend=Backend.XNNPACK, recipe=Recipe.FP32))
    ran = _counting(monkeypatch)
    ours = lower_program(exported, lowering)
    monkeypatch.setattr(xnnpack_passes, "PASS_APPLIES", {})  # every pass runs, as upstream's
    stock = lower_program(exported, lowering)
    assert ours.pte == stock.pte and ours.partitions == stock.partitions
    assert {name for name, hits in ran.items() if hits} >= CONVOLUTIONAL, ran


def test_a_pass_applies_where_its_ops_or_a_whole_pattern_are() -> None:
    from executorch.backends.xnnpack.partition.graphs import sdpa
    from executorch.exir.dialects._ops import ops as exir_ops

    applies = xnnpack_passes.PASS_APPLIES
    edge = exir_ops.edge.aten
    op_sets = [
        frozenset(n.target for n in pattern.graph.nodes if n.op == "call_function")
        for pattern in sdpa.get_graphs()
    ]
    for ops in op_sets:  # a whole pattern, among other ops
        assert applies["ConvertToSDPAPass"](ops | {edge.relu.default})
    shared = frozenset.intersection(*op_sets)
    assert edge._softmax.default in shared
    every = frozenset().union(*op_sets)
    for op in shared:  # one op short of every pattern
        assert not applies["ConvertToSDPAPass"](every - {op}), op
    assert applies["PReLUReshapePass"](frozenset({edge._prelu_kernel.default}))
    assert not applies["PReLUReshapePass"](frozenset({edge.prelu.default}))  # kept whole: no-op
    assert applies["DecomposeBatchNorm"](
        frozenset({edge._native_batch_norm_legit_no_training.default})
    )
    assert not applies["FuseActivationPass"](frozenset({edge.linear.default, edge.add.Tensor}))
