"""An evaluation as a person reads it (eval.md) and as a gate judges it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from qnn_common.errors import PipelineError
from qnn_common.gates import NEXT_RECIPE, EvalGates
from qnn_common.recipes import Recipe
from qnn_infer.evaluation.blocks import worst_blocks
from qnn_infer.evaluation.plot import line_svg
from qnn_infer.gate_check import next_token_bound


def gate_failures(
    evaluation: dict[str, Any], gates: EvalGates, model: str, recipe: Recipe | None
) -> list[str]:
    """What `model`'s figures miss of `gates`, one sentence each naming the figure, its bound
    and the recipe to try; empty when it passes."""
    misses: list[str] = []
    corpus = evaluation.get("corpus", {}).get("candidates", {}).get(model)
    if corpus is not None:
        kl = corpus["kl_divergence"]["mean"]
        kl_low = next_token_bound(corpus, "kl_mean_low")
        assert kl_low is not None
        if gates.max_kl_mean is not None and kl_low > gates.max_kl_mean:
            misses.append(f"KL divergence from fp32 {kl:.4f} nats per token "
                          f"({_interval(corpus['kl_divergence'].get('mean_interval'), 4)}) > "
                          f"{gates.max_kl_mean} (over {corpus['tokens']} corpus tokens)")
        top = corpus["same_top_percent"]
        top_high = next_token_bound(corpus, "same_top_high")
        assert top_high is not None
        if gates.min_same_top_percent is not None and top_high < gates.min_same_top_percent:
            decided = corpus.get("same_top_decided_percent")
            misses.append(
                f"same top token as fp32 {top:.1f} %, where fp32 decided "
                + ("(no interval recorded)" if decided is None else
                   f"{decided['value']:.1f} % ({_interval(decided, 1)})")
                + f" < {gates.min_same_top_percent} %")
        ratio = corpus["perplexity_ratio"]
        if (gates.max_perplexity_increase is not None
                and ratio["low"] - 1 > gates.max_perplexity_increase):
            misses.append(
                f"perplexity {_signed(ratio['value'])} vs fp32 (interval "
                f"[{_signed(ratio['low'])}, {_signed(ratio['high'])}]) > "
                f"+{100 * gates.max_perplexity_increase:.0f} %")
    drop = answer_drop(evaluation, model)
    if drop is not None and gates.max_answer_drop_points is not None:
        points, lost, gained, known = drop
        if points > gates.max_answer_drop_points and answers_clearly_lost(lost, gained):
            misses.append(f"prompt suite: {lost} known answers lost and {gained} gained of "
                          f"{known} ({points:.1f} points > {gates.max_answer_drop_points})")
    if misses and recipe is not None and recipe in NEXT_RECIPE:
        tries = " or ".join(r.value for r in NEXT_RECIPE[recipe])
        misses.append(f"try --recipe {tries}, or keep the worst layers in float (keep_float; "
                      "the per-layer report ranks them)")
    return misses


def _interval(interval: dict[str, Any] | None, digits: int) -> str:
    """"interval [low, high]", or that there is none (a record from before intervals)."""
    if interval is None:
        return "no interval recorded"
    return f"interval [{interval['low']:.{digits}f}, {interval['high']:.{digits}f}]"


def _brackets(interval: dict[str, Any] | None, digits: int) -> str:
    return "" if interval is None else (
        f" [{interval['low']:.{digits}f}, {interval['high']:.{digits}f}]")


def _paired_rows(
    prompts: dict[str, Any], model: str
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(reference row, `model`'s row) for each prompt `model` answered."""
    models = prompts.get("models", {})
    reference = models.get(prompts.get("reference"))
    mine = models.get(model)
    if reference is None or mine is None:
        return []
    by_index = dict(zip(reference["indices"], reference["rows"], strict=True))
    return [(by_index[i], row) for i, row in zip(mine["indices"], mine["rows"], strict=True)]


def answer_drop(evaluation: dict[str, Any], model: str) -> tuple[float, int, int, int] | None:
    """(points lost net, answers lost, answers gained, prompts with a known answer) of `model`
    against the reference on the prompts both answered; None without known answers."""
    pairs = [
        (ref["answer_found"], mine["answer_found"])
        for ref, mine in _paired_rows(evaluation.get("prompts", {}), model)
        if mine["answer_found"] is not None
    ]
    if not pairs:
        return None
    lost = sum(1 for r, m in pairs if r and not m)
    gained = sum(1 for r, m in pairs if m and not r)
    return 100.0 * (lost - gained) / len(pairs), lost, gained, len(pairs)


def answers_clearly_lost(lost: int, gained: int) -> bool:
    """Whether `lost` answers against `gained` is more than chance, McNemar's test at 95 %
    (normal approximation, one-sided): on the prompts where the two models disagree, the
    program loses more than a fair coin would. One flip on a near tie never is."""
    return lost - gained > _Z95_ONE_SIDED * math.sqrt(lost + gained)


_Z95_ONE_SIDED = 1.645


def _signed(ratio: float) -> str:
    return f"{100 * (ratio - 1):+.1f} %"


def markdown(evaluation: dict[str, Any], title: str, failures: list[str] | None = None) -> str:
    """eval.md: what ran over what, the three tables, the prompts that diverged."""
    suite = evaluation["suite"]
    lines = [f"# {title}", "",
             f"Suite `{suite['name']}`; the reference is `{evaluation['models'][0]}`. Data: "
             + "; ".join(f"{k}: {v}" for k, v in evaluation["sources"].items()) + ".", ""]
    if failures is not None:
        lines += ["**Gates: ok**" if not failures else "**Gates: failed**", ""]
        lines += [f"- {f}" for f in failures] + ([""] if failures else [])
    corpus = evaluation["corpus"]
    lines += ["## Next token over the corpus", "",
              f"{corpus['tokens']} tokens in {corpus['windows']} windows of up to "
              f"{corpus['window']}; each model's row says what it read.", "",
              "| model | tokens | KL mean [95 %] | KL p99 | same top % [95 %] | flips (near tie) "
              "| perplexity [95 %] | vs fp32 [95 %] |", "|---|---|---|---|---|---|---|---|"]
    ref = corpus["candidates"].get(corpus["reference"])
    if ref:
        lines.append(f"| {corpus['reference']} | {ref['tokens']} | | | | | {ref['perplexity']} "
                     "| |")
    for name, c in corpus["candidates"].items():
        if name == corpus["reference"]:
            continue
        p, r = c["perplexity"], c["perplexity_ratio"]
        kl_i, top_i = c["kl_divergence"].get("mean_interval"), c.get("same_top_percent_interval")
        lines.append(
            f"| {name} | {c['tokens']} | {c['kl_divergence']['mean']:.4f}"
            f"{_brackets(kl_i, 4)} | {c['kl_divergence']['p99']:.3f} | "
            f"{c['same_top_percent']:.1f}{_brackets(top_i, 1)} | {c['flips']} "
            f"({c['near_tie_flips']}) | {p['value']} [{p['low']}, {p['high']}] | "
            f"{_signed(r['value'])} [{_signed(r['low'])}, {_signed(r['high'])}] |")
    prompts = evaluation["prompts"]
    lines += ["", f"## Prompt suite (greedy, {prompts['new_tokens']} new tokens)", ""]
    lines += _skipped(prompts, "prompts")
    lines += ["| model | prompts | answers found | fp32 on the same | identical to fp32 | "
              "diverged (near tie) | mean same tokens | repetition |",
              "|---|---|---|---|---|---|---|---|"]
    for name, m in prompts["models"].items():
        lines.append(
            f"| {name} | {m['prompts']} | {m['answers_found']}/{m['answers_known']} | "
            f"{m['reference_answer_percent']} % | {m['identical']} | {m['diverged']} "
            f"({m['diverged_near_tie']}) | {m['mean_same_tokens']} | {m['mean_repetition']} |")
    tasks = evaluation["tasks"]
    lines += ["", "## Tasks (log-likelihood, as lm-eval's acc / acc_norm)", ""]
    lines += _skipped(tasks, "items")
    lines += ["| model | items | acc % | acc_norm % | fp32 acc on the same % | same pick as "
              "fp32 % | by task (acc %) |", "|---|---|---|---|---|---|---|"]
    for name, t in tasks["models"].items():
        by = ", ".join(f"{k} {v}" for k, v in t["by_task"].items())
        lines.append(f"| {name} | {t['items']} | {t['acc']} | {t['acc_norm']} | "
                     f"{t['reference_acc']} | {t['same_pick_as_reference']} | {by} |")
    lines += _blocks(evaluation.get("blocks"))
    lines += _divergences(prompts)
    lines += ["", "Seconds: " + ", ".join(f"{k} {v}" for k, v in evaluation["seconds"].items()),
              ""]
    return "\n".join(lines)


BLOCKS_SVG = "eval-blocks.svg"


def _blocks(errors: dict[str, Any] | None) -> list[str]:
    if not errors or not errors["blocks"]:
        return []
    worst = worst_blocks(errors)
    lines = ["", f"## Where the error enters: each decoder block's output, {errors['model']} "
             f"against {errors['reference']}", "",
             f"Over the first {errors['tokens']} corpus tokens ({errors['windows']} "
             f"window{'' if errors['windows'] == 1 else 's'}). "
             "SQNR of the block's output (the residual stream) in dB; a block after which it "
             "falls much is where the recipe loses, a steady slope is error carried forward. "
             "Fell most after: "
             + ", ".join(f"block {r['block']} ({r['fell_db']:+.1f} dB)" for r in worst) + ".",
             "", f"![SQNR by block]({BLOCKS_SVG})", "",
             "| block | SQNR dB | fell dB |", "|---|---|---|"]
    for r in errors["blocks"]:
        fell = "" if r["fell_db"] is None else f"{r['fell_db']:+.2f}"
        lines.append(f"| {r['block']} | {r['sqnr_db']:.2f} | {fell} |")
    return lines


def blocks_svg(errors: dict[str, Any]) -> str:
    """The per-block SQNR as a line chart (eval.md links it as BLOCKS_SVG)."""
    return line_svg([(r["block"], r["sqnr_db"]) for r in errors["blocks"]],
                    title=f"{errors['model']} against {errors['reference']}, per decoder block",
                    x_label="decoder block", y_label="output SQNR (dB)")


def _skipped(part: dict[str, Any], what: str) -> list[str]:
    count = part.get("skipped_too_long", 0)
    return [f"{count} {what} longer than the model's context were skipped.", ""] if count else []


def _divergences(prompts: dict[str, Any]) -> list[str]:
    """Each prompt where a model's reply left the reference's, with the reference's margin."""
    lines = ["", "## Where replies left fp32's", "",
             "A margin is the float model's own preference (nats) for its token over the one "
             "taken at the first difference: under 0.1 a near tie, not a broken program.", ""]
    for name in prompts["models"]:
        if name == prompts["reference"]:
            continue
        for ref, row in _paired_rows(prompts, name):
            if row["margin"] is None:
                continue
            lines += [f"- **{name}**, {row['prompt']!r}: after {row['same_tokens']} same tokens, "
                      f"margin {row['margin']:.3f}", f"  - fp32: {_quote(ref['text'])}",
                      f"  - {name}: {_quote(row['text'])}"]
    return lines


def _quote(text: str) -> str:
    flat = " ".join(text.split())
    return f"`{flat[:160]}`" if flat else "(empty)"


class EvalGateError(PipelineError):
    """The evaluation ran and its report is written, but the program misses its gates."""

    def __init__(self, report: Path, failures: list[str]) -> None:
        self.report = report
        self.failures = failures
        super().__init__(
            "evaluation: the program misses its gates: " + "; ".join(failures)
            + f". The figures: {report}; --no-accuracy-gates reports without judging"
        )
