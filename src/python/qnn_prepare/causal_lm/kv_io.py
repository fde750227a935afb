"""A causal LM whose KV cache lives outside the program: inputs in, new entries out.

For backends without mutable buffers (QNN HTP): each method takes the past cache as inputs and
returns only the keys and values of its own tokens; the host keeps the cache and writes them
back (`qnn_common.causal_lm.steps.KvIoCache`). The rotary position embedding (cos / sin, from a
table the model computes once at export) and the attention mask are inputs too, computed on the
host: transformers' mask building (arange / index / vmap) does not lower to QNN while an additive
4-D mask is a plain add, and positions as integers would need an int -> float cast in the graph,
which QNN's quantized lowering mishandles (qnn_quant.quantizers.qnn); cos / sin in [-1, 1]
quantize well. The past of a method holding n tokens is ``max_seq_len - n`` slots, so both
methods read the same host cache, each a prefix of it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from qnn_common.causal_lm.steps import KvIoCache
from qnn_common.errors import ConfigValidationError
from qnn_common.llm_spec import DECODE, PREFILL, KvLayout
from qnn_prepare.causal_lm.export import CausalLm


class _IoCache:
    """The cache transformers' attention layers see: past entries from the inputs, the new ones
    recorded for the outputs. Duck-typed: with a 4-D mask, mask building never queries it."""

    def __init__(self, past: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.past = past
        self.new: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.is_compileable = False

    def update(
        self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *_: Any, **__: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.new.append((keys, values))
        past_k, past_v = self.past[layer_idx]
        return torch.cat([past_k, keys], dim=2), torch.cat([past_v, values], dim=2)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self.past[layer_idx][0].shape[2])


class _GivenRope(nn.Module):
    """Stands in for a model's rotary embedding: returns the (cos, sin) the wrapper was given.

    A model whose layers rotate by kind (Gemma 3: local layers at one base, global ones at
    another; its rotary embedding takes the `layer_type`) gets one table per kind, side by side
    on the last axis in `layer_types` order (`rope_table`), and each call returns its kind's."""

    def __init__(self, layer_types: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.layer_types = layer_types
        self.value: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None
    ) -> tuple[torch.Tensor, ...]:
        assert self.value is not None, "KvIoLm sets the rotary embedding before each call"
        if layer_type is None:
            return self.value
        i, kinds = self.layer_types.index(layer_type), len(self.layer_types)
        return tuple(t.chunk(kinds, dim=-1)[i] for t in self.value)


class KvIoLm(nn.Module):
    """(input_ids, cos, sin, mask, k_0, v_0, k_1, ...) -> (logits, new_k_0, new_v_0, ...)."""

    def __init__(self, hf: nn.Module, layout: KvLayout) -> None:
        super().__init__()
        self.hf = hf
        self.layout = layout
        self.rope = _GivenRope(rotary_layer_types(hf))
        # Whether its attention masks go by layer kind (Gemma 2 / 3), read once, not per call.
        self.by_kind = bool(getattr(_text_config(hf), "layer_types", None))

    def forward(
        self,
        input_ids: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attention_mask: torch.Tensor,
        *cache: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        past = [(cache[2 * i], cache[2 * i + 1]) for i in range(self.layout.layers)]
        io = _IoCache(past)
        self.rope.value = (cos, sin)
        n = input_ids.shape[1]
        masks: Any = attention_mask
        if self.layout.sliding_window is not None:
            # The host's two masks (KvIoCache.inputs): every layer's causal one, then the local
            # layers'. A model with layer kinds takes them by kind; one without (Mistral-style)
            # has local layers only.
            full, local = attention_mask[:, :1], attention_mask[:, 1:2]
            masks = {"full_attention": full, "sliding_attention": local} if self.by_kind else local
        with _rotary_replaced(self.hf, self.rope):
            logits: torch.Tensor = self.hf(
                input_ids=input_ids, attention_mask=masks, past_key_values=io,
                # Unused (the rotary embedding is given); keeps the model off its cache lookup.
                position_ids=torch.zeros(1, n, dtype=torch.int64), use_cache=True,
            ).logits
        return (logits, *(t for kv in io.new for t in kv))


def _text_config(hf: nn.Module) -> Any:
    """The text part of `hf`'s config (a multimodal model's decoder has its own)."""
    # `hf` is a PreTrainedModel, typed here as the nn.Module the wrappers take.
    return hf.config.get_text_config()  # type: ignore[union-attr, operator]


def _rotary_owner(hf: nn.Module) -> nn.Module:
    """The module holding the model's `rotary_emb` (one per model in transformers' decoders)."""
    owners: list[nn.Module] = [
        m for _, m in hf.named_modules() if isinstance(getattr(m, "rotary_emb", None), nn.Module)
    ]
    if len(owners) != 1:
        raise ConfigValidationError(
            "prepare.kv_io", type(hf).__name__,
            "the KV-as-inputs export needs a decoder with one rotary position embedding "
            f"(found {len(owners)}); export for a backend with mutable buffers (xnnpack) instead",
        )
    return owners[0]


@contextlib.contextmanager
def _rotary_replaced(hf: nn.Module, rope: nn.Module) -> Iterator[None]:
    owner = _rotary_owner(hf)
    original = owner.rotary_emb
    owner.rotary_emb = rope
    try:
        yield
    finally:
        owner.rotary_emb = original


# transformers' RMSNorms whose forward is exactly `weight * x * rsqrt(mean(x^2) + eps)` in fp32
# (Gemma's `1 + weight` is not, and is not listed).
_PLAIN_RMS_NORMS = frozenset(
    {"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "Phi3RMSNorm"}
)


class _RmsNorm(nn.Module):
    """One `aten.rms_norm` in the exported graph instead of transformers' pow / mean / add /
    rsqrt / mul chain: QNN lowers it to the HTP's RmsNorm op (upstream's static Llama uses
    `torch.nn.RMSNorm` for this), whose statistics stay inside the op instead of passing through
    per-tensor 16-bit intermediates, and a quantized program has five fewer ops per norm to
    observe, quantize and build. Casts only what is not float32 already: a no-op cast exports
    as an op of its own, which the quantizer would observe too."""

    def __init__(self, weight: nn.Parameter, eps: float) -> None:
        super().__init__()
        self.weight = weight
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x if dtype == torch.float32 else x.float()
        weight = self.weight if self.weight.dtype == torch.float32 else self.weight.float()
        out = nn.functional.rms_norm(x32, (x.shape[-1],), weight, self.eps)
        return out if dtype == torch.float32 else out.to(dtype)


@contextlib.contextmanager
def _fused_rms_norms(hf: nn.Module) -> Iterator[int]:
    """Swap every plain RMSNorm of `hf` for `_RmsNorm` (same weight, same path) while exporting;
    yields how many were swapped."""
    swapped: list[tuple[nn.Module, str, nn.Module]] = []
    for _, module in list(hf.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child).__name__ in _PLAIN_RMS_NORMS:
                eps = float(getattr(child, "variance_epsilon", getattr(child, "eps", 1e-6)))
                swapped.append((module, child_name, child))
                setattr(module, child_name, _RmsNorm(child.weight, eps))
    try:
        yield len(swapped)
    finally:
        for module, child_name, child in swapped:
            setattr(module, child_name, child)


def rotary_layer_types(hf: nn.Module) -> tuple[str, ...]:
    """The layer kinds the model's rotary embedding keeps a table for (Gemma 3's local and
    global layers), in its order; () for one table."""
    rotary = _rotary_owner(hf).get_submodule("rotary_emb")
    return tuple(getattr(rotary, "layer_types", None) or ())


def rope_table(lm: CausalLm) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's own (cos, sin) for every position of the context: [1, max_seq_len, dim], or
    [1, max_seq_len, kinds * dim] for a model with a table per layer kind (`_GivenRope`): the
    host slices positions alike either way."""
    rotary = _rotary_owner(lm.hf).get_submodule("rotary_emb")
    positions = torch.arange(lm.spec.max_seq_len)[None]
    x = torch.zeros(1, dtype=torch.float32)
    with torch.no_grad():
        tables = [rotary(x, position_ids=positions, layer_type=kind)
                  for kind in rotary_layer_types(lm.hf)] or [rotary(x, position_ids=positions)]
    cos = torch.cat([c for c, _ in tables], dim=-1)
    sin = torch.cat([s for _, s in tables], dim=-1)
    return cos.float().contiguous(), sin.float().contiguous()


def kv_layout(lm: CausalLm) -> KvLayout:
    """Layers, KV heads and head size of `lm`, read from its config."""
    config = _text_config(lm.hf)
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    return KvLayout(
        layers=int(config.num_hidden_layers),
        kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        head_dim=head_dim,
        sliding_window=sliding_window_below_context(lm),
    )


def example_inputs(
    lm: CausalLm, layout: KvLayout, rope: tuple[torch.Tensor, torch.Tensor], n: int
) -> tuple[torch.Tensor, ...]:
    """Inputs of the method that takes `n` tokens (an empty past, positions 0..n-1)."""
    cache = KvIoCache(lm.spec, layout, rope)
    return cache.inputs(torch.zeros(1, n, dtype=torch.int64), torch.arange(n), n)


def sliding_window_below_context(lm: CausalLm) -> int | None:
    """The window of `lm`'s sliding-window layers if shorter than its context, else None.

    Layers that attend over the last `window` tokens only: Gemma 2 / 3's local layers (their
    `layer_types`), every layer of a Mistral-style config with a `sliding_window` and no layer
    types. With one causal mask for every layer, past the window such a layer would attend
    where the model does not: the host gives them their own (`KvIoCache.inputs`)."""
    config = _text_config(lm.hf)
    window = getattr(config, "sliding_window", None)
    kinds = getattr(config, "layer_types", None)
    sliding = "sliding_attention" in kinds if kinds else window is not None
    if sliding and isinstance(window, int) and window < lm.spec.max_seq_len:
        return window
    return None


def export_kv_io_methods(
    lm: CausalLm,
) -> tuple[dict[str, torch.export.ExportedProgram], tuple[torch.Tensor, torch.Tensor]]:
    """torch.export prefill and decode of the KV-as-IO wrapper (eager attention, one
    `aten.rms_norm` per RMSNorm), and the rotary table the host feeds them from; a model whose
    sliding-window layers' window is shorter than the context takes a second mask for them
    (`KvLayout.sliding_window`)."""
    layout = kv_layout(lm)
    rope = rope_table(lm)
    # Eager attention: the SDPA path exports a "safe softmax" (any / where) QNN cannot lower.
    lm.hf.config._attn_implementation = "eager"  # type: ignore[union-attr]  # hf: a PreTrainedModel
    module = KvIoLm(lm.hf, layout).eval()
    out = {}
    with torch.no_grad(), _fused_rms_norms(lm.hf):
        for method, n in ((PREFILL, lm.spec.prefill_len), (DECODE, 1)):
            out[method] = torch.export.export(
                module, example_inputs(lm, layout, rope, n), strict=False
            )
    return out, rope
