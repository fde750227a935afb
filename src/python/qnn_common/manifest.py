"""The artifact manifest's schema: what `manifest.json` records and how its digests are made.

An artifact is one directory per stage output, sealed by `manifest.json` (`qnn_common.sealing`
writes, loads and verifies it; `qnn_common.cache_keys` computes the key it records). The
manifest vouches for:

* every listed file's sha256 and size, and nothing else (a directory holding an unlisted file is
  refused);
* its own content: `digest` is the sha256 of the manifest's canonical JSON without that field,
  so an edited config or metric is refused rather than shown;
* its cache key: `key_basis` records the versions the key was computed from, so that a later run
  can recompute the key from the recorded config and inputs.

This module is the schema alone (the standard library, the contracts' errors and the store's
directory constants), so a tool that only reads manifests needs nothing else.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

from qnn_common.errors import ArtifactError
from qnn_common.store.artifact_dir import FORMAT as FORMAT
from qnn_common.store.artifact_dir import MANIFEST_NAME as MANIFEST_NAME

# 2: the manifest's own digest, key_basis, and no unlisted files in an artifact directory.
# 3: the typed `program` section (kind, methods, LLM shapes), part of the identity.
SCHEMA_VERSION = 3

# What an artifact *is*, as opposed to when and how fast it was made (timings, created_unix) or
# what was measured on it (metrics): the downstream stages' input digest covers only these, so
# the same inputs give the same cache keys and directory names on every machine and rerun.
_IDENTITY_FIELDS = tuple(
    "format schema_version stage package package_version config inputs files cache_key key_basis "
    "tools program".split()
)


@dataclass(frozen=True)
class FileEntry:
    """One output file: its path relative to the artifact directory, sha256 and size in bytes."""

    path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class ProgramRecord:
    """The program an artifact holds or was made from: what the stages downstream drive.

    `kind` is the model's kind as prepare loaded it ("vision", "text-encoder", "causal-lm",
    "custom"); `methods` its entry points in order, each exported as ``methods/<name>.pt2`` in a
    prepare or quantize artifact and a method of the compiled .pte; `llm` a generating causal
    LM's shapes, tokens and cache layout (`qnn_common.llm_spec.LlmSpec.to_json`), None for any
    other program.
    """

    kind: str
    methods: tuple[str, ...]
    llm: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.methods or not all(isinstance(m, str) and m for m in self.methods):
            raise TypeError(f"a program needs named methods, got {self.methods!r}")
        if len(set(self.methods)) != len(self.methods):
            raise TypeError(f"method names must be unique, got {self.methods!r}")
        if self.llm is not None and not isinstance(self.llm, Mapping):
            raise TypeError(f"the llm record must be a mapping, got {type(self.llm).__name__}")


@dataclass(frozen=True)
class Manifest:
    """What an artifact is, how it was made, and what it contains."""

    stage: str
    package: str
    package_version: str
    config: Mapping[str, Any]
    inputs: Mapping[str, str]  # input name -> digest (an upstream manifest's, or a file's sha256)
    files: tuple[FileEntry, ...]
    tools: Mapping[str, str]
    cache_key: str
    timings: Mapping[str, float] = field(default_factory=dict)
    metrics: Mapping[str, Any] = field(default_factory=dict)
    # What program the artifact holds (prepare, quantize) or runs (compile, infer); None for an
    # artifact made from a bare file that records none.
    program: ProgramRecord | None = None
    created_unix: float = 0.0
    # The cache key's ingredients other than config and inputs (see cache_key).
    key_basis: Mapping[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    format: str = FORMAT
    digest: str = ""  # sha256 of the canonical JSON of every other field

    def file(self, name: str) -> FileEntry | None:
        """The entry for `name`, or None if the artifact has no such file."""
        return next((f for f in self.files if f.path == name), None)

    def to_json(self) -> str:
        """The manifest as stored: indented JSON with sorted keys."""
        return json.dumps(self._plain(), indent=2, sort_keys=True) + "\n"

    def _plain(self) -> dict[str, Any]:
        data = asdict(self)
        data["files"] = [asdict(f) for f in self.files]
        return dict(to_jsonable(data))

    def sealed(self) -> Manifest:
        """This manifest with `digest` set to the digest of its content."""
        return replace(self, digest=_content_digest(self._plain()))

    def identity_digest(self) -> str:
        """The digest of what the artifact is (`_IDENTITY_FIELDS`): not timings or metrics."""
        plain = self._plain()
        return _canonical_sha256({k: plain[k] for k in _IDENTITY_FIELDS})


def _canonical_sha256(data: Any) -> str:
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _content_digest(plain: Mapping[str, Any]) -> str:
    return _canonical_sha256({k: v for k, v in plain.items() if k != "digest"})


# Bounds no manifest a stage writes comes near (a size or a count fits in 20 digits; configs and
# metrics nest a handful of levels), set well below what breaks Python: an integer of more than
# 4,300 digits makes `json.loads` itself raise ValueError, and a deep nest a RecursionError in
# whatever walks the value next.
MAX_INT_DIGITS = 64
MAX_NESTING = 64


def read_manifest_json(text: str, path: Path) -> Any:
    """The JSON value of `text` (the manifest read from `path`), parsed strictly.

    Refused with ArtifactError naming `path`: what is not JSON, and what no stage writes: an
    integer past MAX_INT_DIGITS digits, a non-finite number (`NaN`, `Infinity`, `1e999`; a stage
    writes those as strings, `to_jsonable`), a key twice in one object (JSON keeps the last, so
    the file would not say what it seems to), nesting past MAX_NESTING.
    """

    def unreadable(what: str) -> ArtifactError:
        return ArtifactError(
            path, f"manifest holds {what}, which no stage writes; not read; rerun the stage "
            "that made it"
        )

    def integer(digits: str) -> int:
        if len(digits.lstrip("-")) > MAX_INT_DIGITS:
            raise unreadable(f"an integer of {len(digits.lstrip('-'))} digits")
        return int(digits)

    def real(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise unreadable(f"the number {text[:40]} (not finite as a float)")
        return value

    def constant(name: str) -> float:
        raise unreadable(name)

    def members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) != len(pairs):
            twice = next(k for i, (k, _) in enumerate(pairs) if k in dict(pairs[:i]))
            raise unreadable(f"the key {twice[:40]!r} twice in one object")
        return obj

    try:
        raw = json.loads(text, parse_int=integer, parse_float=real, parse_constant=constant,
                         object_pairs_hook=members)
    except json.JSONDecodeError as err:
        raise ArtifactError(path, f"manifest is not valid JSON ({err}); rerun the stage") from None
    except RecursionError:  # nested past the parser's own stack
        raise unreadable(f"values nested more than {MAX_NESTING} deep") from None
    except ValueError as err:  # any other limit of Python's: still this file's fault
        raise unreadable(f"a value Python cannot read ({err})") from None
    if _nesting(raw) > MAX_NESTING:
        raise unreadable(f"values nested more than {MAX_NESTING} deep")
    return raw


def _nesting(value: Any) -> int:
    """How deep objects and arrays nest in `value` (without recursion: it may be deep)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        )
        if children is not None:
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in children)
    return deepest


def parse_manifest(raw: Any, path: Path) -> Manifest:
    """`raw` (the JSON read from `path`) as a Manifest; ArtifactError naming `path` and why not.

    Refuses a manifest that is not ours or of another schema, whose content does not match its
    own digest (edited after sealing), or that is malformed.
    """
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ArtifactError(path, f"not a {FORMAT} manifest (foreign file?)")
    if raw.get("schema_version") != SCHEMA_VERSION:
        raise ArtifactError(
            path,
            f"schema version {raw.get('schema_version')!r}, this tool reads {SCHEMA_VERSION}; "
            "rerun the stage with this version",
        )
    try:
        digest = _content_digest(raw)
    except RecursionError:  # a value nested deep inside an object that passed the checks above
        raise ArtifactError(
            path, "manifest is nested too deeply to be one of ours; rerun the stage"
        ) from None
    if raw.get("digest") != digest:
        raise ArtifactError(
            path,
            "content does not match the manifest's own digest: it was edited after the stage "
            "sealed it, so nothing it records can be trusted; rerun the stage that made it",
        )
    raw = dict(raw)
    try:
        files = tuple(FileEntry(**f) for f in raw.pop("files"))
        record = raw.pop("program", None)
        program = (
            None if record is None
            else ProgramRecord(
                kind=record["kind"], methods=tuple(record["methods"]), llm=record.get("llm")
            )
        )
        manifest = Manifest(files=files, program=program, **raw)
        if not all(isinstance(f.path, str) and isinstance(f.size, int) for f in files):
            raise TypeError("file entries need a string path and an integer size")
    except (TypeError, KeyError) as err:
        raise ArtifactError(path, f"manifest is malformed ({err})") from None
    return manifest


def to_jsonable(value: Any) -> Any:
    """Convert configs (dataclasses, enums, paths, sets) to plain JSON values, deterministically."""
    if is_dataclass(value) and not isinstance(value, type):
        return {k: to_jsonable(v) for k, v in asdict(value).items()}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, set | frozenset):
        return sorted(to_jsonable(v) for v in value)
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        # Strict JSON has no inf / nan; float("inf") reads these strings back.
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value
