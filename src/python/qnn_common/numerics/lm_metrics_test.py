from __future__ import annotations

import math

import numpy as np
import pytest

from qnn_common.numerics.lm_metrics import (
    compare_next_tokens,
    kl_divergence,
    log_softmax,
    perplexity,
    perplexity_interval,
    perplexity_ratio_interval,
    token_kl,
    top_token_agreement,
)

LN3 = math.log(3.0)


def test_kl_of_two_token_distributions_by_hand() -> None:
    # p = (1/2, 1/2), q = (3/4, 1/4): 1/2 ln(2/3) + 1/2 ln 2 = 1/2 ln(4/3).
    # p = (3/4, 1/4), q = (1/2, 1/2): 3/4 ln(3/2) + 1/4 ln(1/2).
    ref = np.array([[0.0, 0.0], [LN3, 0.0]])
    cand = np.array([[LN3, 0.0], [0.0, 0.0]])
    expected = [0.5 * math.log(4 / 3), 0.75 * math.log(1.5) + 0.25 * math.log(0.5)]
    assert token_kl(ref, cand) == pytest.approx(expected, abs=1e-12)
    stats = kl_divergence([ref], [cand])
    assert stats.tokens == 2
    assert stats.mean == pytest.approx(sum(expected) / 2, abs=1e-12)
    assert stats.median == pytest.approx(sum(expected) / 2, abs=1e-12)
    assert stats.max == pytest.approx(max(expected), abs=1e-12)
    # numpy's linear percentile: 99 % of the way from the smaller to the larger.
    assert stats.p99 == pytest.approx(min(expected) + 0.99 * abs(expected[0] - expected[1]))


def test_kl_ignores_a_shift_of_the_logits_and_survives_huge_ones() -> None:
    ref = np.array([[0.0, 0.0], [LN3, 0.0]])
    cand = np.array([[LN3, 0.0], [0.0, 0.0]])
    assert token_kl(ref + 1e4, cand - 5e3) == pytest.approx(token_kl(ref, cand), abs=1e-9)
    # exp(1e4) alone overflows: only log-sum-exp gets these right.
    expected = [-math.log(2), -math.log(2), -1e4 - math.log(2)]
    assert log_softmax(np.array([[1e4, 1e4, 0.0]]))[0] == pytest.approx(expected)


def test_a_token_the_reference_never_predicts_costs_nothing_one_the_candidate_never_does_inf(
) -> None:
    ref = np.array([[0.0, -np.inf]])
    assert token_kl(ref, np.array([[0.0, 5.0]])) == pytest.approx([math.log(1 + math.exp(5))])
    assert token_kl(np.array([[0.0, 0.0]]), np.array([[0.0, -np.inf]]))[0] == math.inf


def test_identical_logits_give_zero_kl_and_every_top_the_same() -> None:
    rng = np.random.default_rng(3)
    windows = [rng.normal(size=(n, 50)) * 4 for n in (5, 9)]
    tokens = [rng.integers(0, 50, size=w.shape[0]) for w in windows]
    result = compare_next_tokens(windows, [w.copy() for w in windows], tokens)
    assert result.kl.mean == result.kl.max == 0.0 and result.kl.tokens == 14
    assert result.top.same_top_percent == 100.0 and result.top.flips == 0
    assert result.top.flip_margins == ()
    ratio = result.perplexity_ratio
    assert ratio.value == ratio.low == ratio.high == 1.0
    assert result.perplexity.value == pytest.approx(perplexity(windows, tokens), rel=1e-12)


def test_same_top_and_the_reference_margin_at_each_flip() -> None:
    ref = np.array([
        [2.0, 1.95, 0.0],  # the reference barely prefers 0 (0.05 nats)
        [0.0, 1.0, 3.0],  # clearly 2 (2 nats over 1)
        [5.0, 0.0, 0.0],
    ])
    cand = np.array([
        [1.9, 2.0, 0.0],  # picks 1: a near tie of the reference
        [3.0, 1.0, 0.0],  # picks 0: the reference's last choice
        [4.0, 0.0, 1.0],  # agrees
    ])
    top = top_token_agreement([ref], [cand])
    assert (top.tokens, top.same_top, top.flips, top.near_ties) == (3, 1, 2, 1)
    assert top.flip_margins == pytest.approx((0.05, 2.0))
    assert top.same_top_percent == pytest.approx(100 / 3)
    record = top.to_json()
    assert record["near_tie_flips"] == 1 and record["near_tie_nats"] == 0.1
    assert record["median_flip_margin"] == pytest.approx(1.025)


def test_perplexity_of_uniform_predictions_is_the_vocabulary_size_with_no_spread() -> None:
    windows = [np.zeros((4, 2)), np.zeros((6, 2))]
    tokens = [np.array([0, 1, 1, 0]), np.array([1, 1, 0, 0, 1, 0])]
    interval = perplexity_interval(windows, tokens)
    assert interval.value == pytest.approx(2.0)
    assert interval.low == pytest.approx(2.0) and interval.high == pytest.approx(2.0)
    assert interval.windows == 2


def _windows(count: int, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Windows of mixed difficulty: logits of random sharpness, tokens drawn from them."""
    rng = np.random.default_rng(seed)
    logits, tokens = [], []
    for _ in range(count):
        w = rng.normal(size=(16, 20)) * rng.uniform(0.5, 4.0)
        p = np.exp(log_softmax(w))
        tokens.append(np.array([0] + [rng.choice(20, p=row) for row in p[:-1]]))
        logits.append(w)
    return logits, tokens


def test_the_bootstrap_interval_holds_the_point_narrows_and_repeats() -> None:
    few = perplexity_interval(*_windows(8, seed=1))
    many = perplexity_interval(*_windows(128, seed=1))
    for interval in (few, many):
        assert interval.low <= interval.value <= interval.high
        assert interval.low < interval.high
        assert interval.resamples == 1000 and interval.confidence == 0.95
    assert (many.high - many.low) / many.value < 0.5 * (few.high - few.low) / few.value
    logits, tokens = _windows(16, seed=2)
    assert perplexity_interval(logits, tokens, seed=7) == perplexity_interval(logits, tokens,
                                                                              seed=7)
    assert perplexity_interval(logits, tokens, seed=7) != perplexity_interval(logits, tokens,
                                                                              seed=8)
    assert perplexity_interval(logits, tokens).value == pytest.approx(perplexity(logits, tokens))


def test_one_window_has_nothing_to_resample() -> None:
    logits, tokens = _windows(1, seed=4)
    interval = perplexity_interval(logits, tokens)
    assert interval.low == pytest.approx(interval.value) == pytest.approx(interval.high)


def test_the_ratio_interval_is_paired() -> None:
    # A candidate slightly off everywhere: the windows' own difficulty, which spreads perplexity
    # a lot, is shared by both models and cancels in the ratio.
    reference, tokens = _windows(32, seed=5)
    candidate = [0.8 * w for w in reference]
    ppl = perplexity_interval(candidate, tokens)
    ratio = perplexity_ratio_interval(reference, candidate, tokens)
    assert ratio.low <= ratio.value <= ratio.high
    assert ratio.value == pytest.approx(perplexity(candidate, tokens)
                                        / perplexity(reference, tokens))
    assert (ratio.high - ratio.low) / ratio.value < 0.25 * (ppl.high - ppl.low) / ppl.value


def test_kl_and_same_top_carry_intervals_over_the_windows() -> None:
    # Two windows of two positions each over a 3-token vocabulary. Window A: the candidate
    # equals the reference (KL 0, both tops the same). Window B: the reference puts everything
    # on token 0, the candidate is uniform (KL ln 3 at each position, a top flipped at each).
    sure = np.array([[50.0, 0.0, 0.0]] * 2)
    flat = np.zeros((2, 3))
    flat[:, 1] = 1e-6  # a top that is not token 0
    ids = [np.array([0, 0]), np.array([0, 0])]
    both = compare_next_tokens([sure, sure], [sure, flat], ids)
    assert both.kl_mean.value == pytest.approx(LN3 / 2, rel=1e-6)
    assert both.same_top_percent.value == pytest.approx(50.0)
    # A resample draws A twice, B twice, or one of each: the bounds are the extremes.
    assert both.kl_mean.low == pytest.approx(0.0, abs=1e-12)
    assert both.kl_mean.high == pytest.approx(LN3, rel=1e-6)
    assert (both.same_top_percent.low, both.same_top_percent.high) == (0.0, 100.0)
    # Every window alike: nothing for the bootstrap to vary.
    same = compare_next_tokens([sure, sure], [flat, flat], ids)
    assert same.kl_mean.low == pytest.approx(same.kl_mean.high) == pytest.approx(LN3, rel=1e-6)
    out = both.to_json()
    assert out["kl_divergence"]["mean_interval"]["windows"] == 2
    assert out["same_top_percent_interval"]["value"] == 50.0
    # B's flips were decided (the reference's margin 50 nats): none forgiven.
    assert both.same_top_decided_percent.value == pytest.approx(50.0)
    # A reference that barely chose (0.05 nats): a flip there is a near tie, forgiven.
    tied = np.array([[0.05, 0.0, 0.0]] * 2)
    other = np.array([[0.0, 0.05, 0.0]] * 2)
    near = compare_next_tokens([tied, sure], [other, sure], ids)
    assert near.same_top_percent.value == pytest.approx(50.0)
    assert near.same_top_decided_percent.value == pytest.approx(100.0)


def test_mismatched_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="logits arrays"):
        kl_divergence([np.zeros((2, 3))], [])
    with pytest.raises(ValueError, match="shape"):
        top_token_agreement([np.zeros((2, 3))], [np.zeros((2, 4))])
    with pytest.raises(ValueError, match="at least 2 tokens"):
        perplexity_interval([np.zeros((1, 3))], [np.array([0])])
    with pytest.raises(ValueError, match="confidence"):
        perplexity_interval(*_windows(2, seed=0), confidence=1.0)
