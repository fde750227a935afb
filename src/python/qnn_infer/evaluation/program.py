"""A compile artifact's .pte as the evaluation's `StepLm`, and the text its tokenizer makes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from qnn_common.causal_lm.steps import StepLm, without_sink
from qnn_common.llm_spec import GenerationConfig
from qnn_common.stages import TOKENIZER_DIR
from qnn_common.torchio.chat_template import render_chat_prompt
from qnn_infer.evaluation.harness import Text
from qnn_infer.families.causal_lm import load_tokenizer, open_program_lm
from qnn_infer.generate import PteLm, prompt_rest_decode_up_to


def program_lm(
    compiled: Path, name: str = "program", generation: GenerationConfig | None = None,
) -> tuple[StepLm, PteLm]:
    """The .pte's steps (the runtime made ready first), a prompt fed as `generation` (the
    backend's rule by default) would feed it, and the PteLm to close when done."""
    lm, spec, backend = open_program_lm(compiled)
    up_to = prompt_rest_decode_up_to(generation or GenerationConfig(), backend)
    return StepLm(name, lm.prefill, lm.decode, spec, prompt_decode_up_to=up_to), lm


def artifact_text(artifact: Path, lm: StepLm, chat: bool | None = None) -> Text:
    """Encoding and decoding with the artifact's tokenizer (bytes mod the vocabulary without
    one); prompts go through its chat template when it has one (`chat` None) or when asked."""
    tokenizer = load_tokenizer(artifact)
    spec = lm.spec
    if tokenizer is None:
        def encode(text: str) -> list[int]:
            return [b % spec.vocab_size for b in text.encode("utf-8")]

        def decode(ids: Sequence[int]) -> str:
            return bytes(i for i in ids if i < 256).decode("utf-8", "replace")

        return Text(encode, encode, decode)
    tok: Any = tokenizer
    use_chat = bool(getattr(tok, "chat_template", None)) if chat is None else chat

    def encode_plain(text: str) -> list[int]:
        return [int(i) for i in tok(text, add_special_tokens=False)["input_ids"]]

    def encode_prompt(text: str) -> list[int]:
        if use_chat:
            text = render_chat_prompt(tok, text, Path(TOKENIZER_DIR))
        return without_sink(encode_plain(text), spec)

    def decode_text(ids: Sequence[int]) -> str:
        return str(tok.decode(list(ids), skip_special_tokens=True))

    return Text(encode_plain, encode_prompt, decode_text)
