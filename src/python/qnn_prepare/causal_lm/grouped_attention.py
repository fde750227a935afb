"""Grouped-query attention without copying the KV cache once per query head.

Transformers' attention for a model with fewer key / value heads than query heads (Llama 3,
SmolLM2, Qwen2, Mistral: grouped-query attention) first repeats each cached key and value head
for every query head of its group (`repeat_kv`: unsqueeze + expand + reshape), then multiplies.
Exported, that repeat is an `expand_copy` of the whole static cache per layer and per call,
which no backend delegate takes: SmolLM2 at a context of 256 copies 2 x 9 x 256 x 64 floats per
layer, for every generated token, on the portable kernels.

`grouped_attention` computes the same thing with the group folded into the query rows instead:
queries [b, kv_heads * groups, t, d] are viewed as [b, kv_heads, groups * t, d] (the heads of one
group are consecutive, as `repeat_kv` assumes), multiplied with the cache as it is, masked
(the boolean mask repeated over the group's rows), softmax in float32, and viewed back. Only
views and the matmuls the model has anyway; the softmax sees the same scores.

The mask is transformers' SDPA one, boolean (True: attend), applied with `where`: an additive
float mask (eager's) would be an `add` with values near the float minimum, which static
quantizers annotate, and its int8 range then swallows the scores (tiny-llama 8a8w: argmax
agreement 0.81 -> 0.38).

It is registered with transformers as the attention implementation ``"qnn_grouped"`` and used
for the static-cache export of decoders whose attention is the plain scaled dot product
(`uses_plain_attention`); anything else keeps transformers' own.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

NAME = "qnn_grouped"

# Decoder families whose attention function is transformers' `eager_attention_forward` (scaled
# dot product, additive mask, float32 softmax; no soft-capping, attention sinks or extra terms).
_PLAIN_ATTENTION = frozenset({"llama", "mistral", "qwen2", "qwen3", "phi3"})


def grouped_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Scaled dot-product attention of `query` [b, h, t, d] over `key` / `value` [b, kv, s, d]
    (h a multiple of kv) with a boolean `attention_mask` [b, 1, t, s] (True: attend): the
    output [b, t, h, d] transformers' attention returns, and no attention weights."""
    if attention_mask is None or attention_mask.dtype != torch.bool:
        # transformers leaves the mask out when SDPA's own causal flag would do; a static
        # cache always has one. Computing without one would attend to the future.
        raise ValueError(
            f"{NAME} needs transformers' boolean attention mask, got "
            f"{None if attention_mask is None else attention_mask.dtype}"
        )
    b, heads, t, d = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    q = query.reshape(b, kv_heads, groups * t, d)
    scores = torch.matmul(q, key.transpose(2, 3)) * scaling
    mask = attention_mask[:, :, :, : key.shape[-2]]
    if groups > 1:
        mask = mask.repeat(1, 1, groups, 1)
    # The float minimum, not -inf: a row with nothing to attend to gets even weights, not NaN.
    scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)
    weights = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(weights, value).reshape(b, heads, t, d)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Make ``"qnn_grouped"`` an attention implementation transformers knows (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, grouped_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def uses_plain_attention(hf: nn.Module) -> bool:
    """Whether the model's attention is the plain scaled dot product this module computes."""
    config: Any = getattr(hf, "config", None)
    if config is None:
        return False
    text = config.get_text_config()
    return (
        getattr(text, "model_type", None) in _PLAIN_ATTENTION
        and getattr(text, "attn_logit_softcapping", None) is None
    )
