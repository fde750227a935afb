"""Per-layer recipes: a table of module-path patterns, each giving the layers it matches another
recipe than the model's (or fp32: left in float).

The search for a mixed recipe (`qnn-pipeline tune`) and hand-written ones alike come down to this
table: upstream's Llama-3.2-1B recipe is 16a4w_block with the output head and layers 0-3's down
projections at 16a8w, which here reads (the head takes 8-bit weights by default already:
`int8_weights`)

    [quantize]
    recipe = "16a4w_block"
    layer_recipes = [
      { pattern = 'layers\\.[0-3]\\.mlp\\.down_proj$', recipe = "16a8w" },
    ]

Patterns are regular expressions searched in a layer's nn.Module path (as `keep_float`); the
first entry that matches a layer decides its recipe. Which recipes mix, and why
(`check_layer_recipes`):

- **fp32** anywhere: the layer stays float (QNN refuses a float linear inside a quantized
  program, as it does for `keep_float`).
- **Static recipes with the model's activation bits** on the same backend and SoC: a layer's
  weights change (8, 4 bits per channel, LPBQ blocks, 16 or 2 bits); its activations keep the
  model's width. Mixing 8- and 16-bit activations would need a requantization at every border,
  which the quantizer does not insert.
- **8da4w** takes fp32 only: its activation scales are chosen per token at run time and its
  weight transform is one for the whole model; `int8_weights` gives chosen linears 8-bit weights.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from qnn_common.errors import ConfigValidationError
from qnn_common.recipes import Backend, Recipe, check_recipe, parse_enum, recipes_for
from qnn_common.soc import Soc


@dataclass(frozen=True)
class LayerRecipe:
    """One entry of the table: the layers whose module path `pattern` matches get `recipe`."""

    pattern: str
    recipe: Recipe

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, str) or not self.pattern:
            raise ConfigValidationError(
                "quantize.layer_recipes.pattern", self.pattern,
                "must be a regular expression over module paths (e.g. 'layers\\.0\\.mlp')",
            )
        try:
            re.compile(self.pattern)
        except re.error as err:
            raise ConfigValidationError(
                "quantize.layer_recipes.pattern", self.pattern,
                f"not a regular expression: {err}",
            ) from None
        if not isinstance(self.recipe, Recipe):
            object.__setattr__(self, "recipe", parse_enum(
                Recipe, str(self.recipe), "quantize.layer_recipes.recipe"))

    @classmethod
    def parse(cls, text: str) -> LayerRecipe:
        """`PATTERN=RECIPE`, as the CLIs' `--layer-recipe` takes it (split at the last `=`:
        recipe names have none, a pattern may)."""
        pattern, sep, recipe = text.rpartition("=")
        if not sep or not pattern or not recipe:
            raise ConfigValidationError(
                "--layer-recipe", text,
                "expected PATTERN=RECIPE, e.g. 'layers\\.[0-3]\\.mlp\\.down_proj$=16a8w'",
            )
        return cls(pattern, parse_enum(Recipe, recipe.strip(), "--layer-recipe"))

    def to_text(self) -> str:
        return f"{self.pattern}={self.recipe.value}"


def mixable_recipes(backend: Backend, base: Recipe, soc: Soc | None) -> tuple[Recipe, ...]:
    """The recipes a layer of a `base` program may take on `backend` (and `soc`)."""
    if base.is_dynamic or not base.is_quantized:
        return (Recipe.FP32,)
    return (Recipe.FP32, *(
        r for r in recipes_for(backend, soc)
        if r.is_quantized and not r.is_dynamic and r.activation_bits == base.activation_bits
    ))


def check_layer_recipes(
    backend: Backend, base: Recipe, soc: Soc | None, table: Sequence[LayerRecipe],
    field: str = "quantize.layer_recipes",
) -> None:
    """Raise ConfigValidationError for an entry whose recipe cannot mix into a `base` program on
    `backend` (module docstring), saying why and what may."""
    allowed = mixable_recipes(backend, base, soc)
    names = tuple(r.value for r in allowed)
    for entry in table:
        recipe = entry.recipe
        where = f"{field}[{entry.pattern!r}]"
        if recipe is Recipe.FP32 or recipe in allowed:
            continue
        if base.is_dynamic:
            raise ConfigValidationError(
                where, recipe.value,
                f"{base.value} chooses its activation scales per token at run time and "
                "transforms the whole model's weights one way, so its layers mix with fp32 "
                "(float) only; for 8-bit weights in chosen linears use int8_weights "
                "(--int8-weights)", allowed=names,
            )
        check_recipe(backend, recipe, soc, where)  # says why the backend or SoC cannot run it
        if recipe.is_dynamic or recipe.activation_bits != base.activation_bits:
            raise ConfigValidationError(
                where, recipe.value,
                f"a {base.value} program's activations are {base.activation_bits}-bit and a "
                "layer keeps them (mixing activation widths needs a requantization at each "
                "border, which the quantizer does not insert); pick a recipe with "
                f"{base.activation_bits}-bit activations for the layer, or change the model's "
                "recipe", allowed=names,
            )
        raise ConfigValidationError(where, recipe.value, "does not mix here", allowed=names)


def first_match(path: str | None, table: Sequence[LayerRecipe]) -> int | None:
    """The index of the first entry of `table` matching the module path `path`, or None."""
    if path is None:
        return None
    return next((i for i, entry in enumerate(table) if re.search(entry.pattern, path)), None)


def layer_recipe_for(path: str | None, table: Sequence[LayerRecipe]) -> Recipe | None:
    """The recipe the first entry of `table` matching the module path `path` gives, or None."""
    i = first_match(path, table)
    return None if i is None else table[i].recipe
