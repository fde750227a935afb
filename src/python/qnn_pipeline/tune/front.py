"""What a search leaves a person: the verified candidates as a table with the Pareto front
marked (front.md), the front as a chart (front.svg), and the winner as a pipeline TOML file
(recipe.toml) that `qnn-pipeline --config` builds again."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from qnn_common.layer_recipes import LayerRecipe
from qnn_common.store.atomic import atomic_write_text
from qnn_infer.evaluation.plot import line_svg
from qnn_pipeline.tune.search import Candidate, Search, pareto

FRONT_JSON, FRONT_MD, FRONT_SVG, RECIPE_TOML = "front.json", "front.md", "front.svg", "recipe.toml"


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f}"


def markdown(search: Search, extra: Mapping[str, Any]) -> str:
    p, b = search.plan, search.budget
    front = {c.promoted for c in pareto(list(search.verified.values()))}
    lines = [
        f"# Recipe search: {p.cheap.value}, groups promoted to {p.rich.value}",
        "",
        f"Budget: KL divergence <= {b.max_kl if b.max_kl is not None else 'any'}, searched "
        f"weights <= {_mb(b.max_weight_bytes) + ' MB' if b.max_weight_bytes else 'any'}. "
        f"{len(p.order)} layer groups can move ({len(p.fixed)} have the same weights at both "
        f"recipes). Every row was quantized and scored (fake quant vs fp32, "
        f"{extra.get('tokens', '?')} tokens); 'predicted' is the sensitivity pass's sum.",
        "",
        "| promoted | weights MB | KL (mean) | KL 95 % interval | predicted KL | same top % "
        "| perplexity ratio | front |",
        "|---:|---:|---:|---|---:|---:|---:|---|",
    ]
    for k in sorted(search.verified):
        c = search.verified[k]
        s = c.score
        mark = "winner" if search.winner is c else ("yes" if k in front else "")
        lines.append(
            f"| {k} | {_mb(c.weight_bytes)} | {s.kl:.5f} | [{s.kl_low:.5f}, {s.kl_high:.5f}] "
            f"| {c.predicted_kl:.5f} | {s.same_top:.1f} | {s.perplexity_ratio:.4f} | {mark} |")
    lines.append("")
    if search.winner is None:
        lines.append("**No candidate meets the budget**: the richest within the byte budget is "
                     "the last row above. Loosen a bound, or pick a richer recipe to promote to "
                     "(--promote-to).")
        ks = sorted(search.verified)
        if len(ks) > 1:
            least, most = search.verified[ks[0]], search.verified[ks[-1]]
            if most.score.kl_low >= least.score.kl_high * 0.5:
                lines += ["", f"Promoting {most.promoted} group(s) took KL from "
                          f"{least.score.kl:.4g} to {most.score.kl:.4g} (predicted "
                          f"{most.predicted_kl:.4g}): the loss is not in these layers' weights "
                          "(a per-layer recipe keeps the model's activation width), so no mix "
                          "of this pair meets the budget. Pick another recipe for the model."]
    else:
        w = search.winner
        lines += [f"**Winner**: {w.promoted} group(s) promoted "
                  f"(`{RECIPE_TOML}` rebuilds it: `qnn-pipeline --config {RECIPE_TOML}`).", ""]
        lines += [f"- `{e.pattern}` -> {e.recipe.value}" for e in w.table]
        if "program" in extra:
            lines += ["", f"Its program: {extra['program']}"]
    lines += ["", "Promotion order (KL gained alone per weight, the most first):", "",
              "| # | group | weights | KL gained alone |", "|---:|---|---:|---:|"]
    for i, g in enumerate(p.order, 1):
        gain = search.cheap_kl - g.score.kl
        lines.append(f"| {i} | {g.group.name} | {g.group.weights} | {gain:.5f} |")
    return "\n".join(lines) + "\n"


def front_svg(candidates: Sequence[Candidate]) -> str:
    points = [(c.weight_bytes / 1e6, c.score.kl) for c in pareto(list(candidates))]
    return line_svg(points, title="Verified Pareto front", x_label="searched weights (MB)",
                    y_label="KL divergence from fp32 (nats / token)")


def toml_value(value: Any) -> str:
    """One TOML value: strings, numbers, booleans, lists and the table's `{pattern, recipe}`
    entries (what a pipeline config holds)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"TOML has no {value}")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(value, Path):
        return json.dumps(str(value))
    if isinstance(value, LayerRecipe):
        pattern, recipe = toml_value(value.pattern), toml_value(value.recipe.value)
        return f"{{ pattern = {pattern}, recipe = {recipe} }}"
    if hasattr(value, "value") and isinstance(value.value, str):  # an enum
        return json.dumps(value.value)
    if isinstance(value, list | tuple):
        if value and isinstance(value[0], LayerRecipe):
            return "[\n" + "".join(f"  {toml_value(v)},\n" for v in value) + "]"
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def pipeline_toml(sections: Mapping[str, Mapping[str, Any]], header: str) -> str:
    out = [f"# {line}" if line else "#" for line in header.splitlines()]
    for name, table in sections.items():
        values = {k: v for k, v in table.items() if v is not None}
        if not values:
            continue
        out += ["", f"[{name}]"]
        out += [f"{k} = {toml_value(v)}" for k, v in values.items()]
    return "\n".join(out) + "\n"


def write_report(out: Path, search: Search, sections: Mapping[str, Mapping[str, Any]],
                 extra: Mapping[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    data = {"plan": {"cheap": search.plan.cheap.value, "rich": search.plan.rich.value,
                     "order": [g.group.name for g in search.plan.order]},
            "budget": search.budget.to_json(), **extra,
            "candidates": [search.verified[k].to_json() for k in sorted(search.verified)],
            "front": [c.promoted for c in pareto(list(search.verified.values()))],
            "winner": None if search.winner is None else search.winner.promoted}
    atomic_write_text(out / FRONT_JSON, json.dumps(data, indent=2) + "\n")
    atomic_write_text(out / FRONT_MD, markdown(search, extra))
    if search.verified:
        atomic_write_text(out / FRONT_SVG, front_svg(list(search.verified.values())))
    if search.winner is not None:
        header = (f"Found by qnn-pipeline tune: {search.plan.cheap.value} with "
                  f"{search.winner.promoted} layer group(s) at {search.plan.rich.value}; KL "
                  f"{search.winner.score.kl:.5f} on {search.winner.score.tokens} tokens.\n"
                  f"Rebuild: qnn-pipeline --config {RECIPE_TOML}")
        table = {**sections, "quantize": {**sections.get("quantize", {}),
                                          "layer_recipes": list(search.winner.table) or None}}
        atomic_write_text(out / RECIPE_TOML, pipeline_toml(table, header))
