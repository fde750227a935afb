"""A decoder LLM's shapes, tokens and generation settings: the contract types every stage and
config reads, importable with the standard library alone (the runtime half, which drives the
methods with tensors, is `qnn_common.causal_lm.steps`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from qnn_common.cache_keys import NOT_IN_CACHE_KEY
from qnn_common.errors import ConfigValidationError

# Added to attention scores at masked positions. Not finfo(float32).min: that overflows to -inf in
# fp16 (NaN after softmax on an all-masked row) and, once a backend quantizes the score add,
# stretches its range so far that every real score rounds to the same value. -255 still drives
# exp() to ~1e-111, and is the value ExecuTorch's own QNN Llama export uses.
MASK_VALUE = -255.0

# Importing it registers ExecuTorch's LLM custom ops (`llama::update_cache`, `custom_sdpa`) with
# torch and their kernels with ExecuTorch's runtime: a program exported with them
# (qnn_prepare.causal_lm.custom_op_attention) loads and runs only after that.
LLM_CUSTOM_OPS_MODULE = "executorch.extension.llm.custom_ops.custom_ops"

PREFILL = "prefill"
DECODE = "decode"
METHODS = (PREFILL, DECODE)
# A prompt past this is refused before tokenizing: about 250,000 tokens of English, more than
# any context here holds, and a few megabytes of tokenizer memory at most.
MAX_PROMPT_BYTES = 1 << 20


@dataclass(frozen=True)
class KvLayout:
    """The shape of a KV cache kept outside the program: per layer [1, kv_heads, len, head_dim]."""

    layers: int
    kv_heads: int
    head_dim: int
    # Set: the model's sliding-window layers attend over the last this many tokens, and each
    # call takes a second additive mask for them (`KvIoCache.inputs`); None: one causal mask.
    sliding_window: int | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if self.sliding_window is None:
            del out["sliding_window"]  # the layouts recorded before it existed, unchanged
        return out


@dataclass(frozen=True)
class LlmSpec:
    """The static shapes and tokens of an exported causal LM, as recorded in its manifests."""

    max_seq_len: int
    prefill_len: int
    vocab_size: int
    stop_token_ids: tuple[int, ...] = ()
    pad_token_id: int = 0
    # None: the program keeps its cache in mutable buffers (shared by its methods). Set: the cache
    # is the methods' inputs and outputs, with this layout, and the host keeps it (`KvIoCache`).
    kv_layout: KvLayout | None = None
    # Set (only with `kv_layout`): the cache's first slot always holds this token's keys and
    # values, computed in float when the program was prepared (`SINK_TABLE`), and every text
    # the methods see follows it. The host shifts each position by one, so callers still count
    # from 0 in a context one token shorter (`context`). Why: a decoder's first token carries
    # activations hundreds of times larger than any other's, and a program that never computes
    # it quantizes the rest on a far finer grid (docs/llm.md, "Attention sink").
    sink_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.prefill_len < 1 or self.max_seq_len < 2:
            raise ConfigValidationError(
                "llm", asdict(self), "prefill_len must be >= 1 and max_seq_len >= 2"
            )
        if self.sink_token_id is not None and self.kv_layout is None:
            raise ConfigValidationError(
                "llm", asdict(self), "an attention sink needs a cache the host keeps (kv_layout)"
            )
        if self.prefill_len > self.max_seq_len:
            raise ConfigValidationError(
                "prepare.prefill_len", self.prefill_len,
                f"must not exceed max_seq_len ({self.max_seq_len})",
            )

    @property
    def context(self) -> int:
        """How many tokens a caller can feed: the cache, less the sink's slot if there is one."""
        return self.max_seq_len - (self.sink_token_id is not None)

    def to_json(self) -> dict[str, Any]:
        out = {**asdict(self), "stop_token_ids": list(self.stop_token_ids)}
        if self.kv_layout is not None:
            out["kv_layout"] = self.kv_layout.to_json()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LlmSpec:
        return cls(
            max_seq_len=int(data["max_seq_len"]),
            prefill_len=int(data["prefill_len"]),
            vocab_size=int(data["vocab_size"]),
            stop_token_ids=tuple(int(t) for t in data.get("stop_token_ids", ())),
            pad_token_id=int(data.get("pad_token_id", 0)),
            kv_layout=None if data.get("kv_layout") is None else KvLayout(**data["kv_layout"]),
            sink_token_id=None if data.get("sink_token_id") is None else int(
                data["sink_token_id"]),
        )


@dataclass(frozen=True)
class GenerationConfig:
    """How to generate: the prompt, how many tokens, and how to pick each one.

    `temperature` 0 is greedy (argmax); otherwise logits are divided by it, cut to the `top_k`
    most likely tokens (0: all) and to the smallest set whose probability reaches `top_p`, and
    sampled with a generator seeded by `seed`, so a run repeats exactly. Greedy decoding uses
    none of those three: they are reset to their defaults, so that the config a greedy run records
    (and its infer cache key) does not depend on settings that changed nothing.
    """

    prompt: str = "Once upon a time"
    max_new_tokens: int = 32
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    chat: bool = False  # wrap the prompt in the tokenizer's chat template
    # A prompt's rest after its whole prefill windows, if at most this many tokens, goes through
    # decode a token at a time instead of one padded prefill window. None: the backend's rule
    # (`BackendTraits.prompt_rest_decode_up_to`; the number used is in infer's manifest).
    prompt_decode_up_to: int | None = None
    # Print tokens as they come: how the run is shown, so not part of infer's cache key.
    stream: bool = field(default=False, metadata=NOT_IN_CACHE_KEY)

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, str) or not self.prompt:
            raise ConfigValidationError("generation.prompt", self.prompt, "give a non-empty prompt")
        try:
            size = len(self.prompt.encode("utf-8"))
        except UnicodeEncodeError:
            # Bytes of a command line that are not UTF-8 arrive as lone surrogates, which no
            # tokenizer takes (a TypeError deep inside one).
            raise ConfigValidationError(
                "generation.prompt", self.prompt,
                "is not valid UTF-8 text (the command line or file held bytes in another "
                "encoding); pass the prompt as UTF-8",
            ) from None
        if size > MAX_PROMPT_BYTES:
            # Refused before any tokenizer sees it: tokenizing tens of megabytes costs gigabytes.
            raise ConfigValidationError(
                "generation.prompt", f"{size / 2**20:.1f} MiB of text",
                f"is longer than the {MAX_PROMPT_BYTES >> 20} MiB a prompt may be (more than any "
                "model's context holds); shorten it",
            )
        if not 1 <= self.max_new_tokens <= 100_000:
            raise ConfigValidationError(
                "generation.max_new_tokens", self.max_new_tokens, "must be in [1, 100000]"
            )
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ConfigValidationError(
                "generation.temperature", self.temperature, "must be >= 0 (0 is greedy)"
            )
        if self.top_k < 0:
            raise ConfigValidationError("generation.top_k", self.top_k, "must be >= 0 (0: all)")
        if self.prompt_decode_up_to is not None and not (
            isinstance(self.prompt_decode_up_to, int)
            and not isinstance(self.prompt_decode_up_to, bool)
            and 1 <= self.prompt_decode_up_to <= 100_000
        ):
            raise ConfigValidationError(
                "generation.prompt_decode_up_to", self.prompt_decode_up_to,
                "must be a whole number >= 1 (1: only a one-token rest goes through decode), or "
                "left out for the backend's rule",
            )
        if not 0 < self.top_p <= 1:
            raise ConfigValidationError("generation.top_p", self.top_p, "must be in (0, 1]")
        check_seed(self.seed, "generation.seed")
        if self.temperature == 0:
            for name in ("top_k", "top_p", "seed"):
                object.__setattr__(self, name, _SAMPLER_DEFAULTS[name])


# torch.Generator.manual_seed takes an unsigned 64-bit seed.
SEED_LIMIT = 2**64


def check_seed(seed: object, field: str) -> None:
    """Refuse a sampler seed torch cannot take (it would fail deep inside generation)."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < SEED_LIMIT:
        raise ConfigValidationError(
            field, seed, "must be a whole number in [0, 2**64): the sampler's generator "
            "takes an unsigned 64-bit seed"
        )


_SAMPLER_DEFAULTS: dict[str, Any] = {"top_k": 0, "top_p": 1.0, "seed": 0}


def check_fits(prompt_tokens: int, max_new_tokens: int, spec: LlmSpec) -> None:
    """Refuse, before any work, a prompt plus generation that cannot fit in the cache."""
    if prompt_tokens < 1:
        raise ConfigValidationError("generation.prompt", prompt_tokens, "tokenizes to nothing")
    context = spec.context
    sink = " (max_seq_len, less the attention sink's slot)" if context < spec.max_seq_len else (
        " (max_seq_len)")
    if prompt_tokens >= context:
        raise ConfigValidationError(
            "generation.prompt", f"{prompt_tokens} tokens",
            f"longer than the program's context of {context} tokens{sink} "
            "with room for one new token; shorten the prompt or export with a larger "
            "--max-seq-len",
        )
    if prompt_tokens + max_new_tokens > context:
        raise ConfigValidationError(
            "generation.max_new_tokens", max_new_tokens,
            f"{prompt_tokens} prompt tokens + {max_new_tokens} new exceed the context of "
            f"{context} tokens{sink}; ask for at most {context - prompt_tokens}",
        )
