"""The infer stage as a library call: run a .pte, judge it against its references, time it."""

from __future__ import annotations

import qnn_infer
from qnn_common.artifact import Artifact
from qnn_common.cache_keys import cache_key, code_version
from qnn_common.config import InferConfig, Stage
from qnn_common.stages import PTE, InferInput
from qnn_infer.device import check_device_ready
from qnn_infer.families import family_for
from qnn_infer.sealing import input_digests


def infer_cache_key(config: InferConfig, source: Artifact) -> str:
    """The cache key of the artifact running `source` at `config`."""
    return cache_key(Stage.INFER, config, input_digests(config, source),
                     code_version(qnn_infer))


def run_infer(inp: InferInput) -> Artifact:
    """Run the program on its artifact's eval inputs (or `inputs_file`, or a prompt), judge it
    against its references and time it: find the program, pick its family
    (`qnn_infer.families`), run."""
    check_device_ready(inp.config)  # before any program is loaded
    upstream = inp.source.manifest_as(Stage.COMPILE)
    if upstream is not None:
        pte = inp.source.path / PTE
        have = {f.path for f in upstream.files}
    else:
        pte, have = inp.source.path, set()
    return family_for(inp, upstream).run(inp, upstream, pte, have)
