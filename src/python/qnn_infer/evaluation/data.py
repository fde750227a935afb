"""What the evaluation reads: a held-out corpus, a prompt suite and multiple-choice task items,
shipped (data/, provenance in data/PROVENANCE.md) or the user's own (`--eval-file`)."""

from __future__ import annotations

import importlib.resources
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from qnn_common.errors import ArtifactError

# A user's file is read whole; beyond this it is refused before a byte is parsed.
MAX_EVAL_FILE_BYTES = 64 * 1024 * 1024
_DATA = "evaluation/data"
T = TypeVar("T")


@dataclass(frozen=True)
class Document:
    """One text of the corpus, scored in windows of its own tokens."""

    name: str
    text: str


@dataclass(frozen=True)
class PromptCase:
    """A prompt and, where one is known, the short answers any of which a reply must contain."""

    prompt: str
    answers: tuple[str, ...] = ()


@dataclass(frozen=True)
class TaskItem:
    """A multiple-choice item scored by log-likelihood: `choices` continue `context`."""

    task: str
    context: str
    choices: tuple[str, ...]
    answer: int


@dataclass(frozen=True)
class EvalData:
    """The three parts and where each came from (for the report)."""

    documents: tuple[Document, ...]
    prompts: tuple[PromptCase, ...]
    tasks: tuple[TaskItem, ...]
    sources: dict[str, str]


def spread(rows: Sequence[T], count: int | None) -> list[T]:
    """`count` rows evenly spaced over `rows`, in order (all of them for None): a suite's share
    samples every kind of item the data holds, not the first kind only."""
    if count is None or count >= len(rows):
        return list(rows)
    return [rows[i * len(rows) // count] for i in range(count)]


def _resource(name: str) -> Any:
    return importlib.resources.files("qnn_infer").joinpath(f"{_DATA}/{name}")


def shipped() -> EvalData:
    """The package's own corpus (Moby-Dick ch. 1-5, two State of the Union addresses), 55 prompts
    and 200 task items."""
    corpus = _resource("corpus")
    documents = tuple(
        Document(f.name.removesuffix(".txt"), f.read_text("utf-8"))
        for f in sorted(corpus.iterdir(), key=lambda f: f.name) if f.name.endswith(".txt")
    )
    prompts, _, _ = _rows(_resource("prompts.jsonl").read_text("utf-8"), Path("prompts.jsonl"))
    _, tasks, _ = _rows(_resource("tasks.jsonl").read_text("utf-8"), Path("tasks.jsonl"))
    where = "shipped (qnn_infer/evaluation/data, see PROVENANCE.md)"
    return EvalData(documents, tuple(prompts), tuple(tasks),
                    {"corpus": where, "prompts": where, "tasks": where})


def with_eval_file(base: EvalData, path: Path) -> EvalData:
    """`base` with the parts `path` holds replaced by its own: a text file is the corpus (one
    document); a .jsonl file's rows are prompts ({"prompt", "answers"?}), task items
    ({"context", "choices", "answer", "task"?}) or documents ({"text", "name"?})."""
    text = _read(path)
    if path.suffix.lower() != ".jsonl":
        if not text.strip():
            raise ArtifactError(path, "is empty; an eval file needs text to score")
        return EvalData((Document(path.stem, text),), base.prompts, base.tasks,
                        {**base.sources, "corpus": f"--eval-file {path}"})
    prompts, tasks, documents = _rows(text, path)
    if not (prompts or tasks or documents):
        raise ArtifactError(path, "holds no rows; write one JSON object per line")
    mine = f"--eval-file {path}"
    return EvalData(
        tuple(documents) or base.documents, tuple(prompts) or base.prompts,
        tuple(tasks) or base.tasks,
        {"corpus": mine if documents else base.sources["corpus"],
         "prompts": mine if prompts else base.sources["prompts"],
         "tasks": mine if tasks else base.sources["tasks"]},
    )


def _read(path: Path) -> str:
    if not path.is_file():
        raise ArtifactError(path, "no such file; --eval-file takes a text or .jsonl file")
    size = path.stat().st_size
    if size > MAX_EVAL_FILE_BYTES:
        raise ArtifactError(
            path, f"is {size:,} bytes, more than the {MAX_EVAL_FILE_BYTES:,} an eval file may "
            "hold; score a sample of it",
        )
    try:
        return path.read_text("utf-8")
    except UnicodeDecodeError as err:
        raise ArtifactError(path, f"is not UTF-8 text ({err.reason} at byte {err.start})") from err


def _rows(text: str, path: Path) -> tuple[list[PromptCase], list[TaskItem], list[Document]]:
    prompts: list[PromptCase] = []
    tasks: list[TaskItem] = []
    documents: list[Document] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ArtifactError(path, f"{where} is not JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise ArtifactError(path, f"{where} is not a JSON object")
        if "prompt" in row:
            prompts.append(_prompt(row, path, where))
        elif "context" in row:
            tasks.append(_task(row, path, where))
        elif "text" in row:
            documents.append(Document(str(row.get("name", f"{path.stem}:{number}")),
                                      _string(row, "text", path, where)))
        else:
            raise ArtifactError(
                path, f"{where} has keys {sorted(row)}; a row is a prompt ({{\"prompt\", "
                "\"answers\"}}), a task item ({\"context\", \"choices\", \"answer\"}) or a "
                "document ({\"text\"})",
            )
    return prompts, tasks, documents


def _string(row: dict[str, Any], key: str, path: Path, where: str) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ArtifactError(path, f"{where}: {key!r} must be a non-empty string")
    return value


def _prompt(row: dict[str, Any], path: Path, where: str) -> PromptCase:
    answers = row.get("answers", [])
    if isinstance(answers, str):
        answers = [answers]
    if not isinstance(answers, list) or not all(isinstance(a, str) and a for a in answers):
        raise ArtifactError(path, f"{where}: 'answers' must be a list of non-empty strings")
    return PromptCase(_string(row, "prompt", path, where), tuple(answers))


def _task(row: dict[str, Any], path: Path, where: str) -> TaskItem:
    choices = row.get("choices")
    if (not isinstance(choices, list) or len(choices) < 2
            or not all(isinstance(c, str) and c for c in choices)):
        raise ArtifactError(path, f"{where}: 'choices' must be a list of at least 2 strings")
    answer = row.get("answer")
    if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < len(choices):
        raise ArtifactError(
            path, f"{where}: 'answer' must be the index of the right choice (0 to "
            f"{len(choices) - 1}), got {json.dumps(answer)}",
        )
    return TaskItem(str(row.get("task", "user")), _string(row, "context", path, where),
                    tuple(choices), answer)
