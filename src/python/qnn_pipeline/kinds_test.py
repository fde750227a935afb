"""Every program kind prepare can record has a family in each stage downstream that picks one:
a kind added to prepare without them would be refused only when a user quantized it."""

from __future__ import annotations

from qnn_infer.families import FAMILIES as INFER_FAMILIES
from qnn_prepare.models import TASKS
from qnn_prepare.task import KINDS
from qnn_quant.families import FAMILIES as QUANT_FAMILIES


def test_every_prepared_kind_has_a_quantize_and_an_infer_family() -> None:
    assert set(QUANT_FAMILIES) == set(KINDS)
    assert set(INFER_FAMILIES) == set(KINDS)


def test_every_task_records_a_known_kind() -> None:
    assert {task.name for task in TASKS} <= set(KINDS)
