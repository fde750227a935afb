"""A decoder's KV cache and attention as ExecuTorch's LLM custom ops, for the CPU backends.

What ExecuTorch's own Llama export does for XNNPACK (`--use_sdpa_with_kv_cache`, and
optimum-executorch's `custom_sdpa` + `custom_kv_cache`): the cache is written by
`llama::update_cache` in place and read by `llama::custom_sdpa`, ExecuTorch's fused CPU attention
(causal from a start position, grouped-query heads read as they are, float32). Exported with
transformers' own static cache instead, each layer writes its cache with `index_put`, repeats the
mask over the query groups and masks with `where`: ops no delegate takes, so every layer's
graph splits into several XNNPACK partitions with portable kernels between them, each token
pays for all of them, and the compile pays per partition.

The cache holds ``[batch, max_seq_len, kv_heads, head_dim]`` (the ops' layout: position before
heads), float32 whatever the model's dtype (the ops compute in float32). The start position is
the first of the call's positions, read once per call (`cache_position[0]`) and handed to every
layer through transformers' attention keyword arguments: the methods are called with
consecutive positions, as `qnn_common.causal_lm.steps` does.

The program then needs the ops' kernels: ExecuTorch's pip package registers them when
`executorch.extension.llm.custom_ops.custom_ops` is imported (`qnn_common.torchio.programs`
does before
loading any program, `qnn_infer` before running one); a device runtime links `custom_ops`, as
ExecuTorch's LLM runner does. QNN keeps its cache as inputs and outputs (`kv_io`) instead.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn

from qnn_common.llm_spec import LLM_CUSTOM_OPS_MODULE

NAME = "executorch_custom_sdpa"
# torch._check carries no annotations in torch itself.
_check = cast(Callable[[object], None], torch._check)


def load_ops() -> None:
    """Register the `llama` ops with torch (and their kernels with ExecuTorch's runtime)."""
    importlib.import_module(LLM_CUSTOM_OPS_MODULE)


START = "cache_start"  # the keyword argument the start position travels by


def _start(kwargs: dict[str, Any] | None) -> Any:
    start = (kwargs or {}).get(START)
    if start is None:
        raise ValueError(f"{NAME} runs inside CustomOpCacheLm, which hands it `{START}`")
    return start


class CustomOpCache:
    """The cache transformers' attention layers are handed (duck-typed: with this attention
    registered without a mask function, transformers builds no mask and asks nothing else)."""

    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.layers = layers
        self.is_compileable = False

    def update(
        self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *_: Any,
        kwargs: dict[str, Any] | None = None, **__: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write `keys` / `values` [b, kv_heads, n, d] at the call's positions; the whole cache."""
        start = _start(kwargs)
        k_cache, v_cache = self.layers[layer_idx]
        torch.ops.llama.update_cache(keys.transpose(1, 2).float(), k_cache, start)
        torch.ops.llama.update_cache(values.transpose(1, 2).float(), v_cache, start)
        return k_cache, v_cache


def custom_op_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention of `query` [b, heads, n, d] over the whole cache `key` / `value`
    [b, max_seq_len, kv_heads, d] (from `CustomOpCache.update`): [b, n, heads, d], as
    transformers' attention functions return."""
    start = _start(kwargs)
    out = torch.ops.llama.custom_sdpa(
        query.transpose(1, 2).float(), key, value, start, None, 0.0, True, scaling
    )
    return out.to(query.dtype), None


def register() -> None:
    """Make the attention known to transformers (idempotent). No mask function: the op is
    causal from its start position, so transformers skips building a mask."""
    from transformers import AttentionInterface

    load_ops()
    AttentionInterface.register(NAME, custom_op_attention)


class CustomOpCacheLm(nn.Module):
    """`(input_ids [1, n], cache_position [n]) -> logits [1, n, vocab]`, the cache in buffers
    ``key_cache_<i>`` / ``value_cache_<i>`` written by `llama::update_cache`.

    The model must attend with `custom_op_attention` (``config._attn_implementation = NAME``)
    while it runs through this module."""

    def __init__(self, hf: nn.Module, max_seq_len: int) -> None:
        super().__init__()
        config: Any = hf.config
        text = config.get_text_config()
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        shape = (1, max_seq_len, text.num_key_value_heads, head_dim)
        self.hf = hf
        self.max_seq_len = max_seq_len
        self.layers = int(text.num_hidden_layers)
        for i in range(self.layers):
            self.register_buffer(f"key_cache_{i}", torch.zeros(shape), persistent=False)
            self.register_buffer(f"value_cache_{i}", torch.zeros(shape), persistent=False)

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        cache = CustomOpCache(
            [
                (getattr(self, f"key_cache_{i}"), getattr(self, f"value_cache_{i}"))
                for i in range(self.layers)
            ]
        )
        start = cache_position[0].item()
        _check(start >= 0)  # export's bounds on the start: the ops index the cache with it
        _check(start + input_ids.shape[1] <= self.max_seq_len)
        out: Any = self.hf(
            input_ids=input_ids, position_ids=cache_position[None], cache=cache, use_cache=True,
            **{START: start},
        )
        logits: torch.Tensor = out.logits
        return logits
