"""Sweep planning: the matrix becomes a DAG of shared stage nodes; results fold back into cells.

No stage runs here (see tests/sweep/ for real sweeps on Ray): planning only validates configs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from qnn_common.config import Stage
from qnn_common.errors import ConfigValidationError
from qnn_common.recipes import Backend, Recipe
from qnn_pipeline.sweep_cli import sweep_from_mapping
from qnn_pipeline.sweep_plan import (
    Cell,
    Matrix,
    NodeResult,
    cell_results,
    execute_node,
    node_counts,
    plan_sweep,
)
from qnn_pipeline.sweep_report import to_markdown, write_reports

ART = Path("art")


def _matrix(**kw: Any) -> Matrix:
    base: dict[str, Any] = dict(
        models=("tiny-cnn", "minilm"),
        backends=(Backend.XNNPACK, Backend.PORTABLE),
        recipes=(Recipe.FP32, Recipe.A8W8),
    )
    base.update(kw)
    return Matrix(**base)


def test_shared_prefixes_are_one_node_each() -> None:
    plan = plan_sweep(_matrix(), ART)
    assert len(plan.cells) == 8 and not plan.invalid
    # One prepare per model; one quantize per (model, quantized recipe, quantizer target);
    # compile and infer per cell.
    assert [plan.count(s) for s in Stage] == [2, 4, 8, 8]
    nodes = {n.id: n for n in plan.nodes}
    for cell, chain in plan.chains.items():
        stages = [nodes[i].stage for i in chain]
        expected = [Stage.PREPARE, Stage.COMPILE, Stage.INFER]
        if cell.recipe is Recipe.A8W8:
            expected.insert(1, Stage.QUANTIZE)
        assert stages == expected
        assert [nodes[i].parent for i in chain] == [None, *chain[:-1]]
        assert all(cell in nodes[i].cells for i in chain)
    prepare = [n for n in plan.nodes if n.stage is Stage.PREPARE]
    assert sorted(len(n.cells) for n in prepare) == [4, 4]


def test_parents_come_first_and_nodes_stop_after_their_stage() -> None:
    plan = plan_sweep(_matrix(), ART)
    seen: set[str] = set()
    for node in plan.nodes:
        assert node.parent is None or node.parent in seen
        seen.add(node.id)
        assert node.ctx.stop_after == (None if node.stage is Stage.INFER else node.stage)
        assert node.ctx.out_dir == ART


def test_stage_settings_reach_every_cell_and_split_nodes_only_where_keyed() -> None:
    plan = plan_sweep(_matrix(models=("tiny-cnn",), settings={"infer": {"runs": 3}}), ART)
    assert all(n.ctx.infer.runs == 3 for n in plan.nodes)
    assert [plan.count(s) for s in Stage] == [1, 2, 4, 4]


def test_qnn_cells_fan_out_over_socs_and_quantize_per_soc() -> None:
    plan = plan_sweep(_matrix(models=("tiny-cnn",), backends=(Backend.QNN,),
                              recipes=(Recipe.A16W8,), socs=("SM8650", "SM8750")), ART)
    assert [c.target for c in plan.cells] == ["qnn:SM8650", "qnn:SM8750"]
    assert [plan.count(s) for s in Stage] == [1, 2, 2, 2]


def test_invalid_combinations_are_reported_and_the_rest_planned() -> None:
    plan = plan_sweep(_matrix(models=("tiny-cnn",), backends=(Backend.XNNPACK,),
                              recipes=(Recipe.A8W8, Recipe.A16W8)), ART)
    bad = Cell("tiny-cnn", Backend.XNNPACK, Recipe.A16W8)
    assert set(plan.invalid) == {bad} and "16a8w" in plan.invalid[bad]
    assert len(plan.chains) == 1
    cells = cell_results(plan, {n.id: NodeResult(n.id, n.stage, "ran") for n in plan.nodes})
    assert [(c.status, c.failed_stage) for c in cells] == [("ok", None), ("invalid", "config")]


def test_a_matrix_with_no_valid_cell_says_why() -> None:
    with pytest.raises(ConfigValidationError, match="infer.runs"):
        plan_sweep(_matrix(settings={"infer": {"runs": 0}}), ART)
    with pytest.raises(ConfigValidationError, match="prepare.no_such_key"):
        plan_sweep(_matrix(settings={"prepare": {"no_such_key": 1}}), ART)


def test_a_failed_node_leaves_its_descendants_not_run_and_others_alone(tmp_path: Path) -> None:
    plan = plan_sweep(_matrix(), ART)
    results = {n.id: NodeResult(n.id, n.stage, "cached") for n in plan.nodes}
    broken = next(n for n in plan.nodes if n.stage is Stage.PREPARE and
                  n.ctx.prepare.model == "minilm")
    results[broken.id] = NodeResult(broken.id, Stage.PREPARE, "failed", failed_stage="prepare",
                                    error="[prepare] failed: boom")
    # What a child does with a failed parent: nothing, and it says where the failure was.
    child = next(n for n in plan.nodes if n.parent == broken.id)
    skipped = execute_node(child, results[broken.id])
    assert (skipped.status, skipped.failed_stage, skipped.error) == (
        "not run", "prepare", "[prepare] failed: boom")
    for node in plan.nodes:
        if node.id != broken.id and node.stage is not Stage.PREPARE:
            parent_failed = node.ctx.prepare.model == "minilm"
            results[node.id] = skipped if parent_failed else results[node.id]
    cells = cell_results(plan, results)
    assert {c.cell.model: c.status for c in cells if c.status == "ok"} == {"tiny-cnn": "ok"}
    assert {(c.status, c.failed_stage) for c in cells if c.cell.model == "minilm"} == {
        ("failed", "prepare")}
    counts = node_counts(plan, results)
    assert counts["prepare"] == {"ran": 0, "cached": 1, "failed": 1, "not run": 0}
    md = to_markdown(cells, counts, 1.0)
    assert "minilm / xnnpack / fp32: failed at prepare: [prepare] failed: boom" in md
    written, md_path, json_path = write_reports(tmp_path, cells, counts, 1.0, ART)
    doc = json.loads(json_path.read_text())
    assert len(doc["cells"]) == 8 and doc["nodes"]["prepare"]["failed"] == 1
    assert md_path.read_text() == md == written


def test_toml_shape_flags_win_and_defaults() -> None:
    matrix, options = sweep_from_mapping(
        {"sweep": {"models": ["tiny-cnn"], "jobs": 2, "out": "o"}, "infer": {"runs": 4}},
        {"recipes": ["fp32", "8a8w"], "jobs": 1, "settings": {"infer": {"runs": 2}}},
    )
    assert matrix.backends == (Backend.XNNPACK,)
    assert matrix.recipes == (Recipe.FP32, Recipe.A8W8)
    assert matrix.settings == {"infer": {"runs": 2}}
    assert (options.jobs, options.out, options.artifacts) == (1, Path("o"), None)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"sweep": {"model": ["x"]}}, "sweep.model"),
        ({"pipeline": {"model": "x"}}, "pipeline"),
        ({"sweep": {"models": ["x"], "jobs": 0}}, "sweep.jobs"),
        ({"sweep": {"models": ["x"], "backends": ["tpu"]}}, "sweep.backends"),
        ({"sweep": {"models": "x", "socs": ["SM0000"]}}, "sweep.socs"),
        ({"sweep": {"models": []}}, "sweep.models"),
    ],
)
def test_bad_sweep_files_name_the_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigValidationError) as err:
        sweep_from_mapping(data)
    assert err.value.field == field
