"""What a model family checks of a whole run before any stage starts, one module per family.

The orchestrator knows no family: it calls `preflight`, and each family registered in
`FAMILIES` refuses the settings that cannot work for it (a causal LM's prompt that its context
cannot hold, sharding without a KV-cache export) before minutes of export and lowering are spent.
The stages' own family seams are listed in qnn_quant/families/README.md.
"""

from __future__ import annotations

from typing import Protocol

from qnn_common.config import Stage
from qnn_pipeline.context import PipelineContext
from qnn_pipeline.families import causal_lm


class PipelineFamily(Protocol):
    def preflight(self, ctx: PipelineContext, first: Stage) -> None:
        """Raise ConfigValidationError, saying what to change, for a run (`ctx`, starting at
        `first`) this family's settings cannot make; return quietly otherwise."""
        ...


# By the program kind prepare records; all of them are asked, in this order: the model is not
# loaded yet, so a family checks the settings that are its own.
FAMILIES: dict[str, PipelineFamily] = {
    "causal-lm": causal_lm,
}


def preflight(ctx: PipelineContext, first: Stage) -> None:
    """Every family's checks of the run, before any stage runs."""
    for family in FAMILIES.values():
        family.preflight(ctx, first)
