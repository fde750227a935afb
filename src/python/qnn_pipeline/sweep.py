"""Sweeps: many models x targets x recipes, each cell a pipeline run, planned as a DAG.

Cells that share a prefix share its artifact: a model is prepared once, a prepared model is
quantized once per (recipe, quantizer target), and only compile + infer are per cell. `plan_sweep`
turns the matrix into nodes (one per distinct stage config, each with at most one parent), and
`run_sweep` runs them, on Ray (a local Ray by default, a cluster with `ray_address`) or in this
process (`jobs=1`). Every node is one `run_pipeline` call that stops after its own stage, in one
shared artifact directory: the stages before it are found cached (they are its parent's
content-addressed artifacts), so a node only ever does its own stage's work, and a rerun of the
sweep finds every node cached.

A node that fails does not stop the others: its descendants are reported as not run, with the
stage that failed upstream and its reason; a cell whose combination is not valid (a recipe its
backend cannot run, say) is reported as such and planned no work.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from qnn_common.config import Stage
from qnn_pipeline.summary import SUMMARY_NAME, remove_our_summary
from qnn_pipeline.sweep_plan import (
    Matrix,
    Node,
    NodeResult,
    ProgressCallback,
    SweepPlan,
    SweepResult,
    cell_results,
    execute_node,
    node_counts,
    plan_sweep,
)

log = logging.getLogger(__name__)


def run_in_process(
    plan: SweepPlan, on_done: ProgressCallback | None = None
) -> dict[str, NodeResult]:
    """Run the plan's nodes one after the other in this process (`--jobs 1`)."""
    results: dict[str, NodeResult] = {}
    for node in plan.nodes:
        parents = () if node.parent is None else (results[node.parent],)
        results[node.id] = execute_node(node, *parents)
        if on_done is not None:
            on_done(node, results[node.id])
    return results


def run_sweep(
    matrix: Matrix,
    out_dir: Path,
    *,
    artifact_dir: Path | None = None,
    jobs: int | None = None,
    ray_address: str | None = None,
    ray_timeout: float | None = None,
    progress: bool = True,
    verbose: bool = False,
) -> SweepResult:
    """Plan and run the sweep; write `out_dir/sweep.md` and `out_dir/sweep.json`.

    Artifacts go to `artifact_dir` (default `out_dir/artifacts`), shared by every cell. `jobs=1`
    without `ray_address` runs in this process; otherwise on a local Ray of `jobs` CPUs (default:
    all), or on the cluster at `ray_address`, joined within `ray_timeout` seconds (default:
    `ray_join.DEFAULT_JOIN_TIMEOUT_S`).
    """
    from tqdm import tqdm  # a dependency of the stages (calibration progress)

    from qnn_pipeline.sweep_report import write_reports

    start = time.perf_counter()
    artifact_dir = artifact_dir if artifact_dir is not None else out_dir / "artifacts"
    plan = plan_sweep(matrix, artifact_dir)
    log.info("sweep: %d cells (%d invalid), %d nodes: %s", len(plan.cells), len(plan.invalid),
             len(plan.nodes), ", ".join(f"{plan.count(s)} {s}" for s in Stage))
    with tqdm(total=len(plan.chains), desc="sweep", unit="cell", disable=not progress) as bar:

        def on_done(node: Node, result: NodeResult) -> None:
            if not result.ok and result.status == "failed":
                bar.write(f"{node.id}: {result.status} in {result.failed_stage}: {result.error}")
            if node.stage is Stage.INFER:
                bar.update(1)

        if jobs == 1 and ray_address is None:
            results = run_in_process(plan, on_done)
        else:
            from qnn_pipeline.ray_join import DEFAULT_JOIN_TIMEOUT_S
            from qnn_pipeline.sweep_ray import run_on_ray

            results = run_on_ray(plan, jobs=jobs, address=ray_address, verbose=verbose,
                                 on_done=on_done, timeout_s=ray_timeout or DEFAULT_JOIN_TIMEOUT_S)
    # Each node's run_pipeline call wrote the artifact directory's summary.json, last one wins:
    # it describes no cell in particular. The cells' summaries are in sweep.json.
    # Only ours: a user's own file of that name made every cell fail, and is theirs to keep.
    remove_our_summary(artifact_dir / SUMMARY_NAME)
    cells = cell_results(plan, results)
    counts = node_counts(plan, results)
    seconds = time.perf_counter() - start
    markdown, md_path, json_path = write_reports(out_dir, cells, counts, seconds, artifact_dir)
    return SweepResult(tuple(cells), counts, seconds, artifact_dir, md_path, json_path, markdown)
