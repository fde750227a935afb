"""The prepare stage as a library call: model spec in, sealed artifact directory out."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

import qnn_prepare
from qnn_common.artifact import Artifact
from qnn_common.cache_keys import cache_key, code_version
from qnn_common.config import PrepareConfig, Stage
from qnn_common.manifest import Manifest, ProgramRecord
from qnn_common.sealing import seal_stage
from qnn_common.stages import (
    CALIBRATION,
    EVAL_INPUTS,
    REFERENCE_FP32,
    PrepareInput,
    method_program,
)
from qnn_common.store.artifact_dir import begin_artifact
from qnn_common.store.atomic import atomic_write_bytes
from qnn_common.store.hashing import sha256_file
from qnn_common.torchio.programs import handed_on, save_program
from qnn_common.torchio.samples import save_samples
from qnn_prepare.factory import is_factory_spec
from qnn_prepare.models import BUILTIN_MODELS, builtin_weights, task_for
from qnn_prepare.provenance import factory_digest

PACKAGE = "qnn-prepare"
log = logging.getLogger(__name__)


def source_digests(config: PrepareConfig) -> dict[str, str]:
    """Digests of what the output is made from: the model's files, and a calibration file."""
    digests = {"model": _model_digest(config.model)}
    if config.calibration_file is not None and config.calibration_file.is_file():
        digests["calibration_file"] = sha256_file(config.calibration_file)
    return digests


def _model_digest(spec: str) -> str:
    spec = spec.strip()
    path = Path(spec).expanduser()
    weights = builtin_weights(spec)
    if weights is not None:  # a built-in whose weights the code version does not cover
        return hashlib.sha256(spec.encode() + weights).hexdigest()
    if spec not in BUILTIN_MODELS and path.is_dir():
        h = hashlib.sha256()
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            h.update(str(f.relative_to(path)).encode())
            h.update(sha256_file(f).encode())
        return h.hexdigest()
    if spec not in BUILTIN_MODELS and is_factory_spec(spec):
        # The code and weight files that define it: editing the function must miss the cache.
        return factory_digest(spec)
    # Built-ins are fixed by this package's code (part of the key).
    return hashlib.sha256(spec.encode()).hexdigest()


def prepare_cache_key(config: PrepareConfig) -> str:
    """The cache key of `config`'s artifact (see qnn_common.manifest.cache_key)."""
    return cache_key(Stage.PREPARE, config, source_digests(config), code_version(qnn_prepare))


def run_prepare(inp: PrepareInput) -> Artifact:
    """Export the model with the task that takes it (`qnn_prepare.models.task_for`) and seal
    the artifact: one program per method (``methods/<name>.pt2``, named in the manifest's
    `program` record), the calibration and eval inputs, the fp32 reference outputs, tokenizer
    files and the manifest."""
    cfg = inp.config
    task = task_for(cfg)
    torch.manual_seed(cfg.seed)
    exported = task.export(cfg)
    out = begin_artifact(inp.out_dir, inputs=[cfg.calibration_file, Path(cfg.model)])
    files = [method_program(method) for method in exported.programs]
    saved = {m: save_program(out / method_program(m), p) for m, p in exported.programs.items()}
    save_samples(out / CALIBRATION, list(exported.calibration))
    save_samples(out / EVAL_INPUTS, list(exported.eval_inputs))
    save_samples(out / REFERENCE_FP32, list(exported.reference))
    files += [CALIBRATION, EVAL_INPUTS, REFERENCE_FP32]
    for name, table in sorted(exported.tables.items()):
        save_samples(out / name, list(table))
        files.append(name)
    for name, data in sorted(exported.files.items()):
        atomic_write_bytes(out / name, data)
        files.append(name)
    metrics = {"task": task.name, **exported.metrics}
    record = ProgramRecord(
        kind=exported.kind, methods=tuple(exported.programs), llm=exported.llm
    )
    manifest = _seal(
        out, cfg, source_digests(cfg), files, exported.timings, metrics=metrics, program=record
    )
    return Artifact(inp.out_dir, manifest, handed_on(saved))


def _seal(
    out: Path,
    cfg: Any,
    inputs: Mapping[str, str],
    files: Sequence[str],
    timings: Mapping[str, float],
    *,
    metrics: Mapping[str, Any],
    program: ProgramRecord,
    extra_tools: Mapping[str, str] | None = None,
) -> Manifest:
    return seal_stage(
        out, stage=Stage.PREPARE, package=PACKAGE, module=qnn_prepare, config=cfg, inputs=inputs,
        files=files, timings=timings, metrics=metrics, extra_tools=extra_tools, program=program,
    )
