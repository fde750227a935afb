"""A sweep's plan: the matrix, its cells, the DAG of stage nodes they share, how one node runs,
and what each cell came to. `qnn_pipeline.sweep` runs a plan (in this process or on Ray);
`sweep_ray` and `sweep_report` read these types, and nothing here imports them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from qnn_common.config import Stage
from qnn_common.errors import ConfigValidationError, PipelineError
from qnn_common.recipes import BACKENDS, Backend, Recipe
from qnn_pipeline.context import PipelineContext, pipeline_from_mapping

log = logging.getLogger(__name__)

NodeStatus = Literal["ran", "cached", "failed", "not run"]
STAGE_SECTIONS = ("prepare", "quantize", "compile", "infer")


@dataclass(frozen=True)
class Matrix:
    """What to sweep: every model x backend x recipe (x SoC, for qnn) is one cell.

    `settings` holds per-stage tables shared by every cell, shaped like a pipeline TOML file's
    (`{"prepare": {"seq_len": 32}, "infer": {"runs": 5}}`).
    """

    models: tuple[str, ...]
    backends: tuple[Backend, ...]
    recipes: tuple[Recipe, ...]
    socs: tuple[str, ...] = ()
    settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("models", "backends", "recipes"):
            if not getattr(self, name):
                raise ConfigValidationError(f"sweep.{name}", [], "needs at least one value")
        for section in self.settings:
            if section not in STAGE_SECTIONS:
                raise ConfigValidationError(
                    section, dict(self.settings[section]), "not a stage section of a sweep",
                    allowed=STAGE_SECTIONS,
                )


@dataclass(frozen=True)
class Cell:
    """One pipeline run of the sweep."""

    model: str
    backend: Backend
    recipe: Recipe
    soc: str | None = None

    @property
    def target(self) -> str:
        """`xnnpack`, `portable`, or `qnn:<SoC>`."""
        return self.backend.value if self.soc is None else f"{self.backend.value}:{self.soc}"

    @property
    def name(self) -> str:
        return f"{self.model} / {self.target} / {self.recipe.value}"


@dataclass(frozen=True)
class Node:
    """One stage run that serves every cell listed in `cells`.

    `ctx` is a context of one of those cells that stops after `stage`; `parent` is the node whose
    artifact this stage reads (None for prepare).
    """

    id: str
    stage: Stage
    ctx: PipelineContext
    parent: str | None
    cells: tuple[Cell, ...]


@dataclass(frozen=True)
class SweepPlan:
    """The DAG: `nodes` in an order where every parent comes before its children."""

    cells: tuple[Cell, ...]
    invalid: Mapping[Cell, str]
    nodes: tuple[Node, ...]
    chains: Mapping[Cell, tuple[str, ...]]  # each valid cell's node ids, prepare first

    def count(self, stage: Stage) -> int:
        return sum(n.stage is stage for n in self.nodes)


@dataclass(frozen=True)
class NodeResult:
    """What happened to one node; `failed_stage` and `error` say why it did not complete."""

    node: str
    stage: Stage
    status: NodeStatus
    seconds: float = 0.0
    artifact: str | None = None
    failed_stage: str | None = None
    error: str | None = None
    summary: dict[str, Any] | None = None  # the cell's pipeline summary, infer nodes only

    @property
    def ok(self) -> bool:
        return self.status in ("ran", "cached")


def cells_of(matrix: Matrix) -> list[Cell]:
    """The matrix in a stable order: model, then backend (and SoC), then recipe."""
    cells: list[Cell] = []
    for model in matrix.models:
        for backend in matrix.backends:
            socs: Sequence[str | None] = (
                (matrix.socs or (None,)) if BACKENDS[backend].needs_soc else (None,)
            )
            for soc in socs:
                cells.extend(Cell(model, backend, recipe, soc) for recipe in matrix.recipes)
    return cells


def cell_context(cell: Cell, matrix: Matrix, artifact_dir: Path) -> PipelineContext:
    """The cell's pipeline context, validated like `qnn-pipeline --config` validates a file."""
    pipeline = {"model": cell.model, "backend": cell.backend.value, "recipe": cell.recipe.value,
                "soc": cell.soc, "out": str(artifact_dir)}
    data = {"pipeline": {k: v for k, v in pipeline.items() if v is not None},
            **{k: dict(v) for k, v in matrix.settings.items()}}
    return pipeline_from_mapping(data)


def _node_id(stage: Stage, label: str, identity: object) -> str:
    digest = hashlib.sha256(repr(identity).encode()).hexdigest()[:8]
    return f"{stage.value}:{label}:{digest}"


def plan_sweep(matrix: Matrix, artifact_dir: Path) -> SweepPlan:
    """Expand the matrix into cells and the cells into a DAG of stage nodes.

    Nodes are keyed by the stage configs that the stage's cache key covers: one prepare per
    distinct `PrepareConfig`, one quantize per (prepare, `QuantizeConfig`), one compile per
    (quantize or prepare, `CompileConfig`), and one infer per cell. Raises the first cell's
    ConfigValidationError when no cell is valid (a typo in a shared setting, most likely).
    """
    cells = cells_of(matrix)
    invalid: dict[Cell, str] = {}
    first_error: ConfigValidationError | None = None
    nodes: dict[str, Node] = {}
    chains: dict[Cell, tuple[str, ...]] = {}
    for cell in cells:
        try:
            ctx = cell_context(cell, matrix, artifact_dir)
        except ConfigValidationError as err:
            invalid[cell] = str(err)
            first_error = first_error or err
            continue
        identity: tuple[object, ...] = ()
        parent: str | None = None
        chain: list[str] = []
        label = f"{cell.model}:{cell.recipe}:{cell.target}"
        for stage in Stage:
            if stage in ctx.skip:  # fp32 / fp16: no quantize node
                continue
            if stage is Stage.PREPARE:
                identity = (ctx.prepare,)
            elif stage is Stage.QUANTIZE:
                identity = (*identity, ctx.quantize)
            elif stage is Stage.COMPILE:
                identity = (*identity, ctx.compile)
            else:
                identity = (*identity, ctx.infer, cell)
            node_id = _node_id(stage, cell.model if stage is Stage.PREPARE else label, identity)
            if node_id in nodes:
                node = nodes[node_id]
                nodes[node_id] = dataclasses.replace(node, cells=(*node.cells, cell))
            else:
                stop = None if stage is Stage.INFER else stage
                nodes[node_id] = Node(node_id, stage, dataclasses.replace(ctx, stop_after=stop),
                                      parent, (cell,))
            chain.append(node_id)
            parent = node_id
        chains[cell] = tuple(chain)
    if not chains and first_error is not None:
        raise first_error
    ordered = sorted(nodes.values(), key=lambda n: n.stage.position)  # stable: parents first
    return SweepPlan(tuple(cells), invalid, tuple(ordered), chains)


def execute_node(node: Node, *parents: NodeResult) -> NodeResult:
    """Run one node's stage (the ones before it are its parents' artifacts, found cached).

    Never raises for a failure of the pipeline: the result says which stage failed and why, so
    one cell's failure cannot stop the sweep.
    """
    for parent in parents:
        if not parent.ok:
            return NodeResult(node.id, node.stage, "not run", failed_stage=parent.failed_stage,
                              error=parent.error)
    from qnn_pipeline.orchestrator import run_pipeline  # imports torch: in the worker only

    start = time.perf_counter()
    try:
        result = run_pipeline(node.ctx)
    except PipelineError as err:
        return NodeResult(node.id, node.stage, "failed", time.perf_counter() - start,
                          failed_stage=str(err.stage or node.stage), error=str(err))
    except Exception as err:  # a bug in a stage must not end the other cells' runs
        log.exception("%s failed unexpectedly", node.id)
        return NodeResult(node.id, node.stage, "failed", time.perf_counter() - start,
                          failed_stage=str(node.stage), error=f"{type(err).__name__}: {err}")
    if result.gate_failure is not None and node.stage is Stage.INFER:
        return NodeResult(node.id, node.stage, "failed", time.perf_counter() - start,
                          failed_stage=str(Stage.INFER), error=str(result.gate_failure),
                          summary=result.summary)
    record = next(r for r in result.records if r.stage is node.stage)
    return NodeResult(
        node.id, node.stage, "cached" if record.status == "cached" else "ran", record.seconds,
        None if record.artifact is None else str(record.artifact),
        summary=result.summary if node.stage is Stage.INFER else None,
    )


ProgressCallback = Callable[[Node, NodeResult], None]


def node_counts(plan: SweepPlan, results: Mapping[str, NodeResult]) -> dict[str, dict[str, int]]:
    """Per stage, how many nodes ran, were cached, failed or were not run."""
    counts: dict[str, dict[str, int]] = {
        s.value: {"ran": 0, "cached": 0, "failed": 0, "not run": 0} for s in Stage
    }
    for node in plan.nodes:
        counts[node.stage.value][results[node.id].status] += 1
    return counts


def leaves(plan: SweepPlan) -> Iterable[Node]:
    """The nodes that complete a cell (one infer per cell)."""
    return (n for n in plan.nodes if n.stage is Stage.INFER)


CellStatus = Literal["ok", "failed", "not run", "invalid"]


@dataclass(frozen=True)
class CellResult:
    """One cell's outcome: its stages' statuses, the failure (stage, reason) or its summary."""

    cell: Cell
    status: CellStatus
    stages: Mapping[str, NodeStatus] = field(default_factory=dict)
    failed_stage: str | None = None
    error: str | None = None
    summary: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class SweepResult:
    """The sweep's cells, its node counts per stage and status, and where the tables went."""

    cells: tuple[CellResult, ...]
    counts: Mapping[str, Mapping[str, int]]
    seconds: float
    artifact_dir: Path
    markdown_path: Path
    json_path: Path
    markdown: str  # this sweep's table (the file may since hold another sweep's)

    @property
    def ok(self) -> bool:
        """Every valid cell completed."""
        return all(c.status in ("ok", "invalid") for c in self.cells)


def cell_results(plan: SweepPlan, results: Mapping[str, NodeResult]) -> list[CellResult]:
    """Fold the node results back into the matrix's cells, in the matrix's order."""
    out = []
    for cell in plan.cells:
        if cell in plan.invalid:
            out.append(CellResult(cell, "invalid", failed_stage="config",
                                  error=plan.invalid[cell]))
            continue
        chain = [results[node_id] for node_id in plan.chains[cell]]
        stages = {str(r.stage): r.status for r in chain}
        bad = next((r for r in chain if not r.ok), None)
        if bad is None:
            out.append(CellResult(cell, "ok", stages, summary=chain[-1].summary))
        else:
            status: CellStatus = "failed" if bad.status == "failed" else "not run"
            out.append(CellResult(cell, status, stages, bad.failed_stage, bad.error))
    return out
