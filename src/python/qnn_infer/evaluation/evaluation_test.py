"""The evaluation's parts on made-up logits and files: the eval file's rules and errors, window
cutting, the corpus scores and token limits, the prompt comparison and its margin, the
multiple-choice split and picks, the gates' verdicts and eval.md. The real models and programs
are scored in tests/llm/evaluation_test.py; here the logits a model would give are a function of
the tokens (`logits` replaced), so every expected figure is known exactly."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest

from qnn_common.causal_lm.steps import StepLm
from qnn_common.errors import ArtifactError
from qnn_common.gates import EvalGates, default_eval_gates
from qnn_common.recipes import Recipe
from qnn_infer.evaluation import corpus, data, tasks
from qnn_infer.evaluation.data import Document, EvalData, PromptCase, TaskItem, spread
from qnn_infer.evaluation.lm import Reply
from qnn_infer.evaluation.prompts import compare_reply, repetition, summarize
from qnn_infer.evaluation.report import answer_drop, gate_failures, markdown

VOCAB = 8


def _lm(name: str) -> StepLm:
    # Only the name and the context matter: `logits` is replaced by a function of (name, ids).
    return StepLm(name, cast(Any, None), cast(Any, None), cast(Any, SimpleNamespace(context=6)))


def _fake_logits(ids: Sequence[int], shift: int = 0) -> np.ndarray:
    """A model that predicts token (t + 1 + shift) % VOCAB after token t, sharply."""
    out = np.zeros((len(ids), VOCAB), dtype=np.float32)
    for i, t in enumerate(ids):
        out[i, (t + 1 + shift) % VOCAB] = 6.0
    return out


@pytest.fixture
def fake_models(monkeypatch: pytest.MonkeyPatch) -> None:
    def logits(lm: StepLm, ids: Sequence[int]) -> np.ndarray:
        return _fake_logits(ids, shift={"fp32": 0, "same": 0, "broken": 3}[lm.name])

    def continued(lm: StepLm, ids: Sequence[int], start: int) -> np.ndarray:
        return logits(lm, ids)  # the fake's next token depends on the current one alone

    monkeypatch.setattr(corpus, "logits", logits)
    monkeypatch.setattr(tasks, "logits", logits)
    monkeypatch.setattr(tasks, "continued", continued)


def _base() -> EvalData:
    return EvalData((Document("d", "x"),), (PromptCase("p"),),
                    (TaskItem("t", "c", ("a", "b"), 0),),
                    {"corpus": "shipped", "prompts": "shipped", "tasks": "shipped"})


def test_shipped_data_is_what_provenance_lists() -> None:
    shipped = data.shipped()
    assert [d.name for d in shipped.documents] == [
        *(f"moby-dick-ch0{n}" for n in range(1, 6)), "sotu-1941-roosevelt", "sotu-1962-kennedy"]
    assert all(len(d.text) > 4000 for d in shipped.documents)
    assert len(shipped.prompts) == 55
    assert sum(1 for p in shipped.prompts if p.answers) == 45
    assert len(shipped.tasks) == 200
    assert all(0 <= t.answer < len(t.choices) for t in shipped.tasks)
    assert len({t.task for t in shipped.tasks}) == 6


def test_eval_file_replaces_only_the_parts_it_holds(tmp_path: Path) -> None:
    text = tmp_path / "mine.txt"
    text.write_text("My own held-out text.\n", encoding="utf-8")
    mixed = data.with_eval_file(_base(), text)
    assert mixed.documents == (Document("mine", "My own held-out text.\n"),)
    assert mixed.prompts == _base().prompts
    assert mixed.sources["corpus"] == f"--eval-file {text}"

    rows = tmp_path / "mine.jsonl"
    rows.write_text(
        json.dumps({"prompt": "Capital of France?", "answers": "Paris"}) + "\n\n"
        + json.dumps({"context": "Two plus two is", "choices": [" four", " five"], "answer": 0})
        + "\n", encoding="utf-8")
    mine = data.with_eval_file(_base(), rows)
    assert mine.prompts == (PromptCase("Capital of France?", ("Paris",)),)
    assert mine.tasks == (TaskItem("user", "Two plus two is", (" four", " five"), 0),)
    assert mine.documents == _base().documents
    assert mine.sources == {"corpus": "shipped", "prompts": f"--eval-file {rows}",
                            "tasks": f"--eval-file {rows}"}


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("{not json", "line 1 is not JSON"),
        ("[1, 2]", "line 1 is not a JSON object"),
        ('{"question": "x"}', "has keys ['question']; a row is a prompt"),
        ('{"prompt": ""}', "'prompt' must be a non-empty string"),
        ('{"prompt": "x", "answers": [1]}', "'answers' must be a list of non-empty strings"),
        ('{"context": "c", "choices": ["a"], "answer": 0}', "at least 2 strings"),
        ('{"context": "c", "choices": ["a", "b"], "answer": 2}',
         "'answer' must be the index of the right choice (0 to 1), got 2"),
        ('{"context": "c", "choices": ["a", "b"], "answer": true}', "got true"),
    ],
)
def test_a_bad_row_is_refused_with_its_line(tmp_path: Path, line: str, says: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    with pytest.raises(ArtifactError) as err:
        data.with_eval_file(_base(), path)
    assert says in str(err.value)


def test_unusable_files_are_refused_before_parsing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ArtifactError, match="no such file"):
        data.with_eval_file(_base(), tmp_path / "missing.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n", encoding="utf-8")
    with pytest.raises(ArtifactError, match="is empty"):
        data.with_eval_file(_base(), empty)
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"ok \xff\xfe")
    with pytest.raises(ArtifactError, match="not UTF-8 text .* at byte 3"):
        data.with_eval_file(_base(), binary)
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ArtifactError, match="holds no rows"):
        data.with_eval_file(_base(), blank)
    monkeypatch.setattr(data, "MAX_EVAL_FILE_BYTES", 4)
    with pytest.raises(ArtifactError, match="more than the 4 an eval file may hold"):
        data.with_eval_file(_base(), binary)


def test_a_suites_share_is_spread_over_the_data() -> None:
    rows = [f"{kind}{n}" for kind in "abcd" for n in range(5)]
    assert spread(rows, 4) == ["a0", "b0", "c0", "d0"]
    assert spread(rows, 8) == ["a0", "a2", "b0", "b2", "c0", "c2", "d0", "d2"]
    assert spread(rows, None) == rows and spread(rows, 50) == rows


def _encode(text: str) -> list[int]:
    return [ord(c) % VOCAB for c in text]


def test_windows_cut_each_document_and_stop_at_the_token_budget() -> None:
    docs = [Document("a", "x" * 10), Document("b", "y" * 5)]
    assert [len(w) for w in corpus.windows(docs, _encode, 4)] == [4, 4, 2, 4]
    # A last piece of one token scores nothing: dropped.
    assert [len(w) for w in corpus.windows([Document("c", "z" * 9)], _encode, 4)] == [4, 4]
    assert [len(w) for w in corpus.windows(docs, _encode, 4, max_tokens=9)] == [4, 4]
    assert [len(w) for w in corpus.windows(docs, _encode, 4, max_tokens=7)] == [4, 3]
    with pytest.raises(ValueError, match="score nothing"):
        corpus.windows(docs, _encode, 1)


@pytest.mark.usefixtures("fake_models")
def test_corpus_scores_tell_an_equal_model_from_a_broken_one() -> None:
    # Each window counts 0..7 so the fp32 model predicts every next token.
    cut = [list(range(8)) for _ in range(6)]
    result = corpus.score_corpus(_lm("fp32"), [_lm("same"), _lm("broken")], cut,
                                 limits={"broken": 20})
    same, broken = result.candidates["same"], result.candidates["broken"]
    assert same["kl_divergence"]["mean"] == pytest.approx(0.0, abs=1e-9)
    assert same["same_top_percent"] == 100.0
    assert same["tokens"] == 48 and same["windows"] == 6
    assert same["perplexity_ratio"]["value"] == pytest.approx(1.0)
    # The limit: whole windows within 20 tokens.
    assert broken["tokens"] == 16 and broken["windows"] == 2
    assert broken["same_top_percent"] == 0.0
    assert broken["kl_divergence"]["mean"] > 5.0
    assert broken["perplexity_ratio"]["low"] > 10.0
    assert result.candidates["fp32"]["windows"] == 6


def _reply(tokens: Sequence[int]) -> Reply:
    return Reply(tuple(tokens), _fake_logits([0, *tokens][:-1]))


def test_a_reply_is_compared_up_to_its_first_difference() -> None:
    reference = Reply((1, 2, 3), np.array([[0, 5, 0, 0], [0, 0, 4, 3.95], [0, 0, 0, 2]],
                                          dtype=np.float32))
    case = PromptCase("q", ("paris",))
    same = compare_reply(case, reference, reference, "It is Paris.")
    assert same.identical and same.margin is None and same.answer_found is True
    # Diverging at the second token, where fp32 preferred 2 over 3 by 0.05 nats: a near tie.
    flip = compare_reply(case, Reply((1, 3, 3), reference.logits), reference, "It is Rome.")
    assert (flip.identical, flip.same_tokens, flip.answer_found) == (False, 1, False)
    assert flip.margin == pytest.approx(0.05, abs=1e-6)
    rows = [same, flip, compare_reply(PromptCase("open"), reference, reference, "x")]
    summary = summarize(rows)
    assert summary["answers_known"] == 2 and summary["answers_found"] == 1
    assert summary["answer_percent"] == 50.0
    assert summary["diverged"] == 1 and summary["diverged_near_tie"] == 1


def test_repetition_is_the_share_of_recurring_ngrams() -> None:
    assert repetition([1, 2, 3, 4, 5, 6]) == 0.0
    assert repetition([1, 2, 3, 4] * 3) == pytest.approx(1 - 4 / 9)
    assert repetition([1, 2]) == 0.0


def test_a_choice_is_the_continuation_after_the_context() -> None:
    def words(text: str) -> list[int]:  # a word with its leading space is one token, by length
        return [len(w) for w in re.findall(r" ?\S+", text)]

    assert tasks.continuation(words, "Two plus two is", " four") == ([3, 5, 4, 3], [5])
    # A boundary inside a word merges into the context's last token: the choice encoded alone.
    assert tasks.continuation(words, "Two plus tw", "o is") == ([3, 5, 3], [1, 3])


@pytest.mark.usefixtures("fake_models")
def test_tasks_pick_the_likeliest_choice_and_count_agreement() -> None:
    # After token 1 the fp32 model expects 2; "broken" expects 5.
    items = [TaskItem("next", "\x01", ("\x02", "\x05"), 0),
             TaskItem("next", "\x03", ("\x07", "\x04"), 1)]
    out = tasks.run_tasks([_lm("fp32"), _lm("broken")], items, _encode)
    assert out["models"]["fp32"]["acc"] == 100.0
    # A slow model's share: compared with the reference on the same items.
    slow = tasks.run_tasks([_lm("fp32"), _lm("same")], items * 2, _encode, limits={"same": 2})
    assert slow["models"]["same"]["items"] == 2 and slow["models"]["fp32"]["items"] == 4
    assert slow["models"]["same"]["by_task"] == {"next": 100.0}
    # An item longer than the context (6 tokens) is skipped by every model, and counted.
    long = TaskItem("long", "\x01" * 6, ("\x02", "\x05"), 0)
    skipped = tasks.run_tasks([_lm("fp32"), _lm("same")], [*items, long], _encode)
    assert skipped["skipped_too_long"] == 1 and skipped["models"]["same"]["items"] == 2
    assert out["models"]["broken"]["acc"] == 0.0
    assert out["models"]["broken"]["same_pick_as_reference"] == 0.0
    assert out["models"]["broken"]["reference_acc"] == 100.0
    assert out["models"]["fp32"]["by_task"] == {"next": 100.0}


def _evaluation(kl: float, top: float, ratio: tuple[float, float, float],
                mine: Sequence[bool | None],
                intervals: tuple[tuple[float, float], tuple[float, float]] | None = None,
                decided: float | None = None) -> dict[str, Any]:
    """An evaluation's shape around the figures given; `intervals` the KL mean's and the
    decided same-top %'s (`decided`, else `top`)."""
    ref_rows = [{"prompt": f"p{i}", "text": "t", "answer_found": True, "margin": None,
                 "same_tokens": 4} for i in range(len(mine))]
    kl_interval: dict[str, Any] = {}
    top_interval: dict[str, Any] = {}
    if intervals is not None:
        (kl_low, kl_high), (top_low, top_high) = intervals
        kl_interval = {"mean_interval": {"value": kl, "low": kl_low, "high": kl_high}}
        top_interval = {"same_top_decided_percent": {
            "value": top if decided is None else decided, "low": top_low, "high": top_high}}
    my_rows = [{**r, "answer_found": m, "margin": None if m else 1.5, "same_tokens": 1}
               for r, m in zip(ref_rows, mine, strict=True)]
    summary = {"prompts": len(mine), "answers_found": 0, "answers_known": len(mine),
               "reference_answer_percent": 100.0, "identical": 0, "diverged": 0,
               "diverged_near_tie": 0, "mean_same_tokens": 1, "mean_repetition": 0}
    return {
        "suite": {"name": "quick"}, "models": ["fp32", "q"], "sources": {"corpus": "shipped"},
        "corpus": {"reference": "fp32", "tokens": 100, "windows": 2, "window": 50,
                   "candidates": {"fp32": {"tokens": 100, "perplexity": 10.0},
                                  "q": {"tokens": 100, "kl_divergence": {"mean": kl, "p99": 1,
                                                                         **kl_interval},
                                        "same_top_percent": top, **top_interval, "flips": 1,
                                        "near_tie_flips": 0,
                                        "perplexity": {"value": 11, "low": 10, "high": 12},
                                        "perplexity_ratio": dict(zip(
                                            ("value", "low", "high"), ratio, strict=True))}}},
        "prompts": {"reference": "fp32", "new_tokens": 8,
                    "models": {"fp32": {**summary, "rows": ref_rows,
                                        "indices": list(range(len(mine)))},
                               "q": {**summary, "rows": my_rows,
                                     "indices": list(range(len(mine)))}}},
        "tasks": {"models": {}}, "seconds": {"total": 1.0},
    }


def test_gates_pass_a_good_program_and_name_every_miss_of_a_bad_one() -> None:
    gates = EvalGates()
    good = _evaluation(0.05, 95.0, (1.05, 1.01, 1.09), [True] * 9 + [False])
    assert gate_failures(good, gates, "q", Recipe.A8DW4) == []
    bad = _evaluation(0.9, 60.0, (1.6, 1.4, 1.8), [True] * 5 + [False] * 5)
    misses = gate_failures(bad, gates, "q", Recipe.A8DW4)
    assert len(misses) == 5, misses
    assert "KL divergence from fp32 0.9000 nats per token (no interval recorded) > 0.25" \
        in misses[0]
    assert "same top token as fp32 60.0 %, where fp32 decided (no interval recorded) < 80.0 %" \
        in misses[1]
    assert "perplexity +60.0 % vs fp32 (interval [+40.0 %, +80.0 %]) > +25 %" in misses[2]
    assert "5 known answers lost and 0 gained of 10 (50.0 points > 10.0)" in misses[3]
    assert misses[4].startswith("try --recipe 8a8w")
    # Noise: the perplexity's interval reaches below the bound, so it does not fail.
    noisy = _evaluation(0.05, 95.0, (1.3, 1.2, 1.4), [True] * 10)
    assert gate_failures(noisy, gates, "q", None) == []
    assert answer_drop(bad, "q") == (50.0, 5, 0, 10)
    # Two answers of ten lost is 20 points, but two flips are not more than chance (McNemar).
    two = _evaluation(0.05, 95.0, (1.05, 1.01, 1.09), [True] * 8 + [False] * 2)
    assert answer_drop(two, "q") == (20.0, 2, 0, 10)
    assert gate_failures(two, gates, "q", None) == []
    assert gate_failures(bad, EvalGates(None, None, None, None), "q", Recipe.A8DW4) == []


def test_kl_and_same_top_gates_judge_the_end_of_the_interval_noise_cannot_reach() -> None:
    gates = EvalGates()
    # Both points miss (KL 0.3 > 0.25, same top 78 < 80), but both intervals reach the bound.
    noisy = _evaluation(0.3, 78.0, (1.05, 1.01, 1.09), [True] * 10,
                        intervals=((0.2, 0.4), (74.0, 83.0)))
    assert gate_failures(noisy, gates, "q", Recipe.A8W8) == []
    clear = _evaluation(0.3, 78.0, (1.05, 1.01, 1.09), [True] * 10,
                        intervals=((0.27, 0.33), (76.0, 79.5)))
    misses = gate_failures(clear, gates, "q", Recipe.A8W8)
    assert misses[0] == ("KL divergence from fp32 0.3000 nats per token (interval [0.2700, "
                         "0.3300]) > 0.25 (over 100 corpus tokens)")
    assert misses[1] == ("same top token as fp32 78.0 %, where fp32 decided 78.0 % (interval "
                         "[76.0, 79.5]) < 80.0 %")
    assert misses[2].startswith("try --recipe 16a8w")
    row = markdown(clear, "q", misses)
    assert "| q | 100 | 0.3000 [0.2700, 0.3300] | 1.000 | 78.0 |" in row


def test_each_recipe_has_its_own_eval_gates_and_16a2w_none_on_kl() -> None:
    assert default_eval_gates(Recipe.A16W8).max_kl_mean == 0.05
    assert default_eval_gates(Recipe.A8DW4).min_same_top_percent == 85.0
    assert default_eval_gates(Recipe.A8W8) == EvalGates()
    loose = default_eval_gates(Recipe.A16W2)
    assert loose.max_kl_mean is None and loose.min_same_top_percent is None
    assert loose.max_perplexity_increase == EvalGates().max_perplexity_increase
    # SmolLM2's measured figures (docs/eval.md) pass their recipe's gates; 16a4w_block's too
    # (KL 0.152, same top 77.2 %, 82.9 % where fp32 decided: 700 of its 932 flips decided),
    # within what a 4-bit recipe may cost; the same figures under 16a8w's bounds do not.
    for recipe, kl, top in ((Recipe.A8DW4, 0.0184, 90.5), (Recipe.A16W8, 0.0063, 94.5)):
        measured = _evaluation(kl, top, (1.01, 1.005, 1.017), [True] * 10)
        assert gate_failures(measured, default_eval_gates(recipe), "q", recipe) == []
    block = _evaluation(0.152, 77.2, (1.147, 1.124, 1.169), [True] * 10,
                        intervals=((0.14, 0.165), (81.5, 84.2)), decided=82.9)
    assert gate_failures(block, default_eval_gates(Recipe.A16W4_BLOCK), "q",
                         Recipe.A16W4_BLOCK) == []
    misses = gate_failures(block, default_eval_gates(Recipe.A16W8), "q", Recipe.A16W8)
    assert misses[0].startswith("KL divergence from fp32 0.1520")
    assert misses[1].startswith("same top token as fp32 77.2 %, where fp32 decided 82.9 %")
    assert misses[-1].startswith("try --recipe 16a16w")


def test_eval_md_holds_the_three_tables_and_the_divergences() -> None:
    bad = _evaluation(0.9, 60.0, (1.6, 1.4, 1.8), [True, False])
    text = markdown(bad, "Evaluation of q", ["KL too high"])
    assert "**Gates: failed**" in text and "- KL too high" in text
    row = "| q | 100 | 0.9000 | 1.000 | 60.0 | 1 (0) | 11 [10, 12] | +60.0 % [+40.0 %, +80.0 %] |"
    assert row in text
    assert "## Prompt suite" in text and "## Tasks" in text
    assert "- **q**, 'p1': after 1 same tokens, margin 1.500" in text


class _ListTap:
    """A tap that records one fixed tensor per block at every step the model runs."""

    def __init__(self, outputs: dict[int, Any]) -> None:
        self.active = False
        self.outputs = outputs
        self.recorded: dict[int, list[Any]] = {}

    def step(self) -> None:
        if self.active:
            for block, value in self.outputs.items():
                self.recorded.setdefault(block, []).append(value)

    def take(self) -> dict[int, list[Any]]:
        out, self.recorded = self.recorded, {}
        return out


def test_block_errors_are_each_blocks_snr_and_its_fall(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from qnn_infer.evaluation import blocks

    ref = _ListTap({0: torch.tensor([3.0, 4.0]), 1: torch.tensor([3.0, 4.0]),
                    2: torch.ones(3)})
    # Block 0 off by 0.5 in one value (noise 0.25 against signal 25: 20 dB), block 1 by 5 (0 dB);
    # block 2 recorded in another shape by the model: left out.
    mine = _ListTap({0: torch.tensor([3.0, 4.5]), 1: torch.tensor([3.0, 9.0]),
                     2: torch.ones(2)})
    taps = {"fp32": ref, "q": mine}
    monkeypatch.setattr(blocks, "logits", lambda lm, ids: taps[lm.name].step())
    out = blocks.block_errors(_lm("fp32"), ref, _lm("q"), mine, [[1, 2], [3]])
    assert out["tokens"] == 3 and out["windows"] == 2
    assert out["blocks"] == [{"block": 0, "sqnr_db": 20.0, "fell_db": None},
                             {"block": 1, "sqnr_db": 0.0, "fell_db": 20.0}]
    assert blocks.worst_blocks(out) == [out["blocks"][1]]
    assert not ref.active and not mine.active  # taps record only while a window runs


def test_the_block_chart_is_svg_with_a_point_per_block() -> None:
    import xml.etree.ElementTree as ElementTree

    from qnn_infer.evaluation.report import blocks_svg

    errors = {"model": "fake_quant", "reference": "fp32", "tokens": 10, "windows": 1,
              "blocks": [{"block": i, "sqnr_db": 40.0 - 3 * i, "fell_db": None if i == 0
                          else 3.0} for i in range(5)]}
    root = ElementTree.fromstring(blocks_svg(errors))
    assert root.tag.endswith("svg")
    circles = [e for e in root.iter() if e.tag.endswith("circle")]
    assert len(circles) == 5
    ys = [float(c.attrib["cy"]) for c in circles]
    assert ys == sorted(ys)  # SVG's y grows downward: a falling SQNR goes down the chart
    text = markdown({**_evaluation(0.05, 95.0, (1.05, 1.01, 1.09), [True]), "blocks": errors},
                    "Evaluation of q")
    assert "## Where the error enters" in text and "![SQNR by block](eval-blocks.svg)" in text
    assert "| 4 | 28.00 | +3.00 |" in text
