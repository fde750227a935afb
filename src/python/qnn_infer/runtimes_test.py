"""The host runtime's CPU threads: an infer option, default every core."""

from __future__ import annotations

import os

import pytest

from qnn_common.config import InferConfig
from qnn_common.errors import ConfigValidationError
from qnn_infer.runtimes import cpu_threads, set_cpu_threads


def test_default_is_every_core_this_process_may_use() -> None:
    assert InferConfig().threads is None
    assert cpu_threads(None) == len(os.sched_getaffinity(0))
    assert cpu_threads(3) == 3


def test_the_runtime_threadpool_is_resized() -> None:
    try:
        assert set_cpu_threads(1) == 1
        assert set_cpu_threads(1) == 1  # already so: nothing to do
    finally:
        assert set_cpu_threads(None) == cpu_threads(None)


@pytest.mark.parametrize("threads", [0, -1, 4096, True, 1.5])
def test_bad_thread_counts_are_refused(threads: object) -> None:
    with pytest.raises(ConfigValidationError, match="infer.threads"):
        InferConfig(threads=threads)  # type: ignore[arg-type]  # wrong types on purpose
