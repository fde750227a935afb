"""Prefill and decode quantized with one set of scales (the engine with a causal LM's
calibration, `share_observers`)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn

from qnn_common.config import QuantizeConfig
from qnn_common.errors import StageError
from qnn_common.llm_spec import DECODE, PREFILL, LlmSpec
from qnn_common.recipes import Backend, Recipe
from qnn_common.soc import lookup_soc
from qnn_common.target import Target
from qnn_quant.calibration import causal_lm_calibration
from qnn_quant.engine import quantize_methods
from qnn_quant.fused_qdq import reference_module
from qnn_quant.layers import plan_layers
from qnn_quant.method_modules import module_runner
from qnn_quant.pt2e import float_graph, prepare_program
from qnn_quant.shared_scales import share_observers

HTP = Target(Backend.QNN, lookup_soc("SM8650"))
VOCAB, HIDDEN, PREFILL_LEN = 64, 16, 4
SPEC = LlmSpec(max_seq_len=16, prefill_len=PREFILL_LEN, vocab_size=VOCAB)


class TiedLm(nn.Module):
    """Embedding -> norm -> LM head sharing the embedding's weight, as SmolLM2 and most small
    LLMs do; per token, so prefill and decode compute the same logits for the same token."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.norm = nn.LayerNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.norm(self.embed(input_ids)))
        return out


def _programs() -> dict[str, torch.export.ExportedProgram]:
    module = TiedLm().eval()
    return {
        method: torch.export.export(module, (), {
            "input_ids": torch.zeros(1, n, dtype=torch.int64),
            "cache_position": torch.arange(n),
        }, strict=False)
        for method, n in ((PREFILL, PREFILL_LEN), (DECODE, 1))
    }


def _weight_scales(program: torch.export.ExportedProgram) -> list[torch.Tensor]:
    """The per-channel weight scales of a converted program (the LM head's), in graph order."""
    gm = program.module()
    scales = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and "dequantize_per_channel" in str(node.target):
            scale = node.args[1]
            assert isinstance(scale, torch.fx.Node)
            scales.append(getattr(gm, str(scale.target)).clone())
    return scales


def test_decode_gets_prefills_scales_for_a_tied_lm_head() -> None:
    """Calibration texts of two whole chunks run prefill only (as the causal-LM task's do), so
    decode's every scale comes from sharing. The tied weight has two observers (the embedding's
    per-tensor, the head's per-channel); when they shared one key the head's was never copied,
    decode's LM head was quantized at scale 1 and its logits were noise."""
    calibration = [torch.randint(0, VOCAB, (2 * PREFILL_LEN,), generator=torch.Generator()
                                 .manual_seed(i)) for i in range(4)]
    quantized, _ = quantize_methods(
        _programs(), _htp(Recipe.A16W8), causal_lm_calibration(SPEC, calibration, progress=False),
    )
    prefill_scales, decode_scales = (_weight_scales(quantized[m]) for m in (PREFILL, DECODE))
    assert len(prefill_scales) == len(decode_scales) == 1
    assert prefill_scales[0].shape == (VOCAB,) and bool((prefill_scales[0] < 0.1).all())
    torch.testing.assert_close(decode_scales[0], prefill_scales[0], rtol=0, atol=0)
    # Same scales everywhere: decode computes exactly what prefill computes for each token.
    run = module_runner({m: reference_module(p) for m, p in quantized.items()}, SPEC)
    ids = calibration[0][:PREFILL_LEN]
    prefill = run(PREFILL, (ids[None], torch.arange(PREFILL_LEN)))[0][0]
    for i, token in enumerate(ids.tolist()):
        decode = run(DECODE, (torch.tensor([[token]]), torch.tensor([i])))[0][0, 0]
        torch.testing.assert_close(decode, prefill[i], rtol=0, atol=0)


def test_lpbq_decode_converts_with_prefills_block_scales() -> None:
    """Per-block (LPBQ) observers learn their input's dtype on their first forward, which is
    not state: decode's, filled by sharing, had none, and its conversion failed ("Expecting
    original_dtype to be populated") for every causal LM at 16a4w_block."""
    calibration = [torch.randint(0, VOCAB, (2 * PREFILL_LEN,), generator=torch.Generator()
                                 .manual_seed(i)) for i in range(4)]
    quantized, _ = quantize_methods(
        _programs(), _htp(Recipe.A16W4_BLOCK, block_size=HIDDEN),
        causal_lm_calibration(SPEC, calibration, progress=False),
    )
    blocks = {
        method: [n.args[1] for n in program.graph.nodes
                 if str(n.target) == "torchao.dequantize_affine.default"]
        for method, program in quantized.items()
    }
    # The LM head, in one block, run as a 1x1 convolution (qnn_quant.quantizers.lpbq).
    assert blocks[PREFILL] == blocks[DECODE] == [[1, HIDDEN, 1, 1]]
    run = module_runner({m: reference_module(p) for m, p in quantized.items()}, SPEC)
    ids = calibration[0][:PREFILL_LEN]
    prefill = run(PREFILL, (ids[None], torch.arange(PREFILL_LEN)))[0][0]
    decode = run(DECODE, (ids[None, :1], torch.tensor([0])))[0][0, 0]
    torch.testing.assert_close(decode, prefill[0], rtol=0, atol=0)


def test_sharing_refuses_to_leave_a_decode_observer_without_statistics() -> None:
    """Sharing from a prefill that was never calibrated leaves decode with nothing: refused,
    not converted at default scales."""
    prepared = {}
    for method, program in _programs().items():
        gm = float_graph(program)
        prepared[method] = prepare_program(
            program, target=HTP, recipe=Recipe.A16W8, graph_module=gm,
            plan=plan_layers(gm, HTP, Recipe.A16W8, None, None),
        )
    with pytest.raises(StageError, match="no statistics"):
        share_observers(prepared[PREFILL], prepared[DECODE])


def test_quantizing_consumes_the_float_methods_and_keeps_one_copy_of_the_weights() -> None:
    """The float programs leave the caller's dict and nothing keeps their weights (PT2E's
    memoized device lookup held every prepared module, and with it the float model, for the
    rest of the process); decode's quantized weights are prefill's tensors, not a copy."""
    programs = _programs()
    floats = [weakref.ref(t) for p in programs.values() for t in p.state_dict.values()]
    calibration = [torch.randint(0, VOCAB, (2 * PREFILL_LEN,), generator=torch.Generator()
                                 .manual_seed(i)) for i in range(2)]
    quantized, _ = quantize_methods(
        programs, _htp(Recipe.A16W8), causal_lm_calibration(SPEC, calibration, progress=False),
    )
    assert programs == {}
    gc.collect()
    assert [r for r in floats if r() is not None] == []
    weights = {
        m: {k: v for k, v in p.state_dict.items() if v.dtype == torch.int8}
        for m, p in quantized.items()
    }
    assert weights[PREFILL], "the LM head's int8 weight"
    assert weights[PREFILL].keys() == weights[DECODE].keys()
    for name, tensor in weights[PREFILL].items():
        assert weights[DECODE][name] is tensor, name


def _htp(recipe: Recipe, block_size: int | None = None) -> QuantizeConfig:
    """The config of `recipe` for the HTP (SM8650)."""
    if block_size is None:
        return QuantizeConfig(backend=Backend.QNN, soc="SM8650", recipe=recipe)
    return QuantizeConfig(backend=Backend.QNN, soc="SM8650", recipe=recipe, block_size=block_size)
