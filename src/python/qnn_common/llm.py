"""Decoder LLM programs: the facts every stage shares and the one way to drive them.

A causal LM with a KV cache is exported as two methods over one static cache held as mutable
buffers: ``prefill`` takes `prefill_len` tokens at once, ``decode`` takes one. Both take
``(input_ids [1, n], cache_position [n])`` and return logits ``[1, n, vocab]``, and both write the
keys and values of their positions into the cache, so any sequence of calls at increasing
positions leaves the cache as a full recompute would.

`feed` is how every stage pushes tokens through such a pair, whatever runs it (the exported
program in PyTorch, the fake-quantized one, the .pte in the ExecuTorch runtime): full chunks go
to prefill; a tail shorter than a chunk is right-padded when the padding still fits in the cache
(padding writes garbage into positions the causal mask hides, and the next real token at each of
those positions overwrites it), else it goes through decode one token at a time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from qnn_common.errors import ConfigValidationError
from qnn_common.manifest import NOT_IN_CACHE_KEY

# Added to attention scores at masked positions. Not finfo(float32).min: that overflows to -inf in
# fp16 (NaN after softmax on an all-masked row) and, once a backend quantizes the score add,
# stretches its range so far that every real score rounds to the same value. -255 still drives
# exp() to ~1e-111, and is the value ExecuTorch's own QNN Llama export uses.
MASK_VALUE = -255.0

PREFILL = "prefill"
DECODE = "decode"
METHODS = (PREFILL, DECODE)

# (input_ids [1, n] int64, cache_position [n] int64) -> logits [1, n, vocab]
StepFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class KvLayout:
    """The shape of a KV cache kept outside the program: per layer [1, kv_heads, len, head_dim]."""

    layers: int
    kv_heads: int
    head_dim: int


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

    def __post_init__(self) -> None:
        if self.prefill_len < 1 or self.max_seq_len < 2:
            raise ConfigValidationError(
                "llm", asdict(self), "prefill_len must be >= 1 and max_seq_len >= 2"
            )
        if self.prefill_len > self.max_seq_len:
            raise ConfigValidationError(
                "prepare.prefill_len", self.prefill_len,
                f"must not exceed max_seq_len ({self.max_seq_len})",
            )

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "stop_token_ids": list(self.stop_token_ids)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LlmSpec:
        return cls(
            max_seq_len=int(data["max_seq_len"]),
            prefill_len=int(data["prefill_len"]),
            vocab_size=int(data["vocab_size"]),
            stop_token_ids=tuple(int(t) for t in data.get("stop_token_ids", ())),
            pad_token_id=int(data.get("pad_token_id", 0)),
            kv_layout=None if data.get("kv_layout") is None else KvLayout(**data["kv_layout"]),
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
    # Print tokens as they come: how the run is shown, so not part of infer's cache key.
    stream: bool = field(default=False, metadata=NOT_IN_CACHE_KEY)

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, str) or not self.prompt:
            raise ConfigValidationError("generation.prompt", self.prompt, "give a non-empty prompt")
        try:
            self.prompt.encode("utf-8")
        except UnicodeEncodeError:
            # Bytes of a command line that are not UTF-8 arrive as lone surrogates, which no
            # tokenizer takes (a TypeError deep inside one).
            raise ConfigValidationError(
                "generation.prompt", self.prompt,
                "is not valid UTF-8 text (the command line or file held bytes in another "
                "encoding); pass the prompt as UTF-8",
            ) from None
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
    if prompt_tokens >= spec.max_seq_len:
        raise ConfigValidationError(
            "generation.prompt", f"{prompt_tokens} tokens",
            f"longer than the program's context of {spec.max_seq_len} tokens (max_seq_len) "
            "with room for one new token; shorten the prompt or export with a larger "
            "--max-seq-len",
        )
    if prompt_tokens + max_new_tokens > spec.max_seq_len:
        raise ConfigValidationError(
            "generation.max_new_tokens", max_new_tokens,
            f"{prompt_tokens} prompt tokens + {max_new_tokens} new exceed the context of "
            f"{spec.max_seq_len} tokens; ask for at most {spec.max_seq_len - prompt_tokens}",
        )


def feed(
    prefill: StepFn, decode: StepFn, tokens: Sequence[int], start: int, spec: LlmSpec
) -> torch.Tensor:
    """Write `tokens` into the cache at positions start.. and return their logits [n, vocab]."""
    n = len(tokens)
    if n == 0:
        raise ValueError("no tokens to feed")
    if start + n > spec.max_seq_len:
        raise ConfigValidationError(
            "generation", f"{start + n} tokens", f"exceed the context of {spec.max_seq_len}"
        )
    chunk = spec.prefill_len
    ids = torch.tensor(tokens, dtype=torch.int64)
    logits: list[torch.Tensor] = []
    pos = 0
    while pos < n:
        take = min(chunk, n - pos)
        at = start + pos
        if take == chunk or (take > 1 and at + chunk <= spec.max_seq_len):
            window = torch.full((chunk,), spec.pad_token_id, dtype=torch.int64)
            window[:take] = ids[pos : pos + take]
            out = prefill(window[None], torch.arange(at, at + chunk, dtype=torch.int64))
            logits.append(out[0, :take].float())
        else:
            for i in range(take):
                out = decode(ids[pos + i].view(1, 1), torch.tensor([at + i], dtype=torch.int64))
                logits.append(out[0, -1:].float())
        pos += take
    return torch.cat(logits)


def teacher_forced_logits(
    prefill: StepFn, decode: StepFn, sequences: Sequence[torch.Tensor], spec: LlmSpec
) -> list[torch.Tensor]:
    """Logits [len, vocab] at every position of each sequence, each fed from position 0."""
    return [feed(prefill, decode, seq.tolist(), 0, spec) for seq in sequences]


# Run a method: (method name, inputs) -> outputs (logits, then new key / value per layer).
MethodRunner = Callable[[str, Sequence[torch.Tensor]], Sequence[torch.Tensor]]


class KvIoCache:
    """The host half of a program whose cache is inputs and outputs (see qnn_prepare.kv_io).

    Holds keys and values for `max_seq_len` positions. A method taking n tokens at position
    `start` reads the first ``max_seq_len - n`` slots (the past; valid below `start`, masked from
    there on) and returns the n new entries, written back at start..start+n-1.
    """

    def __init__(
        self, spec: LlmSpec, layout: KvLayout, rope: tuple[torch.Tensor, torch.Tensor]
    ) -> None:
        self.spec = spec
        self.layout = layout
        self.cos, self.sin = rope  # [1, max_seq_len, head_dim] each: the model's rotary table
        shape = (1, layout.kv_heads, spec.max_seq_len, layout.head_dim)
        self.keys = [torch.zeros(shape) for _ in range(layout.layers)]
        self.values = [torch.zeros(shape) for _ in range(layout.layers)]

    def inputs(
        self, input_ids: torch.Tensor, cache_position: torch.Tensor, n: int
    ) -> tuple[torch.Tensor, ...]:
        """(input_ids, cos, sin, additive mask, k_0, v_0, ...) for a method of n tokens."""
        past = self.spec.max_seq_len - n
        start = int(cache_position[0])
        if start > past:
            raise ValueError(f"position {start} leaves no room for {n} token(s)")
        mask = torch.full((n, past + n), MASK_VALUE)
        mask[:, :start] = 0.0
        mask[:, past:] = torch.full((n, n), MASK_VALUE).triu(1)
        # Copies: the runtime takes contiguous inputs only, and a prefix of dim 2 is a strided view.
        cache = [
            t[:, :, :past].contiguous()
            for kv in zip(self.keys, self.values, strict=True) for t in kv
        ]
        cos = self.cos[:, start : start + n].contiguous()
        sin = self.sin[:, start : start + n].contiguous()
        return (input_ids, cos, sin, mask[None, None], *cache)

    def step(self, run: MethodRunner, method: str) -> StepFn:
        """A StepFn over `run`'s `method` that feeds the cache in and writes the new entries."""

        def step(input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
            n = int(input_ids.shape[1])
            outputs = run(method, self.inputs(input_ids, cache_position, n))
            start = int(cache_position[0])
            for i in range(self.layout.layers):
                self.keys[i][:, :, start : start + n] = outputs[1 + 2 * i]
                self.values[i][:, :, start : start + n] = outputs[2 + 2 * i]
            return outputs[0]

        return step


def method_steps(
    spec: LlmSpec, run: MethodRunner, rope: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[StepFn, StepFn]:
    """Prefill and decode StepFns over `run`, whichever way the program keeps its cache (with a
    KV layout, through a fresh host cache shared by the two, fed from the `rope` table)."""
    if spec.kv_layout is None:
        return (
            lambda ids, pos: run(PREFILL, (ids, pos))[0],
            lambda ids, pos: run(DECODE, (ids, pos))[0],
        )
    if rope is None:
        raise ValueError("a program with its KV cache as inputs needs its rotary table")
    cache = KvIoCache(spec, spec.kv_layout, rope)
    return cache.step(run, PREFILL), cache.step(run, DECODE)
