"""The sensitivity pass: for each layer group, what promoting it alone from the cheap recipe to
the rich one buys, in KL divergence from the float model, measured on the cheap recipe's
fake-quantized model with that group's weights swapped for the rich recipe's (the float model's,
where the rich recipe is fp32). Weights only: a per-layer recipe changes a layer's weights and
keeps the model's activation width, so that is what the search moves. One quantize per recipe
and one scoring per group, where quantizing each candidate would cost a quantize per group."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from qnn_pipeline.tune.groups import (
    LayerGroup,
    layer_groups,
    linear_weights,
    restore,
    swap_weights,
)
from qnn_pipeline.tune.scoring import Reference, Score
from qnn_quant.fused_qdq import module_tensor
from qnn_quant.lm_steps import artifact_lm_modules

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupGain:
    """A group, and the cheap model's score with that group's weights rich (`changed` False:
    the group's weights are the same at both recipes, e.g. a head 8-bit by default)."""

    group: LayerGroup
    score: Score
    changed: bool = True


@dataclass(frozen=True)
class Sensitivity:
    """The cheap model's score, and each group's when promoted alone."""

    cheap: Score
    gains: tuple[GroupGain, ...]
    seconds: float

    def gain(self, g: GroupGain) -> float:
        """KL divergence promoting `g` alone takes off the cheap model's."""
        return self.cheap.kl - g.score.kl

    def to_json(self) -> dict[str, Any]:
        return {
            "cheap": self.cheap.to_json(), "seconds": round(self.seconds, 1),
            "groups": [{"name": g.group.name, "pattern": g.group.pattern,
                        "layers": list(g.group.paths), "weights": g.group.weights,
                        "changed": g.changed, "kl_gain": round(self.gain(g), 6),
                        **g.score.to_json()}
                       for g in self.gains],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Sensitivity:
        gains = tuple(
            GroupGain(LayerGroup(g["name"], g["pattern"], tuple(g["layers"]), int(g["weights"])),
                      Score.from_json(g), bool(g["changed"]))
            for g in data["groups"])
        return cls(Score.from_json(data["cheap"]), gains, float(data["seconds"]))


def _method_weights(modules: Sequence[torch.nn.Module]) -> list[dict[str, torch.Tensor]]:
    out = []
    for module in modules:
        assert isinstance(module, torch.fx.GraphModule)
        out.append({path: module_tensor(module, target)
                    for path, target in linear_weights(module).items()})
    return out


def measure(
    reference: Reference, cheap: Path, rich: Path,
    progress: Callable[[int, int, str], None] | None = None,
) -> Sensitivity:
    """Each layer group's gain: the cheap quantize artifact's fake-quant model scored against
    `reference` with that group's weights taken from `rich` (a quantize artifact's folded
    weights, or a prepare artifact's float ones), one group at a time."""
    t = time.perf_counter()
    lm, modules = artifact_lm_modules(cheap, "cheap")
    _, rich_modules = artifact_lm_modules(rich, "rich")
    methods = list(modules)
    targets = [modules[m] for m in methods]
    sources = _method_weights([rich_modules[m] for m in methods])
    first = targets[0]
    assert isinstance(first, torch.fx.GraphModule)
    groups = layer_groups(first)
    base = reference.score(lm)
    gains = []
    for number, group in enumerate(groups, 1):
        saved = swap_weights(targets, sources, group)
        try:
            # The same weights at both recipes (a head 8-bit by default): nothing to promote.
            changed = any(not torch.equal(t, v) for t, v in saved)
            score = reference.score(lm) if changed else base
        finally:
            restore(saved)
        gains.append(GroupGain(group, score, changed))
        if progress is not None:
            progress(number, len(groups), group.name)
    seconds = time.perf_counter() - t
    log.info("sensitivity: %d groups scored in %.0f s", len(groups), seconds)
    return Sensitivity(base, tuple(gains), seconds)
