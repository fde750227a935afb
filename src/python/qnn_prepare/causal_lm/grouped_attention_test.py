"""Grouped-query attention without repeating the cache: the same values as transformers' own
attention, and an export with no copy of the cache per query head."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from qnn_prepare.causal_lm.grouped_attention import grouped_attention, uses_plain_attention


class _Heads(nn.Module):
    num_key_value_groups = 3
    training = False


def _reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               mask: torch.Tensor) -> torch.Tensor:
    from transformers.models.llama.modeling_llama import eager_attention_forward

    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    out: torch.Tensor = eager_attention_forward(
        _Heads(), query, key, value, additive, scaling=0.125
    )[0]
    return out


@pytest.mark.parametrize("t", [1, 5])  # decode, a prefill chunk
def test_equals_transformers_eager_attention_with_repeated_kv(t: int) -> None:
    gen = torch.Generator().manual_seed(1126)
    heads, kv_heads, s, d = 6, 2, 12, 16
    query = torch.randn(1, heads, t, d, generator=gen)
    key = torch.randn(1, kv_heads, s, d, generator=gen)
    value = torch.randn(1, kv_heads, s, d, generator=gen)
    # A static cache: the first positions filled, causal within the chunk.
    filled = 4
    positions = torch.arange(s)[None, :]
    mask = (positions <= filled + torch.arange(t)[:, None])[None, None]
    out, weights = grouped_attention(_Heads(), query, key, value, mask, scaling=0.125)
    assert weights is None and out.shape == (1, t, heads, d)
    torch.testing.assert_close(out, _reference(query, key, value, mask), rtol=1e-6, atol=1e-6)


def test_refuses_to_run_without_a_boolean_mask() -> None:
    q, kv = torch.zeros(1, 2, 1, 4), torch.zeros(1, 1, 3, 4)
    with pytest.raises(ValueError, match="boolean attention mask"):
        grouped_attention(_Heads(), q, kv, kv, None, scaling=1.0)


def test_exported_decode_has_no_copy_of_the_cache() -> None:
    """tiny-llama (4 query heads, 2 KV heads) exported as the pipeline does: no 5-D expand of
    the cache (transformers' repeat_kv), and the family is one this attention computes."""
    from qnn_prepare.causal_lm.export import export_methods, load_causal_lm

    lm = load_causal_lm("tiny-llama", max_seq_len=32, prefill_len=8)
    assert uses_plain_attention(lm.hf)
    config: Any = lm.hf.config
    before = config._attn_implementation
    programs = export_methods(lm)
    assert config._attn_implementation == before  # the eager references keep their own
    for program in programs.values():
        expands = [n for n in program.graph.nodes
                   if n.op == "call_function" and "expand" in str(n.target)
                   and len(n.meta["val"].shape) == 5]
        assert expands == []
