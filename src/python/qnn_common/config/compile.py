"""The compile stage's config: the backend (and SoC) to lower for, and the HTP's build options."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from qnn_common.config.checks import normalize_enums, soc_or_none
from qnn_common.errors import ConfigValidationError
from qnn_common.recipes import BACKENDS, Backend, Recipe, check_recipe, check_weight_sharing
from qnn_common.soc import Soc
from qnn_common.target import Target

# ExecuTorch's QnnExecuTorchHtpPerformanceMode members, by the names users type (values 0..8).
HTP_PERFORMANCE_MODES: tuple[str, ...] = (
    "default", "sustained_high_performance", "burst", "high_performance", "power_saver",
    "low_power_saver", "high_power_saver", "low_balanced", "balanced",
)
DEFAULT_HTP_PERFORMANCE_MODE = "burst"

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
        normalize_enums(self, "compile")
        sharded = self.num_shards == "auto" or (
            not isinstance(self.num_shards, bool) and isinstance(self.num_shards, int)
            and 1 <= self.num_shards <= MAX_SHARDS
        )
        if not sharded:
            raise ConfigValidationError(
                "compile.num_shards", self.num_shards,
                f'must be an integer in 1..{MAX_SHARDS}, or "auto"',
            )
        if self.num_shards != 1 and not BACKENDS[self.backend].context_shards:
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
            check_weight_sharing(self.backend, soc_or_none(self.soc, "compile.soc"),
                                 "compile.weight_sharing")
        check_recipe(self.backend, self.recipe, soc_or_none(self.soc, "compile.soc"),
                     "compile.recipe")
        _ = self.target  # validates backend / soc together
        if self.htp_performance_mode not in HTP_PERFORMANCE_MODES:
            raise ConfigValidationError(
                "compile.htp_performance_mode", self.htp_performance_mode,
                "unknown HTP performance mode", allowed=HTP_PERFORMANCE_MODES,
            )
        default_mode = self.htp_performance_mode == DEFAULT_HTP_PERFORMANCE_MODE
        if not default_mode and not BACKENDS[self.backend].compiles_for_htp:
            raise ConfigValidationError(
                "compile.htp_performance_mode", self.htp_performance_mode,
                "only the qnn backend has HTP performance modes",
            )

    @property
    def soc_info(self) -> Soc | None:
        return soc_or_none(self.soc, "compile.soc")

    @property
    def target(self) -> Target:
        """The backend (and SoC) the program is compiled for."""
        return Target(self.backend, self.soc_info)

