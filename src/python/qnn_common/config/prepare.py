"""The prepare stage's config: which model, and how its samples are drawn."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qnn_common.config.checks import (
    MAX_CALIBRATION_SAMPLES,
    MAX_EVAL_SAMPLES,
    MAX_SEQ_LEN,
    bounded,
    positive,
)
from qnn_common.errors import ConfigValidationError

DEFAULT_SEED = 1126


@dataclass(frozen=True)
class PrepareConfig:
    """What to load and how to sample it."""

    model: str
    # Tokens per sample for text models (a causal LM's calibration and eval windows too).
    seq_len: int = 128
    # Samples that calibrate the quantizer's observers.
    calibration_samples: int = 16
    # Held-out samples (never calibration ones) that judge accuracy; the first is the example.
    eval_samples: int = 4
    # Calibration data of your own: a text file (one sample per line) or a .pt of input tuples.
    calibration_file: Path | None = None
    # Seeds torch for export, sampling and the built-in models' weights.
    seed: int = DEFAULT_SEED
    # Causal LMs only: export `prefill` + `decode` methods over a static KV cache (the program
    # generates), with this context length (None: min(512, max_position_embeddings)) and prefill
    # chunk (None: min(32, max_seq_len // 2)).
    kv_cache: bool = False
    # With kv_cache: the context length (the cache's size).
    max_seq_len: int | None = None
    # With kv_cache: tokens per prefill call.
    prefill_len: int | None = None
    # With kv_cache: keep the cache outside the program, as the methods' inputs and outputs (for
    # backends without mutable buffers: QNN). The pipeline sets it from the backend.
    kv_io: bool = False
    # With kv_cache: write and read the cache with ExecuTorch's LLM custom ops (update_cache,
    # custom_sdpa) instead of transformers' static cache; what ExecuTorch's own Llama export does
    # for XNNPACK. None: where the model's attention is what custom_sdpa computes (plain causal
    # attention), the pipeline's default on backends that have them (`BackendTraits.
    # llm_custom_ops`); true refuses a model whose attention is not that.
    custom_ops: bool | None = False
    # With kv_io: the cache's first slot holds the tokenizer's BOS token, computed in float here,
    # and every text follows it (`LlmSpec.sink_token_id`): the program never computes the
    # first token's outsized activations, so 16-bit activations get a far finer grid. No effect
    # on a model whose tokenizer has no BOS token.
    attention_sink: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise ConfigValidationError(
                "prepare.model",
                self.model,
                "name a model: a built-in (see --list-models), a Hugging Face directory, "
                "or package.module:function",
            )
        bounded("prepare.seq_len", self.seq_len, 2, MAX_SEQ_LEN,
                 "a model's own limit (max_position_embeddings) is checked when it loads")
        bounded("prepare.calibration_samples", self.calibration_samples, 1,
                 MAX_CALIBRATION_SAMPLES, "observers settle within a few hundred samples, and "
                 "each one is stored in calibration.pt and run through the model")
        bounded("prepare.eval_samples", self.eval_samples, 1, MAX_EVAL_SAMPLES,
                 "each one is stored with its reference outputs and run in every stage")
        positive("prepare.seed", self.seed, minimum=0)
        if self.max_seq_len is not None:
            positive("prepare.max_seq_len", self.max_seq_len, minimum=2)
        if self.prefill_len is not None:
            positive("prepare.prefill_len", self.prefill_len)
        if self.kv_io and not self.kv_cache:
            raise ConfigValidationError(
                "prepare.kv_io", True, "shapes a KV-cache export: set kv_cache too"
            )
        if self.custom_ops and (self.kv_io or not self.kv_cache):
            raise ConfigValidationError(
                "prepare.custom_ops", True,
                "writes a static KV cache in place: set kv_cache, and not kv_io (a cache kept "
                "by the host, as QNN's is, is the methods' inputs and outputs, with no ops to "
                "write it); ExecuTorch's LLM custom ops run on xnnpack and portable",
            )
        if (self.max_seq_len is not None or self.prefill_len is not None) and not self.kv_cache:
            raise ConfigValidationError(
                "prepare.max_seq_len", self.max_seq_len,
                "max_seq_len / prefill_len shape a KV-cache export: set kv_cache too "
                "(qnn-prepare --kv-cache, or qnn-pipeline --prompt)",
            )

