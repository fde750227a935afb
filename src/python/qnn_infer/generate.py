"""Text generation over a causal-LM .pte (``prefill`` + ``decode`` sharing a KV cache).

The program keeps the cache; the host feeds the prompt (`qnn_common.causal_lm.steps.feed`), then one
token at a time through decode, picking each next token greedily or by seeded sampling (temperature,
top-k, top-p), until a stop token or `max_new_tokens`. Timing follows the usual LLM report: time
to first token (the prompt's prefill plus picking the first token), prefill tokens/s over the
prompt, decode tokens/s over the tokens after the first.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from qnn_common.causal_lm.steps import SinkTable, StepFn, feed, method_steps
from qnn_common.cli.noise import native_noise_filtered
from qnn_common.errors import ArtifactError, StageError
from qnn_common.llm_spec import DECODE, PREFILL, GenerationConfig, LlmSpec, check_fits
from qnn_common.recipes import BACKENDS, Backend
from qnn_infer.deadline import bound_for, bounded
from qnn_infer.runtimes import host_runtime


@dataclass(frozen=True)
class Generation:
    """What one generation produced and how fast."""

    prompt_tokens: int
    tokens: tuple[int, ...]  # the new tokens, stop token included if one ended it
    text: str
    stopped_by: str  # "stop_token" | "max_new_tokens"
    ttft_ms: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    prompt_decode_up_to: int = 1  # a prompt rest of at most this many tokens went through decode

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": len(self.tokens),
            "token_ids": list(self.tokens),
            "stopped_by": self.stopped_by,
            "ttft_ms": round(self.ttft_ms, 3),
            "prefill_tokens_per_s": round(self.prefill_tokens_per_s, 2),
            "decode_tokens_per_s": round(self.decode_tokens_per_s, 2),
            "prompt_decode_up_to": self.prompt_decode_up_to,
        }


class PteLm:
    """The prefill and decode methods of a causal-LM .pte, loaded in the ExecuTorch runtime."""

    def __init__(
        self, pte: Path, spec: LlmSpec, rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        sink: SinkTable | None = None, *, trace: bool = False,
    ) -> None:
        # The QNN runtime reports each method's load on fd 2, and the HTP emulator its start on
        # fd 1: held back, so that what streams next is the generated text alone.
        with native_noise_filtered(stdout=True):
            # `trace`: every method run recorded as ETDump events (write_etdump).
            program = (host_runtime().load_program(str(pte), enable_etdump=True) if trace
                       else host_runtime().load_program(str(pte)))
            self._program: Any = program
            missing = {PREFILL, DECODE} - set(program.method_names)
            if missing:
                raise ArtifactError(
                    pte, f"has methods {sorted(program.method_names)}, a causal LM needs "
                    f"{PREFILL} and {DECODE}; compile it from a KV-cache export "
                    "(qnn-prepare --kv-cache)",
                )
            self._methods = {m: program.load_method(m) for m in (PREFILL, DECODE)}
        self._bounds = {m: bound_for(f"running {m} of {pte}") for m in (PREFILL, DECODE)}
        self.prefill, self.decode = method_steps(spec, self._run, rope, sink)

    def _run(self, name: str, inputs: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
        try:
            with bounded(self._bounds[name]):  # a run that never returns: qnn_infer.deadline
                outputs: Sequence[torch.Tensor] = self._methods[name].execute(list(inputs))
        except RuntimeError as err:
            raise StageError("infer", f"the {name} method failed: {err}", err) from err
        return outputs

    def write_etdump(self, path: Path) -> None:
        """The traced runs' ETDump (the PteLm made with `trace=True`) into `path`."""
        self._program.write_etdump_result_to_file(str(path), str(path) + ".debug")

    def close(self) -> None:
        """Release the methods now, the runtime's goodbyes held back like its greetings: left
        to the interpreter's exit, the QNN runtime's "Destroy Qnn context" lines followed the
        report."""
        with native_noise_filtered():
            self._methods.clear()
            self._program = None  # the program holds the backend's context: released here too


def prompt_rest_decode_up_to(cfg: GenerationConfig, backend: Backend) -> int:
    """How many tokens of a prompt's rest at most go through decode: the config's number, or
    the backend's rule (never a timing: the same prompt must get the same reply every run)."""
    if cfg.prompt_decode_up_to is not None:
        return cfg.prompt_decode_up_to
    return BACKENDS[backend].prompt_rest_decode_up_to


def pick_next(logits: torch.Tensor, cfg: GenerationConfig, generator: torch.Generator) -> int:
    """The next token from one position's logits [vocab]: argmax, or a seeded sample."""
    if cfg.temperature == 0:
        return int(logits.argmax())
    scores = logits.double() / cfg.temperature
    if 0 < cfg.top_k < scores.numel():
        kth = torch.topk(scores, cfg.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if cfg.top_p < 1:
        ordered, index = torch.sort(scores, descending=True)
        cumulative = torch.softmax(ordered, -1).cumsum(-1)
        # Keep the smallest prefix reaching top_p: drop a token once the mass before it does.
        drop = cumulative - torch.softmax(ordered, -1) >= cfg.top_p
        scores = scores.scatter(0, index[drop], float("-inf"))
    probs = torch.softmax(scores, -1)
    return int(torch.multinomial(probs, 1, generator=generator))


def generate(
    prefill: StepFn,
    decode: StepFn,
    prompt_ids: list[int],
    cfg: GenerationConfig,
    spec: LlmSpec,
    decode_text: Callable[[list[int]], str],
    *,
    decode_up_to: int = 1,
) -> Generation:
    """Generate after `prompt_ids`; the program's cache must be fresh or about to be overwritten
    from position 0 (it is: the prompt is written from 0 and the mask hides the rest). A prompt
    whose rest after whole prefill windows holds at most `decode_up_to` tokens feeds that rest
    through decode (the backend's rule, `BackendTraits.prompt_rest_decode_up_to`)."""
    check_fits(len(prompt_ids), cfg.max_new_tokens, spec)
    generator = torch.Generator().manual_seed(cfg.seed)
    t0 = time.perf_counter()
    logits = feed(prefill, decode, prompt_ids, 0, spec, decode_up_to=decode_up_to)
    prefill_s = time.perf_counter() - t0
    token = pick_next(logits[-1], cfg, generator)
    ttft_s = time.perf_counter() - t0
    tokens = [token]
    printed = ""
    printed = _stream(cfg, tokens, decode_text, printed)
    stopped_by = "max_new_tokens"
    t1 = time.perf_counter()
    while True:
        if token in spec.stop_token_ids:
            stopped_by = "stop_token"
            break
        if len(tokens) >= cfg.max_new_tokens:
            break
        position = len(prompt_ids) + len(tokens) - 1
        out = decode(torch.tensor([[token]], dtype=torch.int64),
                     torch.tensor([position], dtype=torch.int64))
        token = pick_next(out[0, -1].float(), cfg, generator)
        tokens.append(token)
        printed = _stream(cfg, tokens, decode_text, printed)
    decode_s = time.perf_counter() - t1
    if cfg.stream:
        sys.stdout.write("\n")
        sys.stdout.flush()
    decoded = len(tokens) - 1
    return Generation(
        prompt_tokens=len(prompt_ids),
        tokens=tuple(tokens),
        text=decode_text(tokens),
        stopped_by=stopped_by,
        ttft_ms=ttft_s * 1000,
        prefill_tokens_per_s=len(prompt_ids) / prefill_s if prefill_s > 0 else 0.0,
        decode_tokens_per_s=decoded / decode_s if decoded and decode_s > 0 else 0.0,
        prompt_decode_up_to=decode_up_to,
    )


def _stream(
    cfg: GenerationConfig, tokens: list[int], decode_text: Callable[[list[int]], str], printed: str
) -> str:
    """Print what the text gained since the last call (decoding the whole tail keeps multi-byte
    characters whole); returns the text printed so far."""
    if not cfg.stream:
        return printed
    text = decode_text(tokens)
    if text.startswith(printed) and not text.endswith("\ufffd"):
        sys.stdout.write(text[len(printed):])
        sys.stdout.flush()
        return text
    return printed
