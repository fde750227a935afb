"""The model families quantize knows, each in its own module: how a family's methods are
calibrated, quantized and judged. `qnn_quant.api` does the rest for every family alike (load the
methods, write them, carry the inputs forward, seal).

- `single`: one method (`forward`), calibrated on the prepared samples and judged output by
  output and layer by layer against the fp32 program.
- `causal_lm`: a generating decoder's `prefill` and `decode`, calibrated through prefill with one
  set of scales for both, judged by teacher-forced logits on the eval texts (a causal LM
  prepared without a KV cache is one logits method, which it hands to `single`).

The family is picked by the program kind prepare recorded (`ProgramRecord.kind`) in `FAMILIES`.
A new family is a module with `check` and `quantize` and an entry there (README.md).
"""

from __future__ import annotations

from pathlib import Path

from qnn_common.errors import ArtifactError
from qnn_common.manifest import Manifest
from qnn_common.stages import program_of
from qnn_quant.families import causal_lm, single
from qnn_quant.families.family import Family

# The recorded program kind -> the family that quantizes it: every kind prepare records
# (qnn_prepare.task.KINDS; qnn_pipeline/kinds_test.py holds the lists together).
FAMILIES: dict[str, Family] = {
    "causal-lm": causal_lm,
    "text-encoder": single,
    "vision": single,
    "custom": single,
}


def family_for(source: Path, src: Manifest) -> Family:
    """The family of the prepared artifact at `source` (its manifest `src`), by its recorded
    program kind; refused before any method loads if the family cannot take the program."""
    kind = program_of(source, src).kind
    family = FAMILIES.get(kind)
    if family is None:
        raise ArtifactError(
            source, f"records a program of kind {kind!r}, which quantize has no family for (it "
            f"has {', '.join(sorted(FAMILIES))}); prepare it with the qnn-prepare that matches "
            "this qnn-quant, or add the family (qnn_quant/families/README.md)",
        )
    family.check(source, src)
    return family
