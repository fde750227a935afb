from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from qnn_common.config import PrepareConfig
from qnn_common.errors import ArtifactError, ConfigValidationError
from qnn_common.llm_spec import MASK_VALUE
from qnn_common.stages import PROGRAM, PrepareInput, method_program
from qnn_prepare.causal_lm.task import LogitsLm
from qnn_prepare.causal_lm.tiny_decoders import save_tiny_llama
from qnn_prepare.models import (
    BUILTIN_MODELS,
    TASKS,
    builtin_weights,
    list_models,
    load_model,
    task_for,
)
from qnn_prepare.task import LoadedModel, export_program


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def minilm() -> LoadedModel:
    return load_model("minilm", seq_len=32)


def _call_targets(ep: torch.export.ExportedProgram) -> set[str]:
    return {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}


def test_list_models_names_every_builtin() -> None:
    names = [name for name, _ in list_models()]
    assert names == sorted(BUILTIN_MODELS)
    assert {"minilm", "tiny-cnn"} <= set(names)


def test_tiny_cnn_is_seeded_and_exports() -> None:
    a = load_model("tiny-cnn", seed=7)
    b = load_model("tiny-cnn", seed=7)
    c = load_model("tiny-cnn", seed=8)
    assert a.kind == "vision"
    assert a.example_inputs[0].shape == (1, 3, 32, 32)
    assert torch.equal(a.example_inputs[0], b.example_inputs[0])
    assert all(
        torch.equal(p, q) for p, q in zip(a.module.parameters(), b.module.parameters(), strict=True)
    )
    assert not torch.equal(a.example_inputs[0], c.example_inputs[0])
    assert not a.module.training
    ep = export_program(a)
    out = ep.module()(*a.example_inputs)
    assert out.shape == (1, 10)
    torch.testing.assert_close(out, a.module(*a.example_inputs))


def test_minilm_matches_sentence_transformers(minilm: LoadedModel) -> None:
    sentence_transformers = pytest.importorskip("sentence_transformers")
    from qnn_prepare.encoder import minilm_dir

    assert minilm.kind == "text-encoder"
    assert minilm.input_names == ("input_ids", "attention_mask")
    assert minilm.output_names == ("embedding",)
    assert minilm.vocab_size == 30522
    ids, mask = minilm.example_inputs
    assert ids.shape == mask.shape == (1, 32) and ids.dtype == mask.dtype == torch.int64
    assert 0 < int(mask.sum()) < 32  # a real sentence, padded to max_length
    assert {p.name for p in minilm.tokenizer_files} >= {"tokenizer.json", "vocab.txt"}
    assert all(p.is_file() for p in minilm.tokenizer_files)

    sentences = ["How do I reset my password?", "The cat sat on the mat, purring quietly."]
    st_model = sentence_transformers.SentenceTransformer(str(minilm_dir()), device="cpu")
    expected = torch.from_numpy(st_model.encode(sentences))
    with torch.no_grad():
        got = torch.cat(
            [
                minilm.module(*_encode(minilm, s))
                for s in sentences  # fixed-length padded inputs, as the exported program sees
            ]
        )
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    assert torch.allclose(got.norm(dim=1), torch.ones(2))


def _encode(model: LoadedModel, text: str) -> tuple[torch.Tensor, ...]:
    assert model.tokenizer is not None
    enc = model.tokenizer(text, padding="max_length", max_length=32, return_tensors="pt")
    return (enc["input_ids"], enc["attention_mask"])


def test_minilm_exports_without_mask_helpers(minilm: LoadedModel) -> None:
    ep = export_program(minilm)
    targets = _call_targets(ep)
    # transformers' own mask builder traces to arange/index/__and__; the wrapper's mask must not.
    assert not any(t.startswith(("aten.arange", "aten.index.", "aten.__and__")) for t in targets)
    with torch.no_grad():
        torch.testing.assert_close(
            ep.module()(*minilm.example_inputs), minilm.module(*minilm.example_inputs)
        )


def test_tiny_llama_dir_loads_as_causal_lm(tiny_llama_dir: Path) -> None:
    model = load_model(str(tiny_llama_dir), seq_len=16)
    assert model.kind == "causal-lm"
    assert model.input_names == ("input_ids",)
    assert model.output_names == ("logits",)
    assert model.vocab_size == 256
    assert model.tokenizer is None  # none saved: example ids are seeded random
    (ids,) = model.example_inputs
    assert ids.shape == (1, 16) and ids.dtype == torch.int64 and int(ids.max()) < 256
    assert torch.equal(ids, load_model(str(tiny_llama_dir), seq_len=16).example_inputs[0])
    ep = export_program(model)
    targets = _call_targets(ep)
    assert not any(t.startswith(("aten.arange", "aten.index.", "aten.cumsum")) for t in targets)
    with torch.no_grad():
        logits = ep.module()(ids)
        assert logits.shape == (1, 16, 256)
        # The constant causal mask is the model's causal attention: compare with HF's own.
        assert isinstance(model.module, LogitsLm)
        reference = model.module.hf(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(logits, reference, atol=1e-4, rtol=1e-4)


def test_causal_mask_keeps_right_padding_out(tiny_llama_dir: Path) -> None:
    model = load_model(str(tiny_llama_dir), seq_len=16)
    (ids,) = model.example_inputs
    padded = ids.clone()
    padded[:, 10:] = 0
    with torch.no_grad():
        full = model.module(ids)
        pad = model.module(padded)
    torch.testing.assert_close(full[:, :10], pad[:, :10])
    assert MASK_VALUE < -100


def test_missing_model_dir_is_an_artifact_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ArtifactError, match="does not exist") as err:
        load_model(str(missing))
    assert err.value.path == missing


def test_dir_without_config_is_an_artifact_error(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ArtifactError, match=r"config\.json"):
        load_model(str(tmp_path))


def test_unknown_spec_lists_the_options() -> None:
    with pytest.raises(ConfigValidationError) as err:
        load_model("resnet-9000")
    assert err.value.field == "model"
    assert err.value.allowed == tuple(BUILTIN_MODELS)
    assert "package.module:function" in str(err.value)
    assert "directory" in str(err.value)


def test_seq_len_must_be_sane() -> None:
    with pytest.raises(ConfigValidationError):
        load_model("minilm", seq_len=1)


@pytest.fixture()
def factory_module(tmp_path: Path) -> Iterator[str]:
    (tmp_path / "my_factories.py").write_text(
        textwrap.dedent(
            """
            import torch

            def good():
                return torch.nn.Linear(4, 2), (torch.ones(1, 4),)

            def single_tensor():
                return torch.nn.Linear(4, 2), torch.ones(1, 4)

            def not_a_pair():
                return torch.nn.Linear(4, 2)

            def bad_inputs():
                return torch.nn.Linear(4, 2), ("text",)

            def wrong_shape():
                return torch.nn.Linear(4, 2), (torch.ones(1, 5),)
            """
        )
    )
    sys.path.insert(0, str(tmp_path))
    try:
        yield "my_factories"
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("my_factories", None)


def test_factory_spec(factory_module: str) -> None:
    model = load_model(f"{factory_module}:good")
    assert model.kind == "custom"
    assert model.input_names == ("input_0",) and model.output_names == ("output_0",)
    assert export_program(model).module()(*model.example_inputs).shape == (1, 2)
    assert load_model(f"{factory_module}:single_tensor").example_inputs[0].shape == (1, 4)


@pytest.mark.parametrize(
    ("func", "message"),
    [
        ("not_a_pair", r"not \(module, args\) or \(module, args, kwargs\)"),
        ("bad_inputs", r"args\[0\] is a str"),
        ("wrong_shape", "fails on its own example inputs"),
        ("missing", "no callable named"),
    ],
)
def test_bad_factories(factory_module: str, func: str, message: str) -> None:
    with pytest.raises(ConfigValidationError, match=message):
        load_model(f"{factory_module}:{func}")


def test_unimportable_factory() -> None:
    with pytest.raises(ConfigValidationError, match="cannot import"):
        load_model("no_such_package_xyz.models:build")


def test_each_spec_goes_to_its_task(tiny_llama_dir: Path, factory_module: str) -> None:
    def task(spec: str, **kw: Any) -> str:
        return task_for(PrepareConfig(model=spec, **kw)).name

    assert task("tiny-cnn") == "vision"
    assert task("minilm") == "text-encoder"
    assert task("tiny-llama") == task(str(tiny_llama_dir)) == "causal-lm"
    assert task("tiny-qwen", kv_cache=True) == "causal-lm"
    assert task(f"{factory_module}:good") == "custom"
    # Every built-in belongs to exactly one task.
    owners = [name for t in TASKS for name in t.builtins()]
    assert sorted(owners) == sorted(BUILTIN_MODELS) and len(owners) == len(set(owners))


def test_a_kv_cache_export_of_a_non_decoder_says_why(tmp_path: Path) -> None:
    from qnn_prepare.api import run_prepare

    with pytest.raises(ConfigValidationError, match="needs a causal LM"):
        run_prepare(PrepareInput(PrepareConfig(model="tiny-cnn", kv_cache=True), tmp_path / "o"))


def test_the_manifest_names_the_task_and_lists_methods(tmp_path: Path) -> None:
    from qnn_prepare.api import run_prepare

    single = run_prepare(PrepareInput(PrepareConfig(model="tiny-cnn", calibration_samples=2,
                                                    eval_samples=1), tmp_path / "cnn"))
    assert single.sealed.metrics["task"] == "vision" and "methods" not in single.sealed.metrics
    assert (tmp_path / "cnn" / PROGRAM).is_file()
    lm = run_prepare(PrepareInput(
        PrepareConfig(model="tiny-llama", kv_cache=True, max_seq_len=16, prefill_len=4,
                      calibration_samples=1, eval_samples=1),
        tmp_path / "lm",
    ))
    assert lm.sealed.metrics["task"] == "causal-lm"
    assert lm.sealed.program is not None
    assert lm.sealed.program.methods == ("prefill", "decode")
    assert all((tmp_path / "lm" / method_program(m)).is_file() for m in ("prefill", "decode"))


def test_builtin_weights_come_from_the_task_that_has_them(tmp_path: Path) -> None:
    """The cache key covers a tiny decoder's shipped weights through its task, not a name
    check in api.py; a seeded built-in or a directory has none (its files are hashed)."""
    tiny = builtin_weights("tiny-llama")
    assert tiny is not None and len(tiny) > 1000
    assert builtin_weights("tiny-cnn") is None
    assert builtin_weights(str(tmp_path)) is None
