"""Runs a sweep's DAG on Ray: one task per node, each waiting for its parent's result.

A local Ray by default (`num_cpus=jobs`, no dashboard), or a running cluster with `address`.
Every task writes into the sweep's one artifact directory, so on a cluster that directory must be
shared (the same path on every node: NFS, a mounted bucket); the content-addressed layout and the
per-artifact locks make two tasks that reach the same stage take turns and reuse one artifact.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

from qnn_common.errors import PipelineError
from qnn_pipeline.ray_reaper import reaped_ray
from qnn_pipeline.sweep import NodeResult, ProgressCallback, SweepPlan, execute_node


def ray_init_kwargs(jobs: int | None, address: str | None, verbose: bool = False) -> dict[str, Any]:
    """`ray.init` arguments: a local Ray of `jobs` CPUs, or the cluster at `address`.

    A local Ray's workers get this process's `sys.path`, so they import what it imports (this
    project's sources included); a cluster's workers need the qnn-pipeline wheels installed.
    """
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": verbose}
    if address is not None:
        return {**kwargs, "address": address}
    paths = [os.path.abspath(p) for p in sys.path if p]  # a worker's cwd is not ours
    return {**kwargs, "num_cpus": jobs or os.cpu_count() or 1,
            "runtime_env": {"env_vars": {"PYTHONPATH": os.pathsep.join(paths)}}}


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
            ray.init(**ray_init_kwargs(jobs, address, verbose))
        except (ConnectionError, RuntimeError, ValueError) as err:
            where = f"the Ray cluster at {address}" if address else "a local Ray"
            raise PipelineError(
                f"could not start or join {where}: {err}; check --ray-address (ray://host:10001 "
                "or host:6379), or run with --jobs 1 to sweep without Ray"
            ) from err
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
                                              error=f"Ray task failed: {err}")
            if on_done is not None:
                on_done(node, results[node.id])
    return results
