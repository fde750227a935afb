"""The infer stage's config: timed runs, where they run, and the accuracy gates they must pass."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from qnn_common.config.checks import MAX_RUNS, MAX_WARMUP, bounded
from qnn_common.errors import ConfigValidationError
from qnn_common.gates import AccuracyGates, check_gate, default_accuracy_gates
from qnn_common.llm_spec import GenerationConfig
from qnn_common.recipes import Recipe


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
    # The ETDump read into a per-op table, profile.md / profile.json beside the run (implies
    # etdump).
    profile: bool = False
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
    # Causal LMs, next token vs fp32 on the held-out text: the highest mean KL divergence (nats,
    # judged by its interval's low end) and the lowest same-top-token % (by its high end).
    max_kl_vs_fp32: float | None = None
    min_same_top_percent_vs_fp32: float | None = None
    # False: report the accuracy, judge no gate.
    accuracy_gates: bool = True
    # Causal-LM programs (prefill + decode): what to generate after the teacher-forced check.
    # None: the default prompt and settings of `GenerationConfig`.
    generation: GenerationConfig | None = None

    def __post_init__(self) -> None:
        bounded("infer.warmup", self.warmup, 0, MAX_WARMUP,
                 "a few runs warm the caches; more only take time")
        bounded("infer.runs", self.runs, 1, MAX_RUNS,
                 "latency quantiles settle within a few hundred runs")
        if self.threads is not None:
            bounded("infer.threads", self.threads, 1, 1024,
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
        if self.profile and not self.etdump:
            object.__setattr__(self, "etdump", True)
        if self.etdump and self.device is not None:
            raise ConfigValidationError(
                "infer.profile" if self.profile else "infer.etdump", True,
                "ETDump is recorded by the host runtime; a device run reports the runner's own "
                "timings instead: drop --etdump / --profile, or --device",
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
