"""How a causal LM's next-token distributions differ from a reference's on the same tokens (numpy
only, float64): the figures llama.cpp's ``llama-perplexity --kl-divergence`` reports for its own
quantizations, and perplexity with an interval that says how far it can move.

Every function takes the reference first. Logits come one array per evaluation window,
[positions, vocab], position i scoring token i + 1 of the same window (as `perplexity`).

* `kl_divergence`: per-token KL(reference || candidate) of the softmaxes, summarized as mean,
  median, p99 and max (`KlStats`).
* `top_token_agreement`: how often the candidate's most likely token is the reference's, and at
  each position where it is not, the reference's own top-1 over top-2 margin, so that a flip on a
  near tie (the reference itself barely preferred its token) is told from a broken program.
* `perplexity_interval` / `perplexity_ratio_interval`: a percentile bootstrap over windows (not
  tokens: a window's tokens are not independent of each other), seeded so that a figure repeats
  run to run; the ratio resamples the same windows for both models (paired), so that what the
  two share (a hard window) cancels instead of widening the interval. `summarize_windows` gives
  the mean KL and the same-top % the same kind of interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from qnn_common.numerics.metrics import json_float

Floats = npt.NDArray[np.float64]

# A flip where the reference's own top two were closer than this (nats) is a near tie: the
# float model itself barely chose, so the candidate choosing otherwise says little about it.
NEAR_TIE_NATS = 0.1
BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95


def log_softmax(logits: npt.ArrayLike) -> Floats:
    """log of the softmax over the last axis, through log-sum-exp (no overflow for large logits)."""
    x = np.asarray(logits, dtype=np.float64)
    top = np.max(x, axis=-1, keepdims=True)
    # An all -inf row would make top -inf and every shifted value nan; shift such a row by 0.
    top = np.where(np.isfinite(top), top, 0.0)
    shifted = x - top
    with np.errstate(divide="ignore"):
        result: Floats = shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))
    return result


def token_kl(reference: npt.ArrayLike, candidate: npt.ArrayLike) -> Floats:
    """KL(reference || candidate) in nats at each position of one window ([positions, vocab])."""
    ref_log = log_softmax(reference)
    cand_log = log_softmax(candidate)
    if ref_log.shape != cand_log.shape:
        raise ValueError(f"logits of shape {cand_log.shape} for a reference of {ref_log.shape}")
    p = np.exp(ref_log)
    # Where the reference gives a token no mass, it adds nothing, whatever the candidate gives it
    # (0 * -inf would be nan).
    with np.errstate(invalid="ignore"):
        terms = np.where(p > 0, p * (ref_log - cand_log), 0.0)
    # KL is >= 0; summing nearly equal distributions can round to a hair below.
    kl: Floats = np.maximum(np.sum(terms, axis=-1), 0.0)
    return kl


@dataclass(frozen=True)
class KlStats:
    """Per-token KL divergence from the reference, in nats, over `tokens` positions."""

    mean: float
    median: float
    p99: float
    max: float
    tokens: int

    def to_json(self) -> dict[str, Any]:
        return {"mean": json_float(self.mean), "median": json_float(self.median),
                "p99": json_float(self.p99), "max": json_float(self.max), "tokens": self.tokens}


def kl_divergence(
    reference: Sequence[npt.ArrayLike], candidate: Sequence[npt.ArrayLike]
) -> KlStats:
    """`token_kl` over every position of every window, summarized."""
    per_token = np.concatenate([token_kl(r, c).ravel() for r, c in _windows(reference, candidate)])
    if not per_token.size:
        raise ValueError("KL divergence needs at least one position")
    return KlStats(
        mean=float(np.mean(per_token)), median=float(np.median(per_token)),
        p99=float(np.percentile(per_token, 99)), max=float(np.max(per_token)),
        tokens=int(per_token.size),
    )


@dataclass(frozen=True)
class TopTokenAgreement:
    """How often the candidate's most likely next token is the reference's, over `tokens`
    positions; `flip_margins` holds the reference's top-1 minus top-2 logit (nats) at each
    position where it is not, in order, and `near_ties` counts those below `near_tie_nats`."""

    tokens: int
    same_top: int
    flip_margins: tuple[float, ...]
    near_tie_nats: float = NEAR_TIE_NATS

    @property
    def same_top_percent(self) -> float:
        return 100.0 * self.same_top / self.tokens if self.tokens else 0.0

    @property
    def flips(self) -> int:
        return self.tokens - self.same_top

    @property
    def near_ties(self) -> int:
        return sum(1 for m in self.flip_margins if m < self.near_tie_nats)

    def to_json(self) -> dict[str, Any]:
        return {
            "same_top_percent": round(self.same_top_percent, 3), "tokens": self.tokens,
            "flips": self.flips, "near_tie_flips": self.near_ties,
            "near_tie_nats": self.near_tie_nats,
            "median_flip_margin": (round(float(np.median(self.flip_margins)), 4)
                                   if self.flip_margins else None),
        }


def top_token_agreement(
    reference: Sequence[npt.ArrayLike], candidate: Sequence[npt.ArrayLike],
    near_tie_nats: float = NEAR_TIE_NATS,
) -> TopTokenAgreement:
    """Same-top count and, at each flip, the reference's top-1 over top-2 margin."""
    tokens = same = 0
    margins: list[float] = []
    for ref, cand in _windows(reference, candidate):
        r = np.asarray(ref, dtype=np.float64)
        c = np.asarray(cand, dtype=np.float64)
        if r.shape != c.shape:
            raise ValueError(f"logits of shape {c.shape} for a reference of {r.shape}")
        r = r.reshape(-1, r.shape[-1])
        c = c.reshape(-1, c.shape[-1])
        agree = r.argmax(-1) == c.argmax(-1)
        tokens += int(agree.size)
        same += int(agree.sum())
        if r.shape[-1] < 2:
            continue  # one token in the vocabulary: nothing can flip
        # Logit differences are log-probability differences: the margin is in nats as it is.
        top2 = np.sort(np.partition(r[~agree], -2, axis=-1)[:, -2:], axis=-1)
        margins.extend(float(m) for m in top2[:, 1] - top2[:, 0])
    return TopTokenAgreement(tokens, same, tuple(margins), near_tie_nats)


@dataclass(frozen=True)
class Interval:
    """A point estimate and its percentile-bootstrap interval over `windows` windows."""

    value: float
    low: float
    high: float
    windows: int
    confidence: float = CONFIDENCE
    resamples: int = BOOTSTRAP_RESAMPLES
    seed: int = BOOTSTRAP_SEED

    def to_json(self, digits: int = 4) -> dict[str, Any]:
        return {"value": json_float(round(self.value, digits)),
                "low": json_float(round(self.low, digits)),
                "high": json_float(round(self.high, digits)), "windows": self.windows,
                "confidence": self.confidence, "resamples": self.resamples, "seed": self.seed}


def window_nll(
    logits: Sequence[npt.ArrayLike], tokens: Sequence[npt.ArrayLike]
) -> tuple[Floats, Floats]:
    """Each window's summed negative log-likelihood of its next tokens, and how many it scored."""
    if len(logits) != len(tokens):
        raise ValueError(f"{len(logits)} logits arrays for {len(tokens)} token sequences")
    sums, counts = [], []
    for scores, ids in zip(logits, tokens, strict=True):
        x = np.asarray(scores, dtype=np.float64)[:-1]
        target = np.asarray(ids, dtype=np.int64).ravel()[1:]
        if x.shape[0] != target.shape[0]:
            raise ValueError(f"logits for {x.shape[0] + 1} positions, {target.shape[0] + 1} tokens")
        if not target.size:
            continue
        logp = log_softmax(x)
        sums.append(-float(logp[np.arange(target.size), target].sum()))
        counts.append(float(target.size))
    if not counts:
        raise ValueError("perplexity needs texts of at least 2 tokens")
    return np.asarray(sums), np.asarray(counts)


def perplexity(logits: Sequence[npt.ArrayLike], tokens: Sequence[npt.ArrayLike]) -> float:
    """exp of the mean negative log-likelihood of each next token: position i's logits
    ([positions, vocab] per text) score token i + 1 of the same text, over every text."""
    nll, count = window_nll(logits, tokens)
    return math.exp(nll.sum() / count.sum())


def _resampled(windows: int, resamples: int, seed: int) -> npt.NDArray[np.int64]:
    """[resamples, windows] window indices drawn with replacement."""
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    return np.random.default_rng(seed).integers(0, windows, size=(resamples, windows))


def _bounds(samples: Floats, confidence: float) -> tuple[float, float]:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(samples, [tail, 100 - tail])
    return float(low), float(high)


def perplexity_interval(
    logits: Sequence[npt.ArrayLike], tokens: Sequence[npt.ArrayLike],
    resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
    confidence: float = CONFIDENCE,
) -> Interval:
    """Perplexity (`perplexity`'s) and its bootstrap interval over windows."""
    nll, count = window_nll(logits, tokens)
    return _perplexity_interval(nll, count, resamples, seed, confidence)


def _perplexity_interval(
    nll: Floats, count: Floats, resamples: int, seed: int, confidence: float
) -> Interval:
    idx = _resampled(nll.size, resamples, seed)
    samples = np.exp(nll[idx].sum(axis=1) / count[idx].sum(axis=1))
    low, high = _bounds(samples, confidence)
    return Interval(math.exp(nll.sum() / count.sum()), low, high, int(nll.size), confidence,
                    resamples, seed)


def perplexity_ratio_interval(
    reference: Sequence[npt.ArrayLike], candidate: Sequence[npt.ArrayLike],
    tokens: Sequence[npt.ArrayLike], resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED, confidence: float = CONFIDENCE,
) -> Interval:
    """Candidate perplexity / reference perplexity on the same windows, with a paired bootstrap
    interval (each resample draws the same windows for both)."""
    ref_nll, count = window_nll(reference, tokens)
    cand_nll, cand_count = window_nll(candidate, tokens)
    if not np.array_equal(count, cand_count):
        raise ValueError("the candidate's windows do not score the reference's tokens")
    return _ratio_interval(ref_nll, cand_nll, count, resamples, seed, confidence)


def _ratio_interval(
    ref_nll: Floats, cand_nll: Floats, count: Floats, resamples: int, seed: int,
    confidence: float,
) -> Interval:
    idx = _resampled(count.size, resamples, seed)
    samples = np.exp((cand_nll[idx].sum(axis=1) - ref_nll[idx].sum(axis=1))
                     / count[idx].sum(axis=1))
    low, high = _bounds(samples, confidence)
    return Interval(math.exp((cand_nll.sum() - ref_nll.sum()) / count.sum()), low, high,
                    int(count.size), confidence, resamples, seed)


@dataclass(frozen=True)
class NextTokenComparison:
    """A candidate's next-token distributions against the reference's on the same windows."""

    kl: KlStats
    top: TopTokenAgreement
    perplexity: Interval
    perplexity_ratio: Interval
    # The mean KL and the same-top % with their bootstrap intervals over the same windows, so a
    # gate can judge them as it judges perplexity: by the end of the interval noise cannot reach.
    kl_mean: Interval
    same_top_percent: Interval
    # The same top token, or a flip where the reference itself barely chose (a near tie): how
    # often the candidate agrees where the reference decided. What a gate judges: a broken
    # program flips decided positions, a near-flat model's rounding flips near ties.
    same_top_decided_percent: Interval

    def to_json(self) -> dict[str, Any]:
        return {
            "kl_divergence": {**self.kl.to_json(), "mean_interval": self.kl_mean.to_json(5)},
            **self.top.to_json(),
            "same_top_percent_interval": self.same_top_percent.to_json(3),
            "same_top_decided_percent": self.same_top_decided_percent.to_json(3),
            "perplexity": self.perplexity.to_json(),
            "perplexity_ratio": self.perplexity_ratio.to_json(digits=5),
        }


@dataclass(frozen=True)
class WindowScore:
    """What one window contributes to a `NextTokenComparison`, with its logits dropped: the
    per-position KL divergence, the same-top count and flip margins, and both models' summed
    next-token NLL. A long corpus is scored a window at a time (`score_window`), so that its
    logits ([positions, vocab] per model) never have to be held together."""

    kl: Floats
    same_top: int
    flip_margins: tuple[float, ...]
    reference_nll: float
    candidate_nll: float
    scored: int  # next tokens scored: positions - 1


def score_window(
    reference: npt.ArrayLike, candidate: npt.ArrayLike, ids: npt.ArrayLike
) -> WindowScore:
    """One window's `WindowScore` (logits [positions, vocab], ids [positions])."""
    top = top_token_agreement([reference], [candidate])
    kl = token_kl(reference, candidate).ravel()
    if np.asarray(ids).size < 2:  # nothing to predict in a one-token window
        return WindowScore(kl, top.same_top, top.flip_margins, 0.0, 0.0, 0)
    ref_nll, count = window_nll([reference], [ids])
    cand_nll, _ = window_nll([candidate], [ids])
    return WindowScore(kl, top.same_top, top.flip_margins, float(ref_nll.sum()),
                       float(cand_nll.sum()), int(count.sum()))


def summarize_windows(
    scores: Sequence[WindowScore], resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED, confidence: float = CONFIDENCE,
) -> NextTokenComparison:
    """The figures of `compare_next_tokens` from windows scored one by one."""
    if not scores:
        raise ValueError("no windows to summarize")
    per_token = np.concatenate([s.kl for s in scores])
    kl = KlStats(
        mean=float(np.mean(per_token)), median=float(np.median(per_token)),
        p99=float(np.percentile(per_token, 99)), max=float(np.max(per_token)),
        tokens=int(per_token.size),
    )
    top = TopTokenAgreement(int(per_token.size), sum(s.same_top for s in scores),
                            tuple(m for s in scores for m in s.flip_margins))
    positions = np.asarray([float(s.kl.size) for s in scores])
    kl_mean = _mean_interval(np.asarray([float(s.kl.sum()) for s in scores]), positions,
                             resamples, seed, confidence)
    same_top = _mean_interval(np.asarray([100.0 * s.same_top for s in scores]), positions,
                              resamples, seed, confidence)
    decided = _mean_interval(
        np.asarray([100.0 * (s.same_top + sum(1 for m in s.flip_margins if m < NEAR_TIE_NATS))
                    for s in scores]), positions, resamples, seed, confidence)
    ref = np.asarray([s.reference_nll for s in scores])
    cand = np.asarray([s.candidate_nll for s in scores])
    count = np.asarray([float(s.scored) for s in scores])
    if not count.sum():
        raise ValueError("perplexity needs texts of at least 2 tokens")
    ref, cand, count = ref[count > 0], cand[count > 0], count[count > 0]
    return NextTokenComparison(
        kl, top, _perplexity_interval(cand, count, resamples, seed, confidence),
        _ratio_interval(ref, cand, count, resamples, seed, confidence), kl_mean, same_top,
        decided,
    )


def _mean_interval(
    sums: Floats, count: Floats, resamples: int, seed: int, confidence: float
) -> Interval:
    """A per-position mean (sum over positions / positions) and its bootstrap interval over the
    windows; windows without a position are left out."""
    keep = count > 0
    sums, count = sums[keep], count[keep]
    idx = _resampled(count.size, resamples, seed)
    low, high = _bounds(sums[idx].sum(axis=1) / count[idx].sum(axis=1), confidence)
    return Interval(float(sums.sum() / count.sum()), low, high, int(count.size), confidence,
                    resamples, seed)


def compare_next_tokens(
    reference: Sequence[npt.ArrayLike], candidate: Sequence[npt.ArrayLike],
    tokens: Sequence[npt.ArrayLike], resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> NextTokenComparison:
    """Every figure of this module for one candidate against one reference."""
    if len(tokens) != len(reference):
        raise ValueError(f"{len(reference)} logits arrays for {len(tokens)} token sequences")
    return summarize_windows(
        [score_window(r, c, t) for (r, c), t in zip(_windows(reference, candidate), tokens,
                                                    strict=True)],
        resamples, seed,
    )


def _windows(
    reference: Sequence[npt.ArrayLike], candidate: Sequence[npt.ArrayLike]
) -> zip[tuple[npt.ArrayLike, npt.ArrayLike]]:
    if len(reference) != len(candidate):
        raise ValueError(f"{len(candidate)} logits arrays for {len(reference)} references")
    return zip(reference, candidate, strict=True)
