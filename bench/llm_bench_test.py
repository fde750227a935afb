"""The LLM bench's comparison of our greedy tokens with eager's."""

from __future__ import annotations

from llm_bench import same_leading_tokens


def test_leading_tokens_count_up_to_the_first_difference() -> None:
    assert same_leading_tokens([5, 6, 7], [5, 6, 7, 8]) == {"same": 3, "of": 3}
    assert same_leading_tokens([5, 9, 7], [5, 6, 7]) == {"same": 1, "of": 3}
    assert same_leading_tokens([1, 2, 3, 4], [1, 2]) == {"same": 2, "of": 4}  # eager stopped
    assert same_leading_tokens([], [1]) == {"same": 0, "of": 0}
