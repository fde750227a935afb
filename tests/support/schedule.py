"""Tests that run on a schedule, not on every push: the slow ones whose capability a faster test
also covers on every push (a real model's slice where a tiny model checks the same path).

`.ci/run` must stay within 45 minutes on 2 cores; these run weekly and on request with
`QNN_TESTS=scheduled` (.github/workflows/scheduled.yml runs the targets tagged `scheduled`). A
test module that uses `scheduled`: its Pants target is tagged `scheduled` and passes `QNN_TESTS`
through (`extra_env_vars`), or the weekly job skips it too.
"""

from __future__ import annotations

import os

import pytest

ENV = "QNN_TESTS"
SCHEDULED = os.environ.get(ENV, "").strip().lower() == "scheduled"


def scheduled(why: str) -> pytest.MarkDecorator:
    """Skip the test unless `QNN_TESTS=scheduled`; `why` says what makes it slow and which test
    covers its path on every push."""
    return pytest.mark.skipif(
        not SCHEDULED, reason=f"{why}: runs with {ENV}=scheduled (weekly in CI)"
    )
