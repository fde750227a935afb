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

from qnn_common.cli.child_env import import_path
from qnn_pipeline.ray_join import DEFAULT_JOIN_TIMEOUT_S, first_line, joined_ray
from qnn_pipeline.ray_reaper import reaped_ray
from qnn_pipeline.sweep_plan import NodeResult, ProgressCallback, SweepPlan, execute_node


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
    timeout_s: float = DEFAULT_JOIN_TIMEOUT_S,
) -> dict[str, NodeResult]:
    """Submit every node as a Ray task that waits for its parent's result; collect them all.

    Starts Ray (and shuts it down after) unless this process already joined one; joining the
    cluster at `address` must take under `timeout_s` seconds (`ray_join`). A local Ray it starts
    dies with it, even by kill -9 (`ray_reaper`); a cluster's is never touched.
    """
    import ray

    if ray.is_initialized():
        return _submit(ray, plan, on_done)
    with (reaped_ray() if address is None else contextlib.nullcontext(),
          joined_ray(ray, ray_init_kwargs(jobs, address, verbose), address, timeout_s)):
        return _submit(ray, plan, on_done)


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


def _task_failed(err: BaseException) -> str:
    """A node's failure when Ray, not the stage, ended it: the worker process died (SIGKILL,
    out of memory, a native crash), so no stage error exists to report."""
    import ray

    if isinstance(err, ray.exceptions.WorkerCrashedError | ray.exceptions.OutOfMemoryError
                  | ray.exceptions.NodeDiedError | ray.exceptions.LocalRayletDiedError):
        return (f"the Ray worker running this stage died ({type(err).__name__}): killed, out "
                "of memory or a crash in native code; rerun the cell alone with qnn-pipeline "
                "(or the sweep with --jobs 1) to see what it printed")
    return f"Ray task failed: {first_line(err)}"
