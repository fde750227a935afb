"""What every infer run records alike, whichever the program's family: the inputs its cache key
and manifest cover, and the seal of its artifact."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import qnn_infer
from qnn_common.artifact import Artifact
from qnn_common.config import InferConfig, Stage
from qnn_common.manifest import Manifest, ProgramRecord
from qnn_common.sealing import seal_stage
from qnn_common.stages import InferInput
from qnn_common.store.hashing import sha256_file

PACKAGE = "qnn-infer"


def input_digests(config: InferConfig, source: Artifact) -> dict[str, str]:
    """The compile artifact's identity digest (or a bare .pte's sha256), and the inputs file's."""
    upstream = source.manifest_as(Stage.COMPILE)
    if upstream is not None:
        digests = {"compile": upstream.identity_digest()}
    else:
        digests = {"pte": sha256_file(source.path)}
    if config.inputs_file is not None:
        digests["inputs_file"] = sha256_file(config.inputs_file)
    return digests


def seal(
    out: Path,
    inp: InferInput,
    files: Sequence[str],
    timings: Mapping[str, float],
    *,
    metrics: Mapping[str, Any],
    program: ProgramRecord | None,
    extra_tools: Mapping[str, str] | None = None,
) -> Manifest:
    """Seal the infer artifact being written in `out`."""
    return seal_stage(
        out, stage=Stage.INFER, package=PACKAGE, module=qnn_infer, config=inp.config,
        inputs=input_digests(inp.config, inp.source), files=files, timings=timings, metrics=metrics,
        extra_tools=extra_tools, program=program,
    )
