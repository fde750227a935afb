"""The registry of recipe handlers: a recipe's kind (how its activation scales are chosen) and
the function that quantizes a program's methods at it. A handler module registers its function
with `register_handler`, as torchao's `register_quantize_module_handler` does; `qnn_quant.engine`
imports every handler module and looks handlers up here.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Protocol, TypeVar

from torch.export import ExportedProgram

from qnn_common.config import QuantizeConfig
from qnn_common.recipes import Recipe
from qnn_quant.calibration import Calibration
from qnn_quant.gptq import GptqResult
from qnn_quant.intx import IntxResult


class RecipeKind(enum.StrEnum):
    """How a recipe's activation scales are chosen: the handler that quantizes it."""

    STATIC = "static"  # from calibration (PT2E)
    DYNAMIC = "dynamic"  # per token at run time (8da4w)


def kind_of(recipe: Recipe) -> RecipeKind:
    return RecipeKind.DYNAMIC if recipe.is_dynamic else RecipeKind.STATIC


WeightsRecord = GptqResult | IntxResult | None


class Handler(Protocol):
    def __call__(
        self, programs: dict[str, ExportedProgram], cfg: QuantizeConfig, calibration: Calibration,
    ) -> tuple[dict[str, ExportedProgram], WeightsRecord]:
        """Quantize `programs` (consumed: each float method leaves the dict once converted) at
        `cfg`; the quantized methods, and what rounded their weights (GPTQ's record, 8da4w's
        transform, or None)."""
        ...


H = TypeVar("H", bound=Handler)
_HANDLERS: dict[RecipeKind, Handler] = {}


def register_handler(kind: RecipeKind) -> Callable[[H], H]:
    """Register the decorated function as the handler of `kind`'s recipes."""

    def register(handler: H) -> H:
        _HANDLERS[kind] = handler
        return handler

    return register


def handler_for(recipe: Recipe) -> Handler:
    """The handler registered for `recipe`'s kind (`qnn_quant.engine` imports every handler
    module, so each has registered by the time the engine runs)."""
    kind = kind_of(recipe)
    if kind not in _HANDLERS:
        raise LookupError(f"no handler registered for {kind.value} recipes ({recipe.value}): "
                          "its module must be imported by qnn_quant.engine")
    return _HANDLERS[kind]
