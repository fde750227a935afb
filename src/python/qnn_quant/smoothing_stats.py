"""The activations `qnn_quant.smoothed_blocks` chooses its factors from: a causal LM's float
methods run on a few calibration texts as the runtime runs them, every smoothable input of
linears recorded on the way."""

from __future__ import annotations

import logging
import operator
import time
from collections.abc import Callable, Sequence

import torch
from torch.export import ExportedProgram

from qnn_common.causal_lm.steps import feed, method_steps
from qnn_common.llm_spec import LlmSpec
from qnn_quant.method_modules import module_runner, share_state, written_buffers
from qnn_quant.smoothed_blocks import (
    MAX_ROWS,
    BlockScale,
    choose_scale,
    smoothable_inputs,
    weight_path,
)

# Calibration texts read to choose the factors: a few hundred tokens show where the large
# channels are (they are the same channels in every text).
TEXTS = 4

log = logging.getLogger(__name__)


class _Rows:
    """Per smoothable input: its rows seen so far, at most MAX_ROWS."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, ...], list[torch.Tensor]] = {}

    def recorder(self, key: tuple[str, ...]) -> Callable[[torch.Tensor], None]:
        def record(x: torch.Tensor) -> None:
            kept = self.rows.setdefault(key, [])
            have = sum(r.shape[0] for r in kept)
            if have < MAX_ROWS:
                kept.append(x.detach().reshape(-1, x.shape[-1])[: MAX_ROWS - have].clone())

        return record


def choose_block_scales(
    programs: dict[str, ExportedProgram],
    *,
    spec: LlmSpec,
    calibration: Sequence[torch.Tensor],
    eligible: Callable[[torch.fx.Node, torch.Tensor], bool],
    group_size: int,
    rope: tuple[torch.Tensor, torch.Tensor] | None,
    initial_state: Callable[[torch.nn.Module], Callable[[], None]],
) -> dict[str, BlockScale]:
    """One factor per smoothable input of the methods (keyed by its first divided constant),
    from their float run on the first TEXTS `calibration` texts (`initial_state`: a module's
    function that puts its cache and counters back between texts)."""
    t = time.perf_counter()
    rows = _Rows()
    modules: dict[str, torch.fx.GraphModule] = {}
    weights: dict[tuple[str, ...], list[torch.Tensor]] = {}
    for method, ep in programs.items():
        gm = ep.module()
        assert isinstance(gm, torch.fx.GraphModule)
        for x, (divided, linears) in smoothable_inputs(gm, eligible, group_size).items():
            weights[divided] = [operator.attrgetter(weight_path(lin))(gm) for lin in linears]
            with gm.graph.inserting_after(x):
                gm.graph.call_function(rows.recorder(divided), (x,))
        gm.recompile()
        modules[method] = gm
    share_state(modules, written_buffers(programs))
    texts = list(calibration[:TEXTS])
    prefill, decode = method_steps(spec, module_runner(modules, spec), rope)
    restores = [initial_state(module) for module in modules.values()]
    for sequence in texts:
        feed(prefill, decode, sequence.tolist(), 0, spec)
        for restore in restores:
            restore()
    scales = {
        divided[0]: choose_scale(divided, torch.cat(kept), weights[divided], group_size)
        for divided, kept in rows.rows.items()
    }
    chosen = [s for s in scales.values() if s.factor > 1]
    log.info(
        "8da4w: %d of %d linear inputs' largest block divided by 2..16 for the per-token int8 "
        "rounding "
        "(chosen on %d calibration text(s) in %.1f s; output error %.2f of unscaled, mean)",
        len(chosen), len(scales), len(texts), time.perf_counter() - t,
        sum(s.error_ratio for s in chosen) / len(chosen) if chosen else 1.0,
    )
    return scales
