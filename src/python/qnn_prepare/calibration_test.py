from __future__ import annotations

from pathlib import Path

import pytest
import torch

from qnn_common.errors import ArtifactError, ConfigValidationError
from qnn_common.torchio.samples import load_samples, save_samples
from qnn_prepare.calibration import (
    BUILTIN_SENTENCES,
    calibration_summary,
    make_calibration,
    random_samples,
    tokenize_like,
)
from qnn_prepare.models import load_model
from qnn_prepare.task import LoadedModel

SEQ = 24


@pytest.fixture(scope="module")
def minilm() -> LoadedModel:
    return load_model("minilm", seq_len=SEQ)


@pytest.fixture(scope="module")
def cnn() -> LoadedModel:
    return load_model("tiny-cnn")


def _assert_fits(samples: list[tuple[torch.Tensor, ...]], model: LoadedModel) -> None:
    for sample in samples:
        assert len(sample) == len(model.example_inputs)
        for got, want in zip(sample, model.example_inputs, strict=True):
            assert got.dtype == want.dtype and got.shape == want.shape


def test_builtin_sentences_for_a_text_encoder(minilm: LoadedModel) -> None:
    samples = make_calibration(minilm, num_samples=5, source=None, seed=1126)
    assert len(samples) == 5
    _assert_fits(samples, minilm)
    assert torch.equal(samples[0][0], tokenize_like(minilm, BUILTIN_SENTENCES[0])[0])
    lengths = {int(mask.sum()) for _, mask in samples}
    assert len(lengths) > 1  # varied lengths, so padding and full rows both get observed


def test_more_samples_than_builtin_sentences_adds_seeded_pairs(minilm: LoadedModel) -> None:
    n = len(BUILTIN_SENTENCES) + 4
    a = make_calibration(minilm, num_samples=n, source=None, seed=1)
    b = make_calibration(minilm, num_samples=n, source=None, seed=1)
    assert len(a) == n
    assert all(torch.equal(x[0], y[0]) for x, y in zip(a, b, strict=True))
    ids = {tuple(s[0].flatten().tolist()) for s in a}
    assert len(ids) == n  # no duplicates


def test_random_inputs_for_models_without_tokenizer(cnn: LoadedModel) -> None:
    a = make_calibration(cnn, num_samples=3, source=None, seed=5)
    b = make_calibration(cnn, num_samples=3, source=None, seed=5)
    _assert_fits(a, cnn)
    assert all(torch.equal(x[0], y[0]) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0][0], a[1][0])


def test_random_text_inputs_have_valid_ids_and_masks(minilm: LoadedModel) -> None:
    samples = random_samples(minilm, num_samples=4, seed=3)
    _assert_fits(samples, minilm)
    for ids, mask in samples:
        assert int(ids.min()) >= 0 and int(ids.max()) < 30522
        assert torch.equal(mask, torch.ones_like(mask))
        with torch.no_grad():
            assert torch.isfinite(minilm.module(ids, mask)).all()


def test_text_file_source(minilm: LoadedModel, tmp_path: Path) -> None:
    source = tmp_path / "calib.txt"
    source.write_text("first line\n\n   \nsecond line here\nthird\n", encoding="utf-8")
    samples = make_calibration(minilm, num_samples=2, source=source, seed=0)
    assert len(samples) == 2
    _assert_fits(samples, minilm)
    assert torch.equal(samples[1][0], tokenize_like(minilm, "second line here")[0])
    # Fewer lines than asked for: one sample per line.
    assert len(make_calibration(minilm, num_samples=10, source=source, seed=0)) == 3


def test_text_file_needs_a_tokenizer(cnn: LoadedModel, tmp_path: Path) -> None:
    source = tmp_path / "calib.txt"
    source.write_text("hello\n", encoding="utf-8")
    with pytest.raises(ConfigValidationError, match="needs a tokenizer"):
        make_calibration(cnn, num_samples=1, source=source, seed=0)


def test_empty_text_file(minilm: LoadedModel, tmp_path: Path) -> None:
    source = tmp_path / "empty.txt"
    source.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(ConfigValidationError, match="no non-blank lines"):
        make_calibration(minilm, num_samples=1, source=source, seed=0)


def test_pt_file_source_round_trips(minilm: LoadedModel, tmp_path: Path) -> None:
    samples = random_samples(minilm, num_samples=3, seed=9)
    path = tmp_path / "sub" / "calib.pt"
    save_samples(path, samples)
    got = make_calibration(minilm, num_samples=2, source=path, seed=0)
    assert len(got) == 2
    assert all(torch.equal(a, b) for a, b in zip(got[1], samples[1], strict=True))
    loaded = load_samples(path, like=minilm.example_inputs)
    assert len(loaded) == 3


def test_pt_file_with_single_tensors(cnn: LoadedModel, tmp_path: Path) -> None:
    path = tmp_path / "images.pt"
    torch.save([torch.randn(1, 3, 32, 32) for _ in range(2)], path)
    samples = make_calibration(cnn, num_samples=2, source=path, seed=0)
    assert len(samples) == 2 and isinstance(samples[0], tuple)


def test_pt_file_with_wrong_shape_names_file_sample_and_shapes(
    cnn: LoadedModel, tmp_path: Path
) -> None:
    path = tmp_path / "bad.pt"
    torch.save([(torch.randn(1, 3, 32, 32),), (torch.randn(1, 3, 28, 28),)], path)
    with pytest.raises(ConfigValidationError) as err:
        make_calibration(cnn, num_samples=2, source=path, seed=0)
    message = str(err.value)
    assert str(path) in message
    assert "sample 1" in message
    assert "[1, 3, 32, 32]" in message and "[1, 3, 28, 28]" in message
    with pytest.raises(ArtifactError, match="sample 1"):
        load_samples(path, like=cnn.example_inputs)


def test_pt_file_with_wrong_dtype(minilm: LoadedModel, tmp_path: Path) -> None:
    path = tmp_path / "int32.pt"
    ids, mask = minilm.example_inputs
    torch.save([(ids.to(torch.int32), mask)], path)
    with pytest.raises(
        ConfigValidationError, match=r"sample 0 input 0: expected dtype torch.int64"
    ):
        make_calibration(minilm, num_samples=1, source=path, seed=0)


def test_pt_file_with_too_few_samples(cnn: LoadedModel, tmp_path: Path) -> None:
    path = tmp_path / "few.pt"
    save_samples(path, random_samples(cnn, num_samples=2, seed=0))
    with pytest.raises(ConfigValidationError, match="holds 2 samples but num_samples is 5"):
        make_calibration(cnn, num_samples=5, source=path, seed=0)


def test_pt_file_that_is_not_a_sample_list(cnn: LoadedModel, tmp_path: Path) -> None:
    path = tmp_path / "dict.pt"
    torch.save({"x": torch.zeros(1)}, path)
    with pytest.raises(ConfigValidationError, match="expected a tensor"):
        make_calibration(cnn, num_samples=1, source=path, seed=0)
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a torch file")
    with pytest.raises(ArtifactError, match="not a zip archive.*torch.save"):
        load_samples(garbage)


def test_bad_sources(cnn: LoadedModel, tmp_path: Path) -> None:
    with pytest.raises(ConfigValidationError, match="does not exist"):
        make_calibration(cnn, num_samples=1, source=tmp_path / "nope.pt", seed=0)
    odd = tmp_path / "calib.csv"
    odd.write_text("1,2\n")
    with pytest.raises(ConfigValidationError, match="unknown file type"):
        make_calibration(cnn, num_samples=1, source=odd, seed=0)
    with pytest.raises(ConfigValidationError, match="at least one"):
        make_calibration(cnn, num_samples=0, source=None, seed=0)


def test_load_samples_errors(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="does not exist"):
        load_samples(tmp_path / "missing.pt")
    with pytest.raises(ArtifactError, match="empty"):
        save_samples(tmp_path / "x.pt", [])


# --- module:function models: calibrated on their example's range ---------------------------------


def _custom(example: tuple[torch.Tensor, ...]) -> LoadedModel:
    return LoadedModel(
        name="custom",
        kind="custom",
        module=torch.nn.Identity(),
        example_inputs=example,
        input_names=tuple(f"input_{i}" for i in range(len(example))),
        output_names=("output_0",),
        tokenizer=None,
        tokenizer_files=(),
        vocab_size=None,
    )


def test_custom_models_are_calibrated_on_their_example_range() -> None:
    gen = torch.Generator().manual_seed(0)
    x = 2 + 96 * torch.rand(3, 16, generator=gen)
    rows = torch.tensor([4, 0, 2, 2])
    model = _custom((x, rows))
    samples = make_calibration(model, num_samples=6, source=None, seed=5)
    assert len(samples) == 6
    _assert_fits(samples, model)
    assert torch.equal(samples[0][0], x) and torch.equal(samples[0][1], rows)
    for got_x, got_rows in samples:
        assert float(got_x.min()) >= float(x.min()) and float(got_x.max()) <= float(x.max())
        # Integers are permuted: the same values, so indices stay valid indices.
        assert sorted(got_rows.tolist()) == sorted(rows.tolist())
    assert not torch.equal(samples[1][0], x) and not torch.equal(samples[2][0], x)
    again = make_calibration(model, num_samples=6, source=None, seed=5)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(samples, again, strict=True))
    held_out = make_calibration(model, num_samples=2, source=None, seed=6, include_example=False)
    assert not any(torch.equal(s[0], x) for s in held_out)


def test_calibration_summary_names_the_source(cnn: LoadedModel, tmp_path: Path) -> None:
    model = _custom((torch.full((2, 2), 7.0),))
    samples = make_calibration(model, num_samples=3, source=None, seed=1)
    summary = calibration_summary(model, samples, None)
    assert summary == {
        "source": "example-range",
        "samples": 3,
        "inputs": [{"input": "input_0", "dtype": "float32", "min": 7.0, "max": 7.0}],
    }
    assert calibration_summary(cnn, random_samples(cnn, num_samples=1, seed=1), None)[
        "source"
    ] == "random"
    path = tmp_path / "c.pt"
    assert calibration_summary(cnn, [], path) == {
        "source": "file", "samples": 0, "inputs": [], "file": str(path)
    }
