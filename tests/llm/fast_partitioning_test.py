"""A decoder lowered for XNNPACK with our partitioning (qnn_compile.partition_merge and
qnn_compile.partition_recompile) and with ExecuTorch's own: the same .pte bytes."""

from __future__ import annotations

import torch

from qnn_common.config import CompileConfig
from qnn_common.recipes import Backend, Recipe
from qnn_common.target import Target
from qnn_compile.backends import lowering_for
from qnn_compile.lower import lower_program
from qnn_prepare.causal_lm import export_methods, load_causal_lm, text_sequences
from qnn_quant.methods import quantize_causal_lm


def _quantized_decoder() -> dict[str, torch.export.ExportedProgram]:
    """tiny-llama's prefill and decode over a KV cache, 8a8w for XNNPACK: graphs the XNNPACK
    partitioner splits into many partitions (cache writes and rotary ops stay outside)."""
    lm = load_causal_lm("tiny-llama", max_seq_len=32, prefill_len=8)
    quantized, _ = quantize_causal_lm(
        export_methods(lm), target=Target(Backend.XNNPACK), recipe=Recipe.A8W8, spec=lm.spec,
        calibration=text_sequences(lm, 2, 16), progress=False,
    )
    return quantized


def test_fast_partitioning_lowers_a_decoder_to_the_same_pte() -> None:
    # The decode method alone: the same partitioning as prefill's, at half the cost (the stock
    # path is slow by design; bench/compile_bench.py compares whole models).
    programs = {"decode": _quantized_decoder()["decode"]}
    lowering = lowering_for(CompileConfig(backend=Backend.XNNPACK, recipe=Recipe.A8W8))
    stock = lower_program(programs, lowering, fast_partitioning=False)
    ours = lower_program(programs, lowering)
    assert stock.partitions > 2  # the merge had work to do
    assert ours.pte == stock.pte
