"""Runs a sweep's DAG on Ray: one task per node, each waiting for its parent's result.

A local Ray by default (`num_cpus=jobs`, no dashboard), or a running cluster with `address`.
Every task writes into the sweep's one artifact directory, so on a cluster that directory must be
shared (the same path on every node: NFS, a mounted bucket); the content-addressed layout and the
per-artifact locks make two tasks that reach the same stage take turns and reuse one artifact.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from qnn_common.cli.child_env import import_path, path_exported
from qnn_common.errors import PipelineError
from qnn_pipeline.ray_reaper import reaped_ray
from qnn_pipeline.sweep import NodeResult, ProgressCallback, SweepPlan, execute_node


def ray_init_kwargs(jobs: int | None, address: str | None, verbose: bool = False) -> dict[str, Any]:
    """`ray.init` arguments: a local Ray of `jobs` CPUs, or the cluster at `address`.

    A local Ray's workers get this process's import path (`qnn_common.cli.child_env`), so they
    import what it imports (this project's sources included); a cluster's workers need the
    qnn-pipeline wheels installed.
    """
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": verbose}
    if address is not None:
        return {**kwargs, "address": address}
    return {**kwargs, "num_cpus": jobs or os.cpu_count() or 1,
            "runtime_env": {"env_vars": {"PYTHONPATH": import_path()}}}


def run_on_ray(
    plan: SweepPlan,
    *,
    jobs: int | None = None,
    address: str | None = None,
    verbose: bool = False,
    on_done: ProgressCallback | None = None,
) -> dict[str, NodeResult]:
    """Submit every node as a Ray task that waits for its parent's result; collect them all.

    Starts Ray (and shuts it down after) unless this process already joined one. A local Ray
    it starts dies with it, even by kill -9 (`ray_reaper`); a cluster's is never touched.
    """
    import ray

    if ray.is_initialized():
        return _submit(ray, plan, on_done)
    with reaped_ray() if address is None else contextlib.nullcontext():
        try:
            # A local Ray's node (raylet, its runtime_env and dashboard agents) is started by
            # ray.init as `sys.executable` children with this environment: under a PEX they
            # could not import ray, exited at once and the node timed out (issue 24).
            with path_exported():
                ray.init(**ray_init_kwargs(jobs, address, verbose))
        except Exception as err:  # Ray raises bare Exception (node timeout), OSError, ...
            raise PipelineError(_not_started(address, err)) from err
        try:
            return _submit(ray, plan, on_done)
        finally:
            ray.shutdown()


def _submit(ray: Any, plan: SweepPlan, on_done: ProgressCallback | None) -> dict[str, NodeResult]:
    """Submit every node of `plan` to the Ray this process has joined; collect the results."""
    task = ray.remote(num_cpus=1, max_retries=0)(execute_node)
    refs: dict[str, Any] = {}
    for node in plan.nodes:
        parents = () if node.parent is None else (refs[node.parent],)
        refs[node.id] = task.remote(node, *parents)
    by_ref = {ref: node_id for node_id, ref in refs.items()}
    nodes = {n.id: n for n in plan.nodes}
    results: dict[str, NodeResult] = {}
    pending = list(refs.values())
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            node = nodes[by_ref[ref]]
            try:
                results[node.id] = ray.get(ref)
            except ray.exceptions.RayError as err:  # a worker died, or a parent's did
                results[node.id] = NodeResult(node.id, node.stage, "failed",
                                              failed_stage=str(node.stage),
                                              error=_task_failed(err))
            if on_done is not None:
                on_done(node, results[node.id])
    return results


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


def _not_started(address: str | None, err: BaseException) -> str:
    """One line: what failed, why (Ray's own first line) and what to do."""
    if address is not None:
        return (f"could not join the Ray cluster at {address}: {_first_line(err)}; check "
                "--ray-address (ray://host:10001 or host:6379), or run with --jobs 1 to sweep "
                "in this process without Ray")
    return (f"could not start a local Ray: {_first_line(err)}; its logs are under "
            "<tmp>/ray/session_latest/logs; run with --jobs 1 to sweep in this process without "
            "Ray")


def _task_failed(err: BaseException) -> str:
    """A node's failure when Ray, not the stage, ended it: the worker process died (SIGKILL,
    out of memory, a native crash), so no stage error exists to report."""
    import ray

    if isinstance(err, ray.exceptions.WorkerCrashedError | ray.exceptions.OutOfMemoryError
                  | ray.exceptions.NodeDiedError | ray.exceptions.LocalRayletDiedError):
        return (f"the Ray worker running this stage died ({type(err).__name__}): killed, out "
                "of memory or a crash in native code; rerun the cell alone with qnn-pipeline "
                "(or the sweep with --jobs 1) to see what it printed")
    return f"Ray task failed: {_first_line(err)}"
