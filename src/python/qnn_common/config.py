"""Frozen, validated configuration of every stage.

Each config validates itself on construction, so an instance that exists is one that can run. The
pipeline builds them from flat settings or TOML (`qnn_pipeline.context`), with errors that name
the field path, the bad value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from qnn_common.errors import ConfigValidationError
from qnn_common.gates import AccuracyGates, check_gate, default_accuracy_gates
from qnn_common.llm_spec import GenerationConfig
from qnn_common.recipes import (
    DEFAULT_EMBEDDING_WEIGHTS,
    DEFAULT_GROUP_SIZE,
    Backend,
    EmbeddingWeights,
    GroupMapping,
    Recipe,
    WeightRounding,
    check_dynamic_layers,
    check_group_size,
    check_recipe,
    check_weight_rounding,
    check_weight_sharing,
    default_weight_rounding,
    parse_enum,
)
from qnn_common.soc import Soc, lookup_soc
from qnn_common.target import Target

DEFAULT_SEED = 1126

# ExecuTorch's QnnExecuTorchHtpPerformanceMode members, by the names users type (values 0..8).
HTP_PERFORMANCE_MODES: tuple[str, ...] = (
    "default", "sustained_high_performance", "burst", "high_performance", "power_saver",
    "low_power_saver", "high_power_saver", "low_balanced", "balanced",
)
DEFAULT_HTP_PERFORMANCE_MODE = "burst"
# LPBQ block along a linear weight's input dimension (upstream's Llama export uses the same).
DEFAULT_LPBQ_BLOCK = 16
# Upper bounds on work and disk a config may ask for: past these, a typo (--runs 10**9) would run
# for days or fill a disk (every calibration / eval sample is stored in the prepare artifact).
MAX_SEQ_LEN = 8192
MAX_CALIBRATION_SAMPLES = 1024
MAX_EVAL_SAMPLES = 256
MAX_WARMUP = 1000
MAX_RUNS = 100_000


class Stage(enum.StrEnum):
    """The four stages, in pipeline order."""

    PREPARE = "prepare"
    QUANTIZE = "quantize"
    COMPILE = "compile"
    INFER = "infer"

    @property
    def position(self) -> int:
        return list(Stage).index(self)


def _positive(name: str, value: int, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigValidationError(name, value, f"must be an integer >= {minimum}")


def regex_list(name: str, value: object) -> tuple[str, ...] | None:
    """`value` (None, or a list of regular expressions) as a tuple, each pattern compiled once."""
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, list | tuple) or not all(
        isinstance(p, str) for p in value
    ):
        raise ConfigValidationError(name, value, "must be a list of regexes")
    for pattern in value:
        try:
            re.compile(pattern)
        except re.error as err:
            raise ConfigValidationError(
                name, pattern, f"not a regular expression: {err}"
            ) from None
    return tuple(value)


def _bounded(name: str, value: int, minimum: int, maximum: int, why: str) -> None:
    """An integer in minimum..maximum; `why` says what the upper bound protects, for the message."""
    _positive(name, value, minimum)
    if value > maximum:
        raise ConfigValidationError(name, value, f"must be at most {maximum:,}: {why}")


def _normalize_enums(config: object, section: str) -> None:
    """Accept "qnn" for Backend.QNN (and so on) from Python callers; reject anything else."""
    for name, kind in (("backend", Backend), ("recipe", Recipe)):
        value = getattr(config, name)
        if not isinstance(value, kind):
            object.__setattr__(config, name, parse_enum(kind, str(value), f"{section}.{name}"))


def _soc_or_none(name: str | None, path: str) -> Soc | None:
    return None if name is None else lookup_soc(name, path)


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
    # for XNNPACK. The pipeline sets it from the backend (`BackendTraits.llm_custom_ops`).
    custom_ops: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise ConfigValidationError(
                "prepare.model",
                self.model,
                "name a model: a built-in (see --list-models), a Hugging Face directory, "
                "or package.module:function",
            )
        _bounded("prepare.seq_len", self.seq_len, 2, MAX_SEQ_LEN,
                 "a model's own limit (max_position_embeddings) is checked when it loads")
        _bounded("prepare.calibration_samples", self.calibration_samples, 1,
                 MAX_CALIBRATION_SAMPLES, "observers settle within a few hundred samples, and "
                 "each one is stored in calibration.pt and run through the model")
        _bounded("prepare.eval_samples", self.eval_samples, 1, MAX_EVAL_SAMPLES,
                 "each one is stored with its reference outputs and run in every stage")
        _positive("prepare.seed", self.seed, minimum=0)
        if self.max_seq_len is not None:
            _positive("prepare.max_seq_len", self.max_seq_len, minimum=2)
        if self.prefill_len is not None:
            _positive("prepare.prefill_len", self.prefill_len)
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


@dataclass(frozen=True)
class QuantizeConfig:
    """Post-training quantization: which quantizer (backend, SoC) and which recipe."""

    backend: Backend = Backend.XNNPACK
    recipe: Recipe = Recipe.A8W8
    soc: str | None = None
    # Weights with one scale per output channel (False: one per tensor).
    per_channel: bool = True
    # 16a4w_block (LPBQ) only: weights share a scale in blocks of this many input channels.
    block_size: int = DEFAULT_LPBQ_BLOCK
    # 8da4w only: input channels per 4-bit weight scale (qnn_common.recipes.DEFAULT_GROUP_SIZE).
    group_size: int = DEFAULT_GROUP_SIZE
    # 8da4w and 16a4w_block: how a 4-bit group's (or LPBQ block's) levels map to values
    # (qnn_common.recipes.GroupMapping). None: the recipe's default (default_group_mapping:
    # asymmetric for 8da4w, symmetric for 16a4w_block).
    group_mapping: GroupMapping | None = None
    # 8da4w and 16a4w_block: regexes over module paths of linear layers given 8-bit weights (one
    # scale per output channel) instead of 4-bit groups or blocks. None: the default (a causal
    # LM's output head, recipes.DEFAULT_INT8_WEIGHTS).
    int8_weights: tuple[str, ...] | None = None
    # 8da4w only: how embedding tables are stored (qnn_common.recipes.EmbeddingWeights).
    embedding_weights: EmbeddingWeights = DEFAULT_EMBEDDING_WEIGHTS
    # The worst layers (by SQNR vs fp32) to report; 0 skips the per-layer pass.
    report_layers: int = 10
    # Regexes over nn.Module paths of layers to leave in float. None: the default
    # (qnn_quant.layers: BERT-style outlier layers at 8-bit activations on xnnpack / portable,
    # none on qnn); () quantizes everything. A float linear on qnn is refused.
    keep_float: tuple[str, ...] | None = None
    # Regexes over nn.Module paths of linear layers whose activations are quantized at run time
    # (XNNPACK, portable). None: the default (encoder blocks' linears at 8-bit activations).
    dynamic_layers: tuple[str, ...] | None = None
    # None: the default (GPTQ for 4-bit per-channel weights, nearest otherwise).
    weight_rounding: WeightRounding | None = None

    def __post_init__(self) -> None:
        _normalize_enums(self, "quantize")
        if self.weight_rounding is not None and not isinstance(
            self.weight_rounding, WeightRounding
        ):
            object.__setattr__(self, "weight_rounding", parse_enum(
                WeightRounding, str(self.weight_rounding), "quantize.weight_rounding"))
        if not isinstance(self.embedding_weights, EmbeddingWeights):
            object.__setattr__(self, "embedding_weights", parse_enum(
                EmbeddingWeights, str(self.embedding_weights), "quantize.embedding_weights"))
        if self.group_mapping is not None and not isinstance(self.group_mapping, GroupMapping):
            object.__setattr__(self, "group_mapping", parse_enum(
                GroupMapping, str(self.group_mapping), "quantize.group_mapping"))
        for name in ("keep_float", "dynamic_layers", "int8_weights"):
            object.__setattr__(self, name, regex_list(f"quantize.{name}", getattr(self, name)))
        if self.dynamic_layers is not None:
            check_dynamic_layers(self.backend, self.dynamic_layers, "quantize.dynamic_layers")
            if self.recipe.is_dynamic and self.dynamic_layers:
                raise ConfigValidationError(
                    "quantize.dynamic_layers", list(self.dynamic_layers),
                    f"{self.recipe.value} quantizes every linear layer's activations at run "
                    "time already; leave dynamic_layers unset (keep_float still leaves layers "
                    "float)",
                )
        if not self.recipe.is_quantized:
            raise ConfigValidationError(
                "quantize.recipe",
                self.recipe.value,
                "a float recipe needs no quantization; skip the quantize stage instead",
                allowed=tuple(r.value for r in Recipe if r.is_quantized),
            )
        check_recipe(self.backend, self.recipe, _soc_or_none(self.soc, "quantize.soc"),
                     "quantize.recipe")
        _positive("quantize.report_layers", self.report_layers, minimum=0)
        _positive("quantize.block_size", self.block_size, minimum=2)
        if self.block_size != DEFAULT_LPBQ_BLOCK and self.recipe is not Recipe.A16W4_BLOCK:
            raise ConfigValidationError(
                "quantize.block_size", self.block_size,
                "only the 16a4w_block (LPBQ) recipe quantizes weights in blocks",
            )
        check_group_size(self.backend, self.recipe, self.group_size, "quantize.group_size")
        if self.group_mapping is not None and not self.recipe.has_weight_groups:
            raise ConfigValidationError(
                "quantize.group_mapping", self.group_mapping.value,
                f"only 8da4w's groups and 16a4w_block's blocks map 4-bit levels one way or "
                f"the other; {self.recipe.value} does not: drop group_mapping or use --recipe "
                "8da4w (CPU) or 16a4w_block (QNN)",
            )
        if self.int8_weights is not None and not self.recipe.has_weight_groups:
            raise ConfigValidationError(
                "quantize.int8_weights", self.int8_weights,
                f"only 8da4w's groups and 16a4w_block's blocks have 8-bit layers among their "
                f"4-bit weights; {self.recipe.value} does not: drop int8_weights or use "
                "--recipe 8da4w (CPU) or 16a4w_block (QNN)",
            )
        if not self.recipe.is_dynamic and self.embedding_weights != DEFAULT_EMBEDDING_WEIGHTS:
            raise ConfigValidationError(
                "quantize.embedding_weights", self.embedding_weights,
                f"only 8da4w has quantized embedding tables; {self.recipe.value} does not: drop "
                "embedding_weights or use --recipe 8da4w",
            )
        if self.recipe.is_dynamic and not self.per_channel:
            raise ConfigValidationError(
                "quantize.per_channel", False,
                f"{self.recipe.value} gives its weights one scale per group of group_size input "
                "channels of each output channel; drop --per-tensor (a larger group_size "
                "means fewer scales)",
            )
        check_weight_rounding(self.recipe, self.rounding, self.per_channel,
                              "quantize.weight_rounding")
        _ = self.target  # validates backend / soc together

    @property
    def rounding(self) -> WeightRounding:
        """The weight rounding in effect: the one asked for, else the recipe's default."""
        if self.weight_rounding is None:
            return default_weight_rounding(self.recipe, self.per_channel)
        return self.weight_rounding

    @property
    def soc_info(self) -> Soc | None:
        return _soc_or_none(self.soc, "quantize.soc")

    @property
    def target(self) -> Target:
        """The target the quantizer prepares the program for."""
        return Target(self.backend, self.soc_info)


MAX_SHARDS = 64  # more HTP contexts than any decoder has layers to split


@dataclass(frozen=True)
class CompileConfig:
    """Lowering to an ExecuTorch program for one backend (and SoC, for qnn)."""

    backend: Backend = Backend.XNNPACK
    recipe: Recipe = Recipe.FP32
    soc: str | None = None
    # Write ExecuTorch's ETRecord beside the .pte (for devtools' Inspector).
    etrecord: bool = False
    # QNN HTP only: the power / clock vote the context binary is built with (burst = upstream's
    # default for benchmarks). It is recorded in the program, so it is part of the cache key.
    htp_performance_mode: str = DEFAULT_HTP_PERFORMANCE_MODE
    # QNN, a program of several methods (a causal LM): one copy of the weights in the context
    # binary, shared by the methods' graphs (recipes.check_weight_sharing). For a device: the
    # x86 emulator cannot load such a program.
    weight_sharing: bool = False
    # QNN, a causal LM: its decoder layers split into this many HTP contexts per method, chained
    # inside the .pte (qnn_compile/shards.py): what keeps each context under the device's limit.
    # "auto": the fewest whose estimated sizes fit (qnn_compile/shard_sizes.py).
    num_shards: int | Literal["auto"] = 1

    def __post_init__(self) -> None:
        _normalize_enums(self, "compile")
        sharded = self.num_shards == "auto" or (
            not isinstance(self.num_shards, bool) and isinstance(self.num_shards, int)
            and 1 <= self.num_shards <= MAX_SHARDS
        )
        if not sharded:
            raise ConfigValidationError(
                "compile.num_shards", self.num_shards,
                f'must be an integer in 1..{MAX_SHARDS}, or "auto"',
            )
        if self.num_shards != 1 and self.backend is not Backend.QNN:
            raise ConfigValidationError(
                "compile.num_shards", self.num_shards,
                f"only the qnn backend splits a program into HTP contexts; {self.backend.value} "
                "runs it whole: drop --num-shards",
            )
        if not isinstance(self.weight_sharing, bool):
            raise ConfigValidationError(
                "compile.weight_sharing", self.weight_sharing, "must be true or false"
            )
        if self.weight_sharing:
            check_weight_sharing(self.backend, _soc_or_none(self.soc, "compile.soc"),
                                 "compile.weight_sharing")
        check_recipe(self.backend, self.recipe, _soc_or_none(self.soc, "compile.soc"),
                     "compile.recipe")
        _ = self.target  # validates backend / soc together
        if self.htp_performance_mode not in HTP_PERFORMANCE_MODES:
            raise ConfigValidationError(
                "compile.htp_performance_mode", self.htp_performance_mode,
                "unknown HTP performance mode", allowed=HTP_PERFORMANCE_MODES,
            )
        default_mode = self.htp_performance_mode == DEFAULT_HTP_PERFORMANCE_MODE
        if not default_mode and self.backend is not Backend.QNN:
            raise ConfigValidationError(
                "compile.htp_performance_mode", self.htp_performance_mode,
                "only the qnn backend has HTP performance modes",
            )

    @property
    def soc_info(self) -> Soc | None:
        return _soc_or_none(self.soc, "compile.soc")

    @property
    def target(self) -> Target:
        """The backend (and SoC) the program is compiled for."""
        return Target(self.backend, self.soc_info)


@dataclass(frozen=True)
class InferConfig:
    """Running the program: how many timed runs, on which inputs, and the accuracy it must reach.

    The gates (`min_*`, `max_*`) are None for "the default for the program's recipe"
    (`default_accuracy_gates`): infer learns the recipe from the compile artifact, and resolves
    them with `gates_for`. `accuracy_gates=False` keeps reporting the numbers but checks none.
    """

    # Untimed runs before the timed ones.
    warmup: int = 3
    # Timed runs (latency p50 / p90 over them).
    runs: int = 20
    # A .pt of inputs to run instead of the eval inputs (a bare .pte needs one).
    inputs_file: Path | None = None
    # Write ExecuTorch's ETDump of the runs (needs a runtime built with event tracing).
    etdump: bool = False
    # CPU threads of the runtime's threadpool (XNNPACK's kernels run on it); None: every core
    # this process may use.
    threads: int | None = None
    # Run on an Android device over adb instead of the host: its serial, or "auto" for the only
    # connected one; `device_runner` is the executor runner built for Android (arm64).
    device: str | None = None
    # With device: the executor runner binary built for Android arm64.
    device_runner: Path | None = None
    # Accuracy gates (None: the default for the program's recipe, `qnn-infer --help`): the
    # lowest SQNR of the outputs vs the fp32 reference,
    min_sqnr_db_vs_fp32: float | None = None
    # the lowest cosine vs the fp32 reference,
    min_cosine_vs_fp32: float | None = None
    # the lowest SQNR vs the fake-quantized model's outputs,
    min_sqnr_db_vs_fake_quant: float | None = None
    # the lowest cosine vs the fake-quantized model's outputs.
    min_cosine_vs_fake_quant: float | None = None
    # Causal LMs: the highest program / fake-quant perplexity ratio of the held-out text.
    max_perplexity_vs_fake_quant: float | None = None
    # False: report the accuracy, judge no gate.
    accuracy_gates: bool = True
    # Causal-LM programs (prefill + decode): what to generate after the teacher-forced check.
    # None: the default prompt and settings of `GenerationConfig`.
    generation: GenerationConfig | None = None

    def __post_init__(self) -> None:
        _bounded("infer.warmup", self.warmup, 0, MAX_WARMUP,
                 "a few runs warm the caches; more only take time")
        _bounded("infer.runs", self.runs, 1, MAX_RUNS,
                 "latency quantiles settle within a few hundred runs")
        if self.threads is not None:
            _bounded("infer.threads", self.threads, 1, 1024,
                     "more threads than that only contend for the same cores")
        for f in dataclasses.fields(AccuracyGates):
            value = getattr(self, f.name)
            check_gate(f"infer.{f.name}", value)
            if isinstance(value, int):  # 40 and 40.0 are one gate (and one cache key)
                object.__setattr__(self, f.name, float(value))
        if not isinstance(self.accuracy_gates, bool):
            raise ConfigValidationError(
                "infer.accuracy_gates", self.accuracy_gates, "must be true or false"
            )
        if self.device is not None and (not isinstance(self.device, str) or not self.device):
            raise ConfigValidationError(
                "infer.device", self.device, "an adb serial, or \"auto\" for the only device"
            )
        if self.etdump and self.device is not None:
            raise ConfigValidationError(
                "infer.etdump", True,
                "ETDump is recorded by the host runtime; a device run reports the runner's own "
                "timings instead: drop --etdump or --device",
            )
        if self.device_runner is not None and self.device is None:
            raise ConfigValidationError(
                "infer.device_runner", str(self.device_runner),
                "only used with a device; pass --device SERIAL (or auto) too",
            )

    def gates_for(self, recipe: Recipe | None, causal_lm: bool = False) -> AccuracyGates:
        """The gates to apply to a program compiled with `recipe` (None: unknown, e.g. a bare
        .pte; `causal_lm`: a prefill + decode program): each gate set here, else the recipe's
        default; none at all if gates are off."""
        if not self.accuracy_gates:
            return AccuracyGates()
        default = (
            default_accuracy_gates(recipe, causal_lm) if recipe is not None else AccuracyGates()
        )
        return AccuracyGates(**{
            f.name: value if (value := getattr(self, f.name)) is not None
            else getattr(default, f.name)
            for f in dataclasses.fields(AccuracyGates)
        })
