"""The model families quantize knows, each in its own module: how a family's methods are
calibrated, quantized and judged. `qnn_quant.api` does the rest for every family alike (load the
methods, write them, carry the inputs forward, seal).

- `single`: one method (`forward`), calibrated on the prepared samples and judged output by
  output and layer by layer against the fp32 program.
- `causal_lm`: a generating decoder's `prefill` and `decode`, calibrated through prefill with one
  set of scales for both, judged by teacher-forced logits on the eval texts.

A new family is a module with `quantize` and an entry in `family_for`.
"""

from __future__ import annotations

from pathlib import Path

from qnn_common.errors import ArtifactError
from qnn_common.manifest import Manifest
from qnn_common.stages import llm_spec_of, program_files
from qnn_quant.families.family import Family


def family_for(source: Path, src: Manifest) -> Family:
    """The family of the prepared artifact at `source` (its manifest `src`)."""
    from qnn_quant.families import causal_lm, single

    if llm_spec_of(source, src) is not None:
        return causal_lm
    methods = list(program_files(source, src))
    if len(methods) != 1:
        raise ArtifactError(
            source, f"holds the methods {', '.join(methods)} and no causal-LM record; quantize "
            "takes one method, or a causal LM's prefill and decode",
        )
    return single
