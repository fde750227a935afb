"""Frozen, validated configuration of every stage: a module per stage, and `Stage` itself.

Each config validates itself on construction, so an instance that exists is one that can run. The
pipeline builds them from flat settings or TOML (`qnn_pipeline.context`), with errors that name
the field path, the bad value and what is allowed.
"""

from __future__ import annotations

import enum

from qnn_common.config.checks import (
    MAX_CALIBRATION_SAMPLES,
    MAX_EVAL_SAMPLES,
    MAX_RUNS,
    MAX_SEQ_LEN,
    MAX_WARMUP,
    regex_list,
)
from qnn_common.config.compile import (
    DEFAULT_HTP_PERFORMANCE_MODE,
    HTP_PERFORMANCE_MODES,
    MAX_SHARDS,
    CompileConfig,
)
from qnn_common.config.infer import InferConfig
from qnn_common.config.prepare import DEFAULT_SEED, PrepareConfig
from qnn_common.config.quantize import DEFAULT_LPBQ_BLOCK, QuantizeConfig

__all__ = [
    "DEFAULT_HTP_PERFORMANCE_MODE",
    "DEFAULT_LPBQ_BLOCK",
    "DEFAULT_SEED",
    "HTP_PERFORMANCE_MODES",
    "MAX_CALIBRATION_SAMPLES",
    "MAX_EVAL_SAMPLES",
    "MAX_RUNS",
    "MAX_SEQ_LEN",
    "MAX_SHARDS",
    "MAX_WARMUP",
    "CompileConfig",
    "InferConfig",
    "PrepareConfig",
    "QuantizeConfig",
    "Stage",
    "regex_list",
]


class Stage(enum.StrEnum):
    """The four stages, in pipeline order."""

    PREPARE = "prepare"
    QUANTIZE = "quantize"
    COMPILE = "compile"
    INFER = "infer"

    @property
    def position(self) -> int:
        return list(Stage).index(self)
