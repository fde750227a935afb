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

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from qnn_common.errors import ConfigValidationError
from qnn_common.llm_spec import DECODE, MASK_VALUE, PREFILL, KvLayout, LlmSpec

# (input_ids [1, n] int64, cache_position [n] int64) -> logits [1, n, vocab]
StepFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def feed(
    prefill: StepFn, decode: StepFn, tokens: Sequence[int], start: int, spec: LlmSpec,
    *, decode_up_to: int = 1,
) -> torch.Tensor:
    """Write `tokens` into the cache at positions start.. and return their logits [n, vocab].

    Whole windows go through prefill; a shorter rest too (padded), unless it holds at most
    `decode_up_to` tokens or its padding would pass the context: then decode, a token at a time.
    """
    n = len(tokens)
    if n == 0:
        raise ValueError("no tokens to feed")
    if start + n > spec.context:
        raise ConfigValidationError(
            "generation", f"{start + n} tokens", f"exceed the context of {spec.context}"
        )
    chunk = spec.prefill_len
    ids = torch.tensor(tokens, dtype=torch.int64)
    logits: list[torch.Tensor] = []
    pos = 0
    while pos < n:
        take = min(chunk, n - pos)
        at = start + pos
        if take == chunk or (take > decode_up_to and at + chunk <= spec.context):
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


@dataclass(frozen=True)
class StepLm:
    """A causal LM by its prefill and decode steps and the spec they were exported with, whatever
    runs them (the float model's exported methods, the fake-quantized ones, a .pte): what the
    evaluation scores (`qnn_infer.evaluation`). `name` is how reports call it."""

    name: str
    prefill: StepFn
    decode: StepFn
    spec: LlmSpec
    # A prompt's rest after whole prefill windows of at most this many tokens goes through
    # decode: set to what generation does with the program (`BackendTraits.
    # prompt_rest_decode_up_to`), so that the evaluation's replies are the ones a user gets.
    prompt_decode_up_to: int = 1


# Run a method: (method name, inputs) -> outputs (logits, then new key / value per layer).
MethodRunner = Callable[[str, Sequence[torch.Tensor]], Sequence[torch.Tensor]]


# An attention sink's keys and values: per layer, (k, v) of its one position, each
# [1, kv_heads, 1, head_dim] (`LlmSpec.sink_token_id`).
SinkTable = Sequence[tuple[torch.Tensor, torch.Tensor]]


class KvIoCache:
    """The host half of a program whose cache is inputs and outputs (qnn_prepare.causal_lm.kv_io).

    Holds keys and values for `max_seq_len` slots. A method taking n tokens at slot `start`
    reads the first ``max_seq_len - n`` slots (the past; valid below `start`, masked from there
    on) and returns the n new entries, written back at start..start+n-1. With an attention sink
    (`LlmSpec.sink_token_id`), slot 0 holds the sink's entries from `sink` and a caller's
    position p is slot p + 1.
    """

    def __init__(
        self, spec: LlmSpec, layout: KvLayout, rope: tuple[torch.Tensor, torch.Tensor],
        sink: SinkTable | None = None,
    ) -> None:
        self.spec = spec
        self.layout = layout
        # [1, max_seq_len, head_dim] each (kinds * head_dim for a table per layer kind): the
        # model's rotary table, sliced by position alike either way.
        self.cos, self.sin = rope
        shape = (1, layout.kv_heads, spec.max_seq_len, layout.head_dim)
        self.keys = [torch.zeros(shape) for _ in range(layout.layers)]
        self.values = [torch.zeros(shape) for _ in range(layout.layers)]
        self.shift = spec.max_seq_len - spec.context  # 1 with a sink in slot 0
        if self.shift:
            if sink is None or len(sink) != layout.layers:
                raise ValueError(
                    f"a program with an attention sink needs its keys and values for each of "
                    f"{layout.layers} layers (the artifact's sink table)"
                )
            for i, (k, v) in enumerate(sink):
                self.keys[i][:, :, :1] = k
                self.values[i][:, :, :1] = v

    def inputs(
        self, input_ids: torch.Tensor, cache_position: torch.Tensor, n: int
    ) -> tuple[torch.Tensor, ...]:
        """(input_ids, cos, sin, additive mask, k_0, v_0, ...) for a method of n tokens."""
        past = self.spec.max_seq_len - n
        start = int(cache_position[0]) + self.shift
        if start > past:
            raise ValueError(f"position {start} leaves no room for {n} token(s)")
        mask = torch.full((n, past + n), MASK_VALUE)
        mask[:, :start] = 0.0
        mask[:, past:] = torch.full((n, n), MASK_VALUE).triu(1)
        window = self.layout.sliding_window
        if window is not None:
            # Query i sits in slot start + i and its local layers see the slots after
            # start + i - window: the past slots (column j is slot j) and the new ones (column
            # past + k is slot start + k) before that are masked too. The two masks side by
            # side on dim 1: [1, 2, n, past + n], full then local (kv_io.KvIoLm splits them).
            query = start + torch.arange(n)[:, None]
            slots = torch.cat([torch.arange(past), start + torch.arange(n)])[None, :]
            local = mask.masked_fill(slots <= query - window, MASK_VALUE)
            return (input_ids, *self._rope(start, n), torch.stack([mask, local])[None],
                    *self._past(past))
        return (input_ids, *self._rope(start, n), mask[None, None], *self._past(past))

    def _rope(self, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.cos[:, start : start + n].contiguous(),
                self.sin[:, start : start + n].contiguous())

    def _past(self, past: int) -> list[torch.Tensor]:
        # Copies: the runtime takes contiguous inputs only, and a prefix of dim 2 is a strided view.
        return [t[:, :, :past].contiguous()
                for kv in zip(self.keys, self.values, strict=True) for t in kv]

    def step(self, run: MethodRunner, method: str) -> StepFn:
        """A StepFn over `run`'s `method` that feeds the cache in and writes the new entries."""

        def step(input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
            n = int(input_ids.shape[1])
            outputs = run(method, self.inputs(input_ids, cache_position, n))
            start = int(cache_position[0]) + self.shift
            for i in range(self.layout.layers):
                self.keys[i][:, :, start : start + n] = outputs[1 + 2 * i]
                self.values[i][:, :, start : start + n] = outputs[2 + 2 * i]
            return outputs[0]

        return step


def without_sink(tokens: list[int], spec: LlmSpec) -> list[int]:
    """`tokens` as the methods take them after the attention sink: a leading sink token (a
    chat template's BOS) dropped, since the cache's first slot already holds it."""
    if spec.sink_token_id is not None and len(tokens) > 1 and tokens[0] == spec.sink_token_id:
        return tokens[1:]
    return tokens


def method_steps(
    spec: LlmSpec, run: MethodRunner, rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    sink: SinkTable | None = None,
) -> tuple[StepFn, StepFn]:
    """Prefill and decode StepFns over `run`, whichever way the program keeps its cache (with a
    KV layout, through a fresh host cache shared by the two, fed from the `rope` table and,
    with an attention sink, from its `sink` table)."""
    if spec.kv_layout is None:
        return (
            lambda ids, pos: run(PREFILL, (ids, pos))[0],
            lambda ids, pos: run(DECODE, (ids, pos))[0],
        )
    if rope is None:
        raise ValueError("a program with its KV cache as inputs needs its rotary table")
    cache = KvIoCache(spec, spec.kv_layout, rope, sink)
    return cache.step(run, PREFILL), cache.step(run, DECODE)
