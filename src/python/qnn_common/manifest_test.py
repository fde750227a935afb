"""The artifact contract: sealed directories, verified on load, written atomically."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qnn_common import cache_keys
from qnn_common import manifest as manifest_mod
from qnn_common.cache_keys import cache_key, tool_versions
from qnn_common.config import CompileConfig, PrepareConfig, Stage
from qnn_common.errors import ArtifactError
from qnn_common.manifest import (
    FORMAT,
    MANIFEST_NAME,
    SCHEMA_VERSION,
    FileEntry,
    Manifest,
    ProgramRecord,
    to_jsonable,
)
from qnn_common.recipes import Backend, Recipe
from qnn_common.sealing import load_manifest, manifest_digest, write_manifest
from qnn_common.store.atomic import atomic_path, atomic_save, atomic_write_bytes, atomic_write_text
from qnn_common.store.hashing import sha256_file

FILES = {"program.pt2": b"program bytes" * 10, "eval_inputs.pt": b"\x00\x01\x02inputs"}


def _seal(
    artifact_dir: Path,
    files: dict[str, bytes] | None = None,
    *,
    stage: str = "prepare",
    metrics: dict[str, Any] | None = None,
    config: Any = None,
) -> Manifest:
    files = FILES if files is None else files
    for name, data in files.items():
        (artifact_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (artifact_dir / name).write_bytes(data)
    return write_manifest(
        artifact_dir,
        stage=stage,
        package="qnn-prepare",
        package_version="0.1.0",
        config={"model": "m", "seq_len": 8} if config is None else config,
        inputs={"model": "abc123"},
        files=list(files),
        cache_key="k" * 64,
        timings={"total_s": 1.25},
        metrics=metrics,
        extra_tools={"qnn_sdk": "2.40"},
    )


def _load_error(artifact_dir: Path, **kwargs: Any) -> ArtifactError:
    with pytest.raises(ArtifactError) as info:
        load_manifest(artifact_dir, **kwargs)
    return info.value


def _write_resealed(artifact_dir: Path, raw: dict[str, Any]) -> None:
    """Write `raw` as the manifest with its own digest recomputed, as a careful forger would: the
    checks behind the self-digest must still refuse it."""
    raw = {k: v for k, v in raw.items() if k != "digest"}
    raw["digest"] = manifest_mod._content_digest(raw)
    (artifact_dir / MANIFEST_NAME).write_text(json.dumps(raw), encoding="utf-8")


def _rewrite_manifest(artifact_dir: Path, **changes: Any) -> None:
    path = artifact_dir / MANIFEST_NAME
    raw = json.loads(path.read_text(encoding="utf-8"))
    raw.update(changes)
    path.write_text(json.dumps(raw), encoding="utf-8")


# --- round trip -------------------------------------------------------------------------------


def test_write_then_load_round_trips(tmp_path: Path) -> None:
    written = _seal(
        tmp_path,
        metrics={"accuracy": {"cosine": 0.999}, "nan": float("nan"), "sqnr": float("inf")},
    )
    loaded = load_manifest(tmp_path, expect_stage="prepare")
    assert loaded == written
    assert loaded.stage == "prepare"
    assert loaded.package == "qnn-prepare"
    assert loaded.format == FORMAT
    assert loaded.schema_version == SCHEMA_VERSION
    assert loaded.inputs == {"model": "abc123"}
    assert loaded.timings == {"total_s": 1.25}
    # Strict JSON has no nan / inf: they are stored as strings float() reads back.
    assert loaded.metrics == {"accuracy": {"cosine": 0.999}, "nan": "nan", "sqnr": "inf"}
    assert loaded.tools["qnn_sdk"] == "2.40"
    assert [f.path for f in loaded.files] == sorted(FILES)
    for name, data in FILES.items():
        entry = loaded.file(name)
        assert entry == FileEntry(name, hashlib.sha256(data).hexdigest(), len(data))
    assert loaded.file("nope") is None
    assert loaded.created_unix > 0


def test_manifest_is_stable_sorted_json(tmp_path: Path) -> None:
    written = _seal(tmp_path)
    text = (tmp_path / MANIFEST_NAME).read_text(encoding="utf-8")
    assert text == written.to_json()
    assert text.endswith("\n")
    raw = json.loads(text)
    assert list(raw) == sorted(raw)
    assert raw["format"] == FORMAT


def test_config_dataclass_is_stored_as_plain_json(tmp_path: Path) -> None:
    config = CompileConfig(backend=Backend.QNN, recipe=Recipe.A16W16, soc="SM8650", num_shards=2)
    _seal(tmp_path, config=config)
    loaded = load_manifest(tmp_path)
    assert loaded.config == to_jsonable(config)
    assert loaded.config["recipe"] == "16a16w" and loaded.config["soc"] == "SM8650"
    assert loaded.config["num_shards"] == 2


def test_files_in_subdirectories(tmp_path: Path) -> None:
    _seal(tmp_path, {"tokenizer/vocab.txt": b"a\nb\n", "model.pte": b"pte"})
    loaded = load_manifest(tmp_path)
    assert [f.path for f in loaded.files] == ["model.pte", "tokenizer/vocab.txt"]


def test_duplicate_file_names_are_listed_once(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x")
    m = write_manifest(
        tmp_path,
        stage="s",
        package="p",
        package_version="1",
        config={},
        inputs={},
        files=["a", "a"],
        cache_key="k",
    )
    assert [f.path for f in m.files] == ["a"]


def test_empty_artifact_round_trips(tmp_path: Path) -> None:
    written = _seal(tmp_path, {})
    assert load_manifest(tmp_path) == written
    assert written.files == ()


_NAME = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="/\x00"),
    min_size=1,
    max_size=20,
).filter(lambda n: n not in (".", "..", MANIFEST_NAME))

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False)
    | st.text(max_size=10),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)


@settings(max_examples=40, derandomize=True, deadline=None, database=None)
@given(
    files=st.dictionaries(_NAME, st.binary(max_size=64), max_size=4),
    metrics=st.dictionaries(st.text(max_size=8), _JSON, max_size=4),
)
def test_round_trip_property(files: dict[str, bytes], metrics: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as d:
        artifact_dir = Path(d)
        written = _seal(artifact_dir, files, metrics=metrics)
        loaded = load_manifest(artifact_dir)
        assert loaded == written
        assert loaded.metrics == metrics
        assert {f.path for f in loaded.files} == set(files)
        for name, data in files.items():
            entry = loaded.file(name)
            assert entry is not None
            assert entry.size == len(data)
            assert entry.sha256 == hashlib.sha256(data).hexdigest()
        assert sorted(os.listdir(artifact_dir)) == sorted({*files, MANIFEST_NAME})


# --- refusals ---------------------------------------------------------------------------------


def test_tampered_content_same_size(tmp_path: Path) -> None:
    _seal(tmp_path)
    target = tmp_path / "program.pt2"
    data = bytearray(target.read_bytes())
    data[3] ^= 0xFF
    target.write_bytes(bytes(data))
    err = _load_error(tmp_path)
    assert err.path == target
    assert str(target) in str(err)
    assert "sha256" in str(err) and "modified" in str(err)
    assert "rerun the stage" in str(err)


def test_truncated_file(tmp_path: Path) -> None:
    _seal(tmp_path)
    target = tmp_path / "eval_inputs.pt"
    target.write_bytes(FILES["eval_inputs.pt"][:-2])
    err = _load_error(tmp_path)
    assert err.path == target
    assert str(target) in str(err)
    assert "truncated" in str(err)
    assert f"manifest says {len(FILES['eval_inputs.pt'])}" in str(err)


def test_missing_listed_file(tmp_path: Path) -> None:
    _seal(tmp_path)
    (tmp_path / "program.pt2").unlink()
    err = _load_error(tmp_path)
    assert err.path == tmp_path / "program.pt2"
    assert "missing" in str(err)


def test_verify_false_skips_file_checks(tmp_path: Path) -> None:
    _seal(tmp_path)
    (tmp_path / "program.pt2").unlink()
    assert load_manifest(tmp_path, verify=False).stage == "prepare"


def test_missing_manifest_is_an_interrupted_run(tmp_path: Path) -> None:
    (tmp_path / "program.pt2").write_bytes(b"half written")
    err = _load_error(tmp_path)
    assert err.path == tmp_path
    assert str(tmp_path) in str(err)
    assert f"no {MANIFEST_NAME}" in str(err)
    assert "interrupted" in str(err)


def test_missing_directory(tmp_path: Path) -> None:
    err = _load_error(tmp_path / "absent")
    assert err.path == tmp_path / "absent"
    assert "no such artifact directory" in str(err)


def test_a_file_is_not_an_artifact_directory(tmp_path: Path) -> None:
    (tmp_path / "model.pte").write_bytes(b"x")
    err = _load_error(tmp_path / "model.pte")
    assert "no such artifact directory" in str(err)


@pytest.mark.parametrize(
    "text", ['{"name": "some-package", "version": "1"}', "[1, 2, 3]", '"just a string"', "null"]
)
def test_foreign_json(tmp_path: Path, text: str) -> None:
    (tmp_path / MANIFEST_NAME).write_text(text, encoding="utf-8")
    err = _load_error(tmp_path)
    assert err.path == tmp_path / MANIFEST_NAME
    assert str(tmp_path / MANIFEST_NAME) in str(err)
    assert f"not a {FORMAT} manifest" in str(err)


@pytest.mark.parametrize("data", [b"{not json", b"\xff\xfe\x00garbage", b""])
def test_manifest_that_is_not_json(tmp_path: Path, data: bytes) -> None:
    (tmp_path / MANIFEST_NAME).write_bytes(data)
    err = _load_error(tmp_path)
    assert err.path == tmp_path / MANIFEST_NAME
    assert "not valid JSON" in str(err)


@pytest.mark.parametrize("version", [1, SCHEMA_VERSION + 1, 0, "1", None])
def test_wrong_schema_version(tmp_path: Path, version: object) -> None:
    _seal(tmp_path)
    _rewrite_manifest(tmp_path, schema_version=version)
    err = _load_error(tmp_path)
    assert err.path == tmp_path / MANIFEST_NAME
    assert f"schema version {version!r}" in str(err)
    assert f"this tool reads {SCHEMA_VERSION}" in str(err)


@pytest.mark.parametrize(
    "changes",
    [{"files": "nope"}, {"files": [{"path": "a"}]}, {"unexpected": 1}, {"stage": None}],
)
def test_malformed_manifest(tmp_path: Path, changes: dict[str, Any]) -> None:
    _seal(tmp_path)
    raw = json.loads((tmp_path / MANIFEST_NAME).read_text(encoding="utf-8"))
    raw.update(changes)
    if changes == {"stage": None}:
        del raw["stage"]
    _write_resealed(tmp_path, raw)
    err = _load_error(tmp_path)
    assert err.path == tmp_path / MANIFEST_NAME
    assert "malformed" in str(err)


def test_manifest_without_files_key_is_malformed(tmp_path: Path) -> None:
    _seal(tmp_path)
    raw = json.loads((tmp_path / MANIFEST_NAME).read_text(encoding="utf-8"))
    del raw["files"]
    _write_resealed(tmp_path, raw)
    assert "malformed" in str(_load_error(tmp_path))


def test_wrong_stage(tmp_path: Path) -> None:
    _seal(tmp_path, stage="prepare")
    err = _load_error(tmp_path, expect_stage="compile")
    assert err.path == tmp_path
    assert str(tmp_path) in str(err)
    assert "is a prepare artifact; expected compile" in str(err)


def test_expect_one_of_several_stages(tmp_path: Path) -> None:
    _seal(tmp_path, stage="quantize")
    assert load_manifest(tmp_path, expect_stage=("prepare", "quantize")).stage == "quantize"
    err = _load_error(tmp_path, expect_stage=["compile", "infer"])
    assert "expected compile or infer" in str(err)


@pytest.mark.parametrize("entry_path", ["../x", "sub/../../x", "/etc/passwd"])
def test_path_traversal_entries_are_refused(tmp_path: Path, entry_path: str) -> None:
    artifact_dir = tmp_path / "artifact"
    artifact_dir.mkdir()
    _seal(artifact_dir)
    outside = tmp_path / "x"
    outside.write_bytes(b"outside")
    target = Path(entry_path) if entry_path.startswith("/") else outside
    data = target.read_bytes()
    raw = json.loads((artifact_dir / MANIFEST_NAME).read_text(encoding="utf-8"))
    raw["files"].append(
        {"path": entry_path, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    )
    _write_resealed(artifact_dir, raw)
    err = _load_error(artifact_dir)
    assert entry_path in str(err)
    assert "outside the artifact directory" in str(err)


def test_write_refuses_a_file_that_was_not_written(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError) as info:
        write_manifest(
            tmp_path,
            stage="s",
            package="p",
            package_version="1",
            config={},
            inputs={},
            files=["ghost.pt"],
            cache_key="k",
        )
    assert info.value.path == tmp_path / "ghost.pt"
    assert "not written" in str(info.value)
    assert not (tmp_path / MANIFEST_NAME).exists()


@pytest.mark.parametrize("rel", ["../x", "/abs/x", MANIFEST_NAME])
def test_write_refuses_paths_it_could_not_verify(tmp_path: Path, rel: str) -> None:
    artifact_dir = tmp_path / "artifact"
    artifact_dir.mkdir()
    (tmp_path / "x").write_bytes(b"outside")
    (artifact_dir / MANIFEST_NAME).write_text("{}", encoding="utf-8")
    with pytest.raises(ArtifactError) as info:
        write_manifest(
            artifact_dir,
            stage="s",
            package="p",
            package_version="1",
            config={},
            inputs={},
            files=[rel],
            cache_key="k",
        )
    assert rel in str(info.value)
    assert "inside the artifact directory" in str(info.value) or "seal itself" in str(info.value)
    assert (artifact_dir / MANIFEST_NAME).read_text(encoding="utf-8") == "{}"


def test_manifest_digest_is_of_identity_not_timings(tmp_path: Path) -> None:
    _seal(tmp_path)
    digest = manifest_digest(tmp_path)
    assert len(digest) == 64
    # Sealed again later (another created_unix), with other timings and metrics: same artifact.
    write_manifest(
        tmp_path,
        stage="prepare",
        package="qnn-prepare",
        package_version="0.1.0",
        config={"model": "m", "seq_len": 8},
        inputs={"model": "abc123"},
        files=list(FILES),
        cache_key="k" * 64,
        timings={"total_s": 9.0},
        metrics={"latency": 3},
        extra_tools={"qnn_sdk": "2.40"},
    )
    assert manifest_digest(tmp_path) == digest
    (tmp_path / "other").write_bytes(b"x")
    _seal(tmp_path, {**FILES, "other": b"x"})
    assert manifest_digest(tmp_path) != digest


def _seal_program(artifact_dir: Path, program: ProgramRecord | None) -> Manifest:
    return write_manifest(
        artifact_dir, stage="prepare", package="qnn-prepare", package_version="0.1.0",
        config={"model": "m"}, inputs={}, files=list(FILES), cache_key="k" * 64,
        program=program,
    )


def test_the_program_record_round_trips_and_is_part_of_the_identity(tmp_path: Path) -> None:
    for name, data in FILES.items():
        (tmp_path / name).write_bytes(data)
    llm = {"max_seq_len": 64, "prefill_len": 8, "vocab_size": 256}
    written = _seal_program(tmp_path, ProgramRecord("causal-lm", ("prefill", "decode"), llm))
    loaded = load_manifest(tmp_path)
    assert loaded == written and loaded.program is not None
    assert loaded.program.methods == ("prefill", "decode") and loaded.program.llm == llm
    digest = manifest_digest(tmp_path)
    _seal_program(tmp_path, ProgramRecord("causal-lm", ("prefill",), llm))
    assert manifest_digest(tmp_path) != digest  # what the program is, not a metric
    _seal_program(tmp_path, None)
    assert load_manifest(tmp_path).program is None


@pytest.mark.parametrize(
    "record", [{"kind": "vision"}, {"kind": "vision", "methods": []}, ["forward"],
               {"kind": "vision", "methods": ["forward", "forward"]},
               {"kind": "vision", "methods": ["forward"], "llm": [1]}],
)
def test_a_malformed_program_record_is_refused(tmp_path: Path, record: object) -> None:
    _seal(tmp_path)
    raw = json.loads((tmp_path / MANIFEST_NAME).read_text(encoding="utf-8"))
    _write_resealed(tmp_path, {**raw, "program": record})
    assert "manifest is malformed" in str(_load_error(tmp_path))


def test_sha256_file(tmp_path: Path) -> None:
    p = tmp_path / "f"
    data = os.urandom(3 * (1 << 20) // 2)  # spans more than one read chunk
    p.write_bytes(data)
    assert sha256_file(p) == hashlib.sha256(data).hexdigest()


# --- atomic writes ----------------------------------------------------------------------------


def test_atomic_path_success_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "out.bin"
    with atomic_path(target) as tmp:
        assert tmp.parent == target.parent
        assert tmp != target
        assert not target.exists()
        tmp.write_bytes(b"new")
    assert target.read_bytes() == b"new"
    assert os.listdir(target.parent) == ["out.bin"]


def test_atomic_path_failure_keeps_old_content(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="writer died"), atomic_path(target) as tmp:
        tmp.write_bytes(b"partial")
        raise RuntimeError("writer died")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["out.bin"]


def test_atomic_path_failure_creates_nothing(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    with pytest.raises(KeyboardInterrupt), atomic_path(target) as tmp:
        tmp.write_bytes(b"partial")
        raise KeyboardInterrupt
    assert os.listdir(tmp_path) == []


def test_atomic_save_failure_keeps_old_content(tmp_path: Path) -> None:
    target = tmp_path / "program.pt2"
    target.write_bytes(b"old program")

    def writer(p: Path) -> None:
        p.write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_save(target, writer)
    assert target.read_bytes() == b"old program"
    assert os.listdir(tmp_path) == ["program.pt2"]


def test_atomic_save_and_write_helpers(tmp_path: Path) -> None:
    def writer(p: Path) -> None:
        p.write_bytes(b"A")

    atomic_save(tmp_path / "a", writer)
    atomic_write_bytes(tmp_path / "b", b"B")
    atomic_write_text(tmp_path / "c", "Ç\n")
    atomic_write_bytes(tmp_path / "b", b"B2")
    assert (tmp_path / "a").read_bytes() == b"A"
    assert (tmp_path / "b").read_bytes() == b"B2"
    assert (tmp_path / "c").read_bytes() == "Ç\n".encode()
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "c"]


def test_failed_manifest_write_keeps_old_seal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _seal(tmp_path)
    before = (tmp_path / MANIFEST_NAME).read_bytes()

    def broken_to_json(self: Manifest) -> str:
        raise RuntimeError("serializer died")

    monkeypatch.setattr(Manifest, "to_json", broken_to_json)
    with pytest.raises(RuntimeError):
        _seal(tmp_path, {**FILES, "new": b"n"})
    assert (tmp_path / MANIFEST_NAME).read_bytes() == before
    assert not [n for n in os.listdir(tmp_path) if ".tmp" in n]


# --- cache keys and tool versions -------------------------------------------------------------

_CONFIG = {"model": "m", "recipe": Recipe.A8W8, "nested": {"a": 1, "b": [1, 2]}}
_INPUTS = {"prepare": "d1", "calibration": "d2"}


def test_cache_key_is_deterministic() -> None:
    a = cache_key("quantize", _CONFIG, _INPUTS, "0.1.0")
    assert a == cache_key("quantize", dict(_CONFIG), dict(_INPUTS), "0.1.0")
    assert len(a) == 64
    int(a, 16)


def test_cache_key_changes_with_each_input() -> None:
    base = cache_key("quantize", _CONFIG, _INPUTS, "0.1.0")
    variants = [
        cache_key("compile", _CONFIG, _INPUTS, "0.1.0"),
        cache_key("quantize", {**_CONFIG, "model": "other"}, _INPUTS, "0.1.0"),
        cache_key("quantize", {**_CONFIG, "nested": {"a": 2, "b": [1, 2]}}, _INPUTS, "0.1.0"),
        cache_key("quantize", {**_CONFIG, "recipe": Recipe.A16W16}, _INPUTS, "0.1.0"),
        cache_key("quantize", _CONFIG, {**_INPUTS, "prepare": "d9"}, "0.1.0"),
        cache_key("quantize", _CONFIG, {"prepare": "d1"}, "0.1.0"),
        cache_key("quantize", _CONFIG, _INPUTS, "0.1.1"),
    ]
    assert len({base, *variants}) == len(variants) + 1


def test_streaming_tokens_is_not_part_of_the_infer_key_and_the_prompt_is() -> None:
    from qnn_common.config import InferConfig
    from qnn_common.llm_spec import GenerationConfig

    def key(**generation: Any) -> str:
        config = InferConfig(generation=GenerationConfig(**generation))
        return cache_key("infer", config, _INPUTS, "0.1.0")

    assert key(stream=True) == key(stream=False)
    assert key(prompt="Hello") != key(prompt="Once upon a time")


def test_cache_key_changes_with_tool_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    base = cache_key("compile", _CONFIG, _INPUTS, "0.1.0")
    real = tool_versions()
    monkeypatch.setattr(cache_keys, "tool_versions", lambda: {**real, "torch": "99.0"})
    assert cache_key("compile", _CONFIG, _INPUTS, "0.1.0") != base


def test_cache_key_is_insensitive_to_dict_order() -> None:
    config_a = {"model": "m", "nested": {"x": 1, "y": 2}, "seq_len": 8}
    config_b = {"seq_len": 8, "nested": {"y": 2, "x": 1}, "model": "m"}
    inputs_a = {"a": "1", "b": "2"}
    inputs_b = {"b": "2", "a": "1"}
    assert cache_key("s", config_a, inputs_a, "1") == cache_key("s", config_b, inputs_b, "1")


def test_cache_key_of_equal_configs_is_equal() -> None:
    def make() -> PrepareConfig:
        return PrepareConfig(model="m", seq_len=4)

    assert make() is not make()
    assert cache_key("prepare", make(), {}, "1") == cache_key("prepare", make(), {}, "1")


@settings(max_examples=25, derandomize=True, deadline=None, database=None)
@given(
    items=st.dictionaries(st.text(max_size=6), st.integers() | st.text(max_size=6), max_size=6),
    data=st.data(),
)
def test_cache_key_dict_order_property(items: dict[str, Any], data: st.DataObject) -> None:
    order = data.draw(st.permutations(list(items)))
    shuffled = {k: items[k] for k in order}
    inputs = {k: str(v) for k, v in items.items()}
    shuffled_inputs = {k: inputs[k] for k in order}
    assert cache_key("s", items, inputs, "1") == cache_key("s", shuffled, shuffled_inputs, "1")


def test_tool_versions_keys() -> None:
    versions = tool_versions()
    for key in ("python", "torch", "executorch", "torchao", "transformers"):
        assert key in versions
        assert isinstance(versions[key], str) and versions[key]
    assert versions["python"] == platform.python_version()


def test_tool_versions_extra_and_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert tool_versions({"qnn_sdk": "2.40"})["qnn_sdk"] == "2.40"
    monkeypatch.setattr(
        cache_keys, "TRACKED_DISTRIBUTIONS", ("surely-not-an-installed-dist-xyz",)
    )
    assert tool_versions()["surely-not-an-installed-dist-xyz"] == "not installed"


# --- to_jsonable ------------------------------------------------------------------------------


def test_to_jsonable() -> None:
    value = {
        1: Path("a/b"),
        "recipe": Recipe.A16W16,
        "set": frozenset({Stage.INFER, Stage.QUANTIZE}),
        "tuple": (1, 2.5, None),
        "nan": float("nan"),
        "ctx": FileEntry("p", "s", 1),
    }
    assert to_jsonable(value) == {
        "1": "a/b",
        "recipe": "16a16w",
        "set": ["infer", "quantize"],
        "tuple": [1, 2.5, None],
        "nan": "nan",
        "ctx": {"path": "p", "sha256": "s", "size": 1},
    }
    json.dumps(to_jsonable(value), allow_nan=False)


def test_code_version_follows_the_source_not_just_the_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib
    import sys

    from qnn_common.cache_keys import code_version

    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('__version__ = "1.2.3"\n')
    (pkg / "stage.py").write_text("X = 1\n")
    (pkg / "stage_test.py").write_text("Y = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("fakepkg")
    try:
        first = code_version(module)
        assert first.startswith("1.2.3+")
        (pkg / "stage_test.py").write_text("Y = 2\n")  # tests are not the stage's code
        code_version.cache_clear()
        assert code_version(module) == first
        (pkg / "stage.py").write_text("X = 2\n")
        code_version.cache_clear()
        assert code_version(module) != first
    finally:
        code_version.cache_clear()
        sys.modules.pop("fakepkg", None)
