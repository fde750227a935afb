"""The attention sink of a program whose KV cache the host keeps: the first token, in float.

A decoder's first token is where its residual stream grows activations hundreds of times larger
than any other token's (SmolLM2-135M: about 25,000 from layer 12 on, where other tokens stay
under 700), which every later token's attention reads as a fixed "sink". Quantized with one
scale per tensor, the residual stream's 16-bit grid must span that value, so every other
token's residual rounds about 35x more coarsely than it needs to.

The sink's keys and values depend on nothing but its token, so they are computed once, here, by
the float program, and the host puts them in the cache's first slot
(`qnn_common.causal_lm.steps.KvIoCache`).
The exported methods then only ever compute tokens after it: calibration never sees the
outsized values and the ranges it sets are those of ordinary tokens. The token is the
tokenizer's BOS, which an instruct model's chat template opens every conversation with (for
SmolLM2 ``<|im_start|>``), so a chat prompt runs exactly as the float model runs it; plain text
runs as if that BOS preceded it, as the fp32 reference then computes it too (`eager_logits`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from qnn_common.causal_lm.steps import KvIoCache
from qnn_common.llm_spec import PREFILL, LlmSpec
from qnn_prepare.causal_lm.export import CausalLm


def sink_token(lm: CausalLm) -> int | None:
    """The token the sink holds: the tokenizer's BOS, if it has one inside the vocabulary."""
    token = getattr(lm.tokenizer, "bos_token_id", None) if lm.tokenizer is not None else None
    if isinstance(token, int) and 0 <= token < lm.spec.vocab_size:
        return token
    return None


def sink_table(
    programs: Mapping[str, torch.export.ExportedProgram], spec: LlmSpec,
    rope: tuple[torch.Tensor, torch.Tensor],
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (key, value) of the sink token at position 0, [1, kv_heads, 1, head_dim],
    as the float prefill method writes them (what the program itself would have computed)."""
    assert spec.sink_token_id is not None and spec.kv_layout is not None
    cache = KvIoCache(dataclasses.replace(spec, sink_token_id=None), spec.kv_layout, rope)
    prefill = programs[PREFILL].module()
    window = torch.full((1, spec.prefill_len), spec.pad_token_id, dtype=torch.int64)
    window[0, 0] = spec.sink_token_id
    with torch.no_grad():
        # Causal: the padding after the sink cannot change position 0's entries.
        cache.step(lambda _, inputs: prefill(*inputs), PREFILL)(
            window, torch.arange(spec.prefill_len)
        )
    return [
        (k[:, :, :1].clone(), v[:, :, :1].clone())
        for k, v in zip(cache.keys, cache.values, strict=True)
    ]

