"""The program families infer knows, each in its own module: how a family's program is run,
judged and timed. `qnn_infer.api` finds the program and picks the family; what every family
records alike is `qnn_infer.sealing`.

- `single`: one method, run on the artifact's eval inputs (or an inputs file) on the host or a
  device, compared output by output with the fp32 and fake-quant references, timed per call.
- `causal_lm`: a generating decoder's `prefill` and `decode`, judged by teacher-forced logits
  and perplexity on the eval texts, then generating from a prompt, timed per token.

A new family is a module with `run` and an entry in `family_for`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from qnn_common.artifact import Artifact
from qnn_common.manifest import Manifest
from qnn_common.stages import InferInput, llm_spec_of


class Family(Protocol):
    def run(
        self, inp: InferInput, upstream: Manifest | None, pte: Path, have: set[str]
    ) -> Artifact:
        """Run `pte` (its compile artifact's manifest `upstream` and files `have`, or None and
        nothing for a bare .pte), judge, time and seal the infer artifact."""
        ...


def family_for(inp: InferInput, upstream: Manifest | None) -> Family:
    """The family of the program `inp` runs: a causal LM if its artifact records one."""
    from qnn_infer.families import causal_lm, single

    if upstream is not None and llm_spec_of(inp.source.path, upstream) is not None:
        return causal_lm
    return single
