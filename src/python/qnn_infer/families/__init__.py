"""The program families infer knows, each in its own module: how a family's program is run,
judged and timed. `qnn_infer.api` finds the program and picks the family; what every family
records alike is `qnn_infer.sealing`.

- `single`: one method, run on the artifact's eval inputs (or an inputs file) on the host or a
  device, compared output by output with the fp32 and fake-quant references, timed per call.
- `causal_lm`: a generating decoder's `prefill` and `decode`, judged by teacher-forced logits
  and perplexity on the eval texts, then generating from a prompt, timed per token (a causal LM
  prepared without a KV cache is one logits method, which it hands to `single`).

The family is picked by the program kind the compile artifact records (`ProgramRecord.kind`) in
`FAMILIES`. A new family is a module with `run` and an entry there
(qnn_quant/families/README.md walks every stage's part).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from qnn_common.artifact import Artifact
from qnn_common.errors import ArtifactError
from qnn_common.manifest import Manifest
from qnn_common.stages import InferInput
from qnn_infer.families import causal_lm, single


class Family(Protocol):
    def run(
        self, inp: InferInput, upstream: Manifest | None, pte: Path, have: set[str]
    ) -> Artifact:
        """Run `pte` (its compile artifact's manifest `upstream` and files `have`, or None and
        nothing for a bare .pte), judge, time and seal the infer artifact."""
        ...


# The recorded program kind -> the family that runs it: every kind prepare records
# (qnn_prepare.task.KINDS; qnn_pipeline/kinds_test.py holds the lists together).
FAMILIES: dict[str, Family] = {
    "causal-lm": causal_lm,
    "text-encoder": single,
    "vision": single,
    "custom": single,
}


def family_for(inp: InferInput, upstream: Manifest | None) -> Family:
    """The family of the program `inp` runs, by the kind its artifact records; a bare .pte (no
    artifact, no record) is one method."""
    if upstream is None or upstream.program is None:
        return single
    kind = upstream.program.kind
    family = FAMILIES.get(kind)
    if family is None:
        raise ArtifactError(
            inp.source.path, f"records a program of kind {kind!r}, which infer has no family "
            f"for (it has {', '.join(sorted(FAMILIES))}); compile it with the qnn-compile that "
            "matches this qnn-infer, or add the family (qnn_quant/families/README.md)",
        )
    return family
