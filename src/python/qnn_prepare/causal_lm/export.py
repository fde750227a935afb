"""The causal-LM task: a decoder exported as ``prefill`` + ``decode`` over a static KV cache.

The cache is transformers' own ExecuTorch integration (`TorchExportableModuleWithStaticCache`:
a `StaticCache` registered as buffers, written in place), so the program carries its state and
the host only feeds tokens and positions (see `qnn_common.causal_lm.steps`). Both methods come from
one module, so their weights and cache buffers have the same names; compile lowers them into one
.pte in which the cache is shared (`share_mutable_buffers`).

Sources: a local Hugging Face directory of any decoder transformers' Auto classes know, or the
built-ins `tiny-llama` and `tiny-qwen` (`qnn_prepare.causal_lm.tiny_decoders`) and `smollm2-135m`
(`qnn_prepare.causal_lm.smollm2`, real weights).
"""

from __future__ import annotations

import importlib.resources
import logging
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qnn_common.errors import ArtifactError, ConfigValidationError
from qnn_common.llm_spec import DECODE, PREFILL, LlmSpec, check_fits
from qnn_common.torchio.hf_untrusted import HF_LOAD, check_model_dir, read_hf_json
from qnn_prepare.causal_lm import custom_op_attention, grouped_attention
from qnn_prepare.causal_lm.smollm2 import SMOLLM2, gguf_path, save_smollm2
from qnn_prepare.causal_lm.tiny_decoders import (
    TINY_CONTEXT,
    TINY_DECODERS,
    byte_tokenizer,
    save_tiny_decoder,
    text_bytes,
)
from qnn_prepare.hf_dir import (
    WEIGHT_ERRORS,
    is_causal_lm_architecture,
    read_auto_config,
    read_tokenizer,
    weights_error,
)

log = logging.getLogger(__name__)

# Context length when neither the user nor a small model's config asks for less.
DEFAULT_MAX_SEQ_LEN = 512
DEFAULT_PREFILL_LEN = 32

# Files that define the tokenizer and chat template, copied into the artifact.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja",
    "generation_config.json", "config.json",
)


@dataclass(frozen=True)
class EvalTexts:
    """The text calibration reads and the one the eval reads, with what each is (for reports)."""

    calibration: str
    calibration_source: str
    eval: str
    eval_source: str


def _resource_text(name: str) -> str:
    return importlib.resources.files("qnn_prepare").joinpath(f"data/{name}").read_text("utf-8")


_ALICE = "Alice's Adventures in Wonderland, ch. 1 (public domain)"
# Every model not trained on the shipped text: calibrate on Alice, evaluate on held-out text no
# model here was trained on (the Gettysburg Address and the opening of the Declaration of
# Independence, public domain).
HELD_OUT = EvalTexts(
    calibration=text_bytes().decode("utf-8"), calibration_source=f"text: {_ALICE}",
    eval=_resource_text("eval_text.txt"),
    eval_source="text: the Gettysburg Address, the Declaration of Independence (public domain)",
)
# The tiny decoders were trained on Alice and find any other text near-random (flat logits make
# argmax agreement a coin toss, `tiny_decoders`): they calibrate on its first half and are
# evaluated on its second.
_half = len(HELD_OUT.calibration) // 2
HALVES = EvalTexts(
    calibration=HELD_OUT.calibration[:_half],
    calibration_source=f"text: {_ALICE}, first half (the tiny decoders' training text)",
    eval=HELD_OUT.calibration[_half:],
    eval_source=f"text: {_ALICE}, second half (the tiny decoders' training text)",
)


@dataclass(frozen=True)
class CausalLm:
    """A loaded decoder: the HF model (eval), its tokenizer and files, and the export shapes."""

    name: str
    hf: nn.Module
    tokenizer: Any | None
    spec: LlmSpec
    tokenizer_files: dict[str, bytes] = field(default_factory=dict)
    # What calibration reads and what the eval (teacher-forced logits, perplexity) reads: never
    # the same text.
    texts: EvalTexts = HELD_OUT

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no special tokens added); bytes mod vocab without a tokenizer."""
        if self.tokenizer is None:
            return [b % self.spec.vocab_size for b in text.encode("utf-8")]
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def is_causal_lm_dir(path: Path) -> bool:
    """Whether `path` is a HF directory whose architecture transformers loads as a causal LM."""
    config = path / "config.json"
    if not config.is_file():
        return False
    try:
        archs = read_hf_json(config).get("architectures") or []
    except ArtifactError:
        return False  # the loaders say what is wrong with it
    return isinstance(archs, list) and any(is_causal_lm_architecture(str(a)) for a in archs)


def load_causal_lm(
    spec: str, *, max_seq_len: int | None = None, prefill_len: int | None = None, seed: int = 1126
) -> CausalLm:
    """Load a built-in tiny decoder or a local HF causal-LM directory for KV-cache export."""
    spec = spec.strip()
    if spec in TINY_DECODERS:
        with tempfile.TemporaryDirectory() as tmp:
            directory = save_tiny_decoder(spec, Path(tmp) / spec, seed=seed)
            return replace(_load_dir(directory, spec, max_seq_len, prefill_len), texts=HALVES)
    if spec == SMOLLM2:
        with tempfile.TemporaryDirectory() as tmp:
            directory = save_smollm2(Path(tmp) / spec)
            return _load_dir(directory, spec, max_seq_len, prefill_len)
    path = _causal_lm_dir(spec)
    return _load_dir(path, path.name, max_seq_len, prefill_len)


def _causal_lm_dir(spec: str) -> Path:
    """The local Hugging Face causal-LM directory `spec` names (not a built-in), or the error
    saying why it is none."""
    path = Path(spec).expanduser()
    if not path.is_dir() and "/" not in spec and not spec.startswith((".", "~")):
        raise ConfigValidationError(
            "model", spec,
            "a KV-cache export (--prompt, kv_cache) needs a causal LM: a built-in decoder or a "
            "local Hugging Face causal-LM directory",
            allowed=(*TINY_DECODERS, SMOLLM2),
        )
    if not path.is_dir():
        raise ArtifactError(path, "not a directory; pass a local Hugging Face causal-LM directory")
    if (path / "config.json").is_file():
        check_model_dir(path)  # a malformed config is named, not taken for another model's
    if not is_causal_lm_dir(path):
        raise ConfigValidationError(
            "model", spec,
            "a KV-cache export needs a causal LM (config.json architectures a *ForCausalLM, "
            "or another of transformers' causal-LM classes such as GPT2LMHeadModel); drop "
            "--prompt / kv_cache for other models",
        )
    return path


def _load_dir(
    directory: Path, name: str, max_seq_len: int | None, prefill_len: int | None
) -> CausalLm:
    from transformers import AutoModelForCausalLM

    check_model_dir(directory)  # before transformers reads a byte of it
    try:
        hf = AutoModelForCausalLM.from_pretrained(str(directory), **HF_LOAD)
    except WEIGHT_ERRORS as err:
        raise weights_error(directory, err) from err
    exportable_experts(hf)
    config = hf.config.get_text_config()
    max_len, chunk = _shapes(config, max_seq_len, prefill_len)
    tokenizer = _tokenizer(directory)
    stop = _stop_tokens(hf, tokenizer)
    pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
    vocab = int(config.vocab_size)
    if pad is None and stop:
        pad = stop[0]
    if not isinstance(pad, int) or not 0 <= pad < vocab:
        # Configs of small test models keep their parent's ids (Phi-3: eos 32000 in a vocab of
        # 128); padding is masked anyway, it only has to be a valid embedding row.
        pad = 0
    spec = LlmSpec(
        max_seq_len=max_len,
        prefill_len=chunk,
        vocab_size=vocab,
        stop_token_ids=stop,
        pad_token_id=pad,
    )
    files = {f: (directory / f).read_bytes() for f in TOKENIZER_FILES if (directory / f).is_file()}
    return CausalLm(name, hf.eval(), tokenizer, spec, files)


def _shapes(config: Any, max_seq_len: int | None, prefill_len: int | None) -> tuple[int, int]:
    """(max_seq_len, prefill_len) for `config`: the defaults, checked against its positions."""
    limit = int(getattr(config, "max_position_embeddings", DEFAULT_MAX_SEQ_LEN))
    max_len = max_seq_len if max_seq_len is not None else min(DEFAULT_MAX_SEQ_LEN, limit)
    if max_len > limit:
        raise ConfigValidationError(
            "prepare.max_seq_len", max_len,
            f"exceeds the model's max_position_embeddings ({limit}); use at most {limit}",
        )
    chunk = prefill_len if prefill_len is not None else min(DEFAULT_PREFILL_LEN, max_len // 2)
    return max_len, chunk


def _tokenizer(directory: Path) -> Any | None:
    # Random-weight test models often ship none: token ids are bytes then. One that does not
    # load is refused (read_tokenizer), never dropped.
    return read_tokenizer(directory)


def check_prompt_fits(
    spec: str, *, max_seq_len: int | None, prefill_len: int | None, prompt: str,
    max_new_tokens: int,
) -> None:
    """Refuse a prompt + generation longer than the context before any export (reads only the
    config and the tokenizer; a chat template adds tokens, checked again at infer)."""
    spec = spec.strip()
    if spec in TINY_DECODERS:
        from transformers import PretrainedConfig

        config: Any = PretrainedConfig(max_position_embeddings=TINY_CONTEXT)
        tokenizer = byte_tokenizer()
    elif spec == SMOLLM2:
        from transformers import AutoConfig, AutoTokenizer

        gguf = gguf_path()
        config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    else:
        directory = _causal_lm_dir(spec)  # not one: refused here, before --out is touched
        config = read_auto_config(directory).get_text_config()
        tokenizer = _tokenizer(directory)
    max_len, chunk = _shapes(config, max_seq_len, prefill_len)
    if tokenizer is None:
        count = len(prompt.encode("utf-8"))
    else:
        count = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    check_fits(count, max_new_tokens, LlmSpec(max_len, chunk, vocab_size=1))


def _stop_tokens(hf: nn.Module, tokenizer: Any | None) -> tuple[int, ...]:
    ids: list[int] = []
    generation = getattr(hf, "generation_config", None)
    for source in (generation, getattr(hf, "config", None), tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        for token in value if isinstance(value, list | tuple) else [value]:
            if isinstance(token, int) and token not in ids:
                ids.append(token)
    return tuple(ids)


class StaticCacheLm(nn.Module):
    """`(input_ids [1, n], cache_position [n]) -> logits [1, n, vocab]` over a static KV cache.

    Wraps transformers' `TorchExportableModuleWithStaticCache`, and rebinds its cache layers to
    the registered buffers on every call: the layers hold the original tensors, which non-strict
    torch.export sees as constants, so their in-place updates would not become buffer mutations
    (export then fails in run_decompositions). Through the module attributes they do.
    """

    def __init__(self, hf: nn.Module, max_seq_len: int) -> None:
        super().__init__()
        from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

        generation: Any = hf.generation_config  # a PreTrainedModel's GenerationConfig
        generation.use_cache = True
        generation.cache_implementation = "static"
        self.inner = TorchExportableModuleWithStaticCache(
            hf, batch_size=1, max_cache_len=max_seq_len
        )

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        inner = self.inner
        for i, layer in enumerate(inner.static_cache.layers):
            layer.keys = getattr(inner, f"key_cache_{i}")
            layer.values = getattr(inner, f"value_cache_{i}")
            layer.cumulative_length = getattr(inner, f"cumulative_length_{i}")
        logits: torch.Tensor = inner(input_ids=input_ids, cache_position=cache_position)
        return logits


# Mixture-of-experts layers in transformers 5 dispatch on `config._experts_implementation`: its
# default, grouped_mm, runs a custom op (`transformers::grouped_mm_fallback`) that ExecuTorch has no
# out variant for, so a program holding it fails at serialization, after all the work; the eager
# loop picks experts with data-dependent shapes, which export refuses. batched_mm gathers each
# token's experts' weights and multiplies them in one batched matmul: the same values, static
# shapes, plain ATen ops.
EXPORTABLE_EXPERTS = "batched_mm"


def exportable_experts(hf: nn.Module) -> None:
    """Route a mixture-of-experts model's experts through `EXPORTABLE_EXPERTS` (no effect on a
    dense model), for the export and the eager references alike."""
    config: Any = getattr(hf, "config", None)
    if config is None:
        return
    for part in (config, config.get_text_config()):  # a multimodal model's text part has its own
        if getattr(part, "_experts_implementation", None) is not None:
            part._experts_implementation = EXPORTABLE_EXPERTS


def export_methods(
    lm: CausalLm, *, custom_ops: bool | None = False
) -> dict[str, torch.export.ExportedProgram]:
    """torch.export ``prefill`` (prefill_len tokens) and ``decode`` (1 token) of one module.

    A decoder with plain scaled dot-product attention is exported with `grouped_attention`
    (the same values; grouped-query attention without a copy of the cache per query head), or
    with `custom_ops`, its cache and attention as ExecuTorch's LLM custom ops
    (`custom_op_attention`); `custom_ops` None: those where the attention is plain, transformers'
    own attention over a static cache where it is not (soft-capping, sinks, another family)."""
    plain = grouped_attention.uses_plain_attention(lm.hf)
    if custom_ops is None:
        custom_ops = plain
        if not plain:
            log.info(
                "%s's attention is not plain causal attention (soft-capping, sinks or another "
                "family), which ExecuTorch's custom_sdpa computes: exported without custom ops, "
                "its own attention over a static cache", type(lm.hf).__name__)
    if custom_ops and not plain:
        raise ConfigValidationError(
            "prepare.custom_ops", type(lm.hf).__name__,
            "ExecuTorch's custom_sdpa computes plain causal scaled dot-product attention, and "
            "this model's attention is not that (soft-capping, sinks or another family); "
            "export it without custom ops (qnn-pipeline --no-custom-ops)",
        )
    module: nn.Module = (
        custom_op_attention.CustomOpCacheLm(lm.hf, lm.spec.max_seq_len)
        if custom_ops else StaticCacheLm(lm.hf, lm.spec.max_seq_len)
    ).eval()
    n = lm.spec.prefill_len
    shapes = {PREFILL: n, DECODE: 1}
    out = {}
    config: Any = lm.hf.config
    own = config._attn_implementation
    if custom_ops:
        custom_op_attention.register()
        config._attn_implementation = custom_op_attention.NAME
    elif plain:
        grouped_attention.register()
        config._attn_implementation = grouped_attention.NAME
    try:
        with torch.no_grad():
            for method, length in shapes.items():
                kwargs = {
                    "input_ids": torch.zeros(1, length, dtype=torch.int64),
                    "cache_position": torch.arange(length, dtype=torch.int64),
                }
                out[method] = torch.export.export(module, (), kwargs, strict=False)
    finally:
        config._attn_implementation = own  # the eager references keep transformers' own
    return out


def eager_logits(
    lm: CausalLm, sequences: list[torch.Tensor], sink_token_id: int | None = None
) -> list[torch.Tensor]:
    """The HF model's own logits [len, vocab] over each full sequence, no cache: the reference.
    With an attention sink (`attention_sink`), each sequence as the program sees it: after
    that token (whose own logits are dropped)."""
    prefix = torch.tensor([] if sink_token_id is None else [sink_token_id], dtype=torch.int64)
    with torch.no_grad():
        return [
            lm.hf(input_ids=torch.cat([prefix, s])[None], use_cache=False)
            .logits[0, len(prefix):].float()
            for s in sequences
        ]


def text_sequences(
    lm: CausalLm, count: int, length: int, offset: int = 0, *, text: str | None = None,
    stride: int | None = None,
) -> list[torch.Tensor]:
    """`count` token windows of `length` from `text` (default: the model's calibration text),
    `stride` tokens apart (default half a window), starting `offset` windows in; wraps around."""
    ids = lm.encode(text if text is not None else lm.texts.calibration)
    if len(ids) < length:
        raise ConfigValidationError(
            "prepare.max_seq_len", length,
            f"the shipped text tokenizes to {len(ids)} tokens, too few for samples of {length}; "
            "use a smaller --max-seq-len / --prefill-len",
        )
    step = stride if stride is not None else max(1, length // 2)
    out = []
    for i in range(offset, offset + count):
        start = (i * step) % (len(ids) - length + 1)
        out.append(torch.tensor(ids[start : start + length], dtype=torch.int64))
    return out
