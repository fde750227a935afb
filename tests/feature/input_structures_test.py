"""Models whose inputs are not a flat tuple of tensors (issue 8, class 1), end to end.

Each factory in `support.structured_models` (a list of index tensors for index_put, a dict
argument, keyword arguments, an int and a None argument, a nested tuple) goes through
`run_pipeline` on XNNPACK: fp32 with quantize skipped, and 8a8w. The real stages run; the .pte's
outputs are judged against the fp32 reference by SQNR and cosine. Measured when written: fp32
140-148 dB; 8a8w 39-57 dB vs fp32 and >= 56 dB vs fake quant (cosine >= 0.9999).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from qnn_common.config import Stage
from qnn_common.errors import ConfigValidationError, InputError
from qnn_common.stages import CALIBRATION, EVAL_INPUTS
from qnn_common.torchio.samples import ModelInputs, load_inputs
from qnn_pipeline.context import PipelineContext
from qnn_pipeline.orchestrator import run_pipeline
from qnn_prepare.models import load_model

_MODULE = "support.structured_models"
_FACTORIES = ("index_put_list", "dict_input", "keyword_args", "int_and_none", "nested_tuple")
_CALIBRATION = 8


def _run(name: str, out: Path, *, quantize: bool) -> dict[str, Any]:
    ctx = PipelineContext.create(
        f"{_MODULE}:{name}",
        backend="xnnpack",
        recipe="8a8w" if quantize else "fp32",
        out_dir=out,
        skip=frozenset() if quantize else frozenset({Stage.QUANTIZE}),
        prepare={"calibration_samples": _CALIBRATION, "eval_samples": 3},
        infer={"warmup": 1, "runs": 2},
    )
    return run_pipeline(ctx).checked().summary


def _stage_dir(out: Path, stage: str) -> Path:
    (found,) = (p for p in out.iterdir() if p.is_dir() and p.name.startswith(f"{stage}-"))
    return found


@pytest.mark.parametrize("name", _FACTORIES)
def test_fp32_program_matches_eager(name: str, tmp_path: Path) -> None:
    summary = _run(name, tmp_path / "out", quantize=False)
    accuracy = summary["accuracy"]
    # Float XNNPACK vs eager: rounding-level differences only.
    assert float(accuracy["sqnr_db_vs_fp32"]) > 60, accuracy
    assert float(accuracy["cosine_vs_fp32"]) > 0.9999, accuracy

    # The samples keep the example's structure, and only its float tensors vary.
    example = load_model(f"{_MODULE}:{name}").example
    prepare = _stage_dir(tmp_path / "out", "prepare")
    for file in (CALIBRATION, EVAL_INPUTS):
        samples = load_inputs(prepare / file, like=example)
        assert len(samples) == (_CALIBRATION if file == CALIBRATION else 3)
        for sample in samples:
            for got, want in zip(sample.leaves(), example.leaves(), strict=True):
                if not isinstance(want, torch.Tensor):
                    assert got == want
                elif not want.is_floating_point():
                    assert torch.equal(got, want)


@pytest.mark.parametrize("name", _FACTORIES)
def test_8a8w_program_is_quantized_and_close(name: str, tmp_path: Path) -> None:
    summary = _run(name, tmp_path / "out", quantize=True)
    accuracy = summary["accuracy"]
    assert summary["quantized_ops"] > 0, summary
    # 8-bit activations and weights through one small linear (and a mul or two).
    assert float(accuracy["sqnr_db_vs_fp32"]) > 30, accuracy
    assert float(accuracy["cosine_vs_fp32"]) > 0.999, accuracy
    # The .pte reproduces the fake-quant reference far more closely than 8 bits lose.
    assert float(accuracy["sqnr_db_vs_fake_quant"]) > 40, accuracy


def test_the_pte_takes_every_leaf_constants_included(tmp_path: Path) -> None:
    """torch.export keeps the int and the None as (ignored) inputs, and so does the .pte."""
    from qnn_infer.runner import HostRunner

    _run("int_and_none", tmp_path / "out", quantize=False)
    example = load_model(f"{_MODULE}:int_and_none").example
    runner = HostRunner(_stage_dir(tmp_path / "out", "compile") / "model.pte")
    assert len(runner.input_specs) == len(example.leaves()) == 3
    assert runner.input_specs[1] is None and runner.input_specs[2] is None  # not tensors
    assert runner.run(example.leaves())[0].shape == (16, 16)
    tensors_only = tuple(v for v in example.leaves() if isinstance(v, torch.Tensor))
    with pytest.raises(InputError, match="pytree leaves of its"):
        runner.run(tensors_only)


def test_keyword_arguments_bind_by_position_where_forward_allows() -> None:
    model = load_model(f"{_MODULE}:keyword_args")
    # `mask` names forward's second positional parameter: it becomes the second argument.
    assert model.input_names == ("input_0", "mask")
    assert set(model.example_kwargs) == {"gain", "scale"}
    program = torch.export.export(model.module, model.example_inputs, dict(model.example_kwargs))
    assert len(program.graph_signature.user_inputs) == len(model.example.leaves())


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (lambda: (torch.nn.Linear(2, 2),), "not (module, args) or (module, args, kwargs)"),
        (lambda: (torch.nn.Linear(2, 2), {"x": torch.ones(2)}), "args is a dict"),
        (lambda: (torch.nn.Linear(2, 2), (torch.ones(2),), [1]), "kwargs is a list"),
        (lambda: (torch.nn.Linear(2, 2), ("text",)), "args[0] is a str"),
        (lambda: (torch.nn.Linear(2, 2), ({1: torch.ones(2)},)), "dict keys must be str"),
        (lambda: (torch.nn.Linear(2, 2), (3, None)), "hold no tensor"),
    ],
)
def test_factory_results_outside_the_contract_are_refused(
    result: Any, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import support.structured_models as models

    monkeypatch.setattr(models, "bad_factory", result, raising=False)
    with pytest.raises(ConfigValidationError) as err:
        load_model(f"{_MODULE}:bad_factory")
    assert message in str(err.value)
    assert "(module, args, kwargs)" in str(err.value)  # the contract comes with the refusal


def test_a_structured_inputs_file_must_match_the_example(tmp_path: Path) -> None:
    from qnn_common.errors import ArtifactError
    from qnn_common.torchio.samples import save_samples

    example = load_model(f"{_MODULE}:int_and_none").example
    path = tmp_path / "inputs.pt"
    save_samples(path, [ModelInputs((example.args[0], 3, None))])
    with pytest.raises(ArtifactError, match="expected the constant 2, got 3"):
        load_inputs(path, like=example)
