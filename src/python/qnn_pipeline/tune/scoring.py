"""A candidate's score: its fake-quantized model against the float model on the same corpus
windows, the float model's logits computed once for every candidate (the search scores many)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from qnn_common.causal_lm.steps import StepLm
from qnn_common.numerics.lm_metrics import score_window, summarize_windows
from qnn_infer.evaluation.corpus import MAX_WINDOW, windows
from qnn_infer.evaluation.data import shipped, with_eval_file
from qnn_infer.evaluation.lm import logits
from qnn_infer.evaluation.program import artifact_text
from qnn_quant.lm_steps import artifact_lm


@dataclass(frozen=True)
class Score:
    """KL divergence from the float model (mean per token, with its bootstrap interval over
    windows), same top token %, perplexity ratio, over `tokens` tokens."""

    kl: float
    kl_low: float
    kl_high: float
    same_top: float
    perplexity_ratio: float
    tokens: int

    def to_json(self) -> dict[str, Any]:
        return {"kl": round(self.kl, 6), "kl_interval": [round(self.kl_low, 6),
                                                         round(self.kl_high, 6)],
                "same_top_percent": round(self.same_top, 3),
                "perplexity_ratio": round(self.perplexity_ratio, 5), "tokens": self.tokens}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Score:
        low, high = data["kl_interval"]
        return cls(float(data["kl"]), float(low), float(high), float(data["same_top_percent"]),
                   float(data["perplexity_ratio"]), int(data["tokens"]))


@dataclass
class Reference:
    """The float model's logits over the search's windows: every candidate is scored against
    them without running the float model again."""

    windows: list[list[int]]
    logits: list[npt.NDArray[np.float32]]
    seconds: float

    @classmethod
    def of(cls, prepare: Path, tokens: int, eval_file: Path | None = None) -> Reference:
        """The float model of the prepare artifact over the first `tokens` corpus tokens (the
        shipped held-out corpus, or `eval_file`'s documents where it has some)."""
        lm = artifact_lm(prepare, "fp32")
        data = shipped() if eval_file is None else with_eval_file(shipped(), eval_file)
        text = artifact_text(prepare, lm)
        cut = windows(data.documents, text.encode, min(MAX_WINDOW, lm.spec.context), tokens)
        t = time.perf_counter()
        out = [logits(lm, ids) for ids in cut]
        return cls(cut, out, time.perf_counter() - t)

    @property
    def tokens(self) -> int:
        return sum(len(w) for w in self.windows)

    def score(self, lm: StepLm) -> Score:
        scored = [score_window(ref, logits(lm, ids), ids)
                  for ids, ref in zip(self.windows, self.logits, strict=True)]
        summary = summarize_windows(scored)
        return Score(summary.kl_mean.value, summary.kl_mean.low, summary.kl_mean.high,
                     summary.same_top_percent.value, summary.perplexity_ratio.value,
                     self.tokens)
