"""Models a user brings as ``package.module:function`` (issue 8, classes 2-4), end to end.

* in-place updates: a model that updates its input in place is prepared on copies (the saved
  eval input stays x, not f(x)) and infer compares only the program's user outputs;
* honest caching: editing the factory's body (or the weights it loads) reruns prepare;
* calibration follows the example's input range instead of N(0, 1) noise.

Each writes its model module to a temporary directory and runs the real stages.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from qnn_common.config import PrepareConfig, QuantizeConfig
from qnn_common.stages import (
    CALIBRATION,
    EVAL_INPUTS,
    REFERENCE_FP32,
    PrepareInput,
    QuantizeInput,
)
from qnn_common.torchio.samples import load_samples
from qnn_pipeline.cli import main as pipeline_main
from qnn_prepare.api import prepare_cache_key, run_prepare
from qnn_quant.api import run_quantize
from support.summary import read_summary, stage_statuses

_INPLACE = """
import torch


class AddsInPlace(torch.nn.Module):
    def forward(self, x, rows):
        x.add_(1)
        x.index_put_((rows,), torch.zeros(2, 8))
        return x * 2


def make():
    x = torch.arange(32, dtype=torch.float32).reshape(4, 8) / 8
    return AddsInPlace(), (x, torch.tensor([1, 3]))
"""

_SCALED = """
import torch


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(16, 8)

    def forward(self, x):
        return torch.relu(self.fc(x)) * SCALE


SCALE = 1.0


def make():
    return Scaled(), (torch.linspace(-1, 1, 32).reshape(2, 16),)
"""

# Input in [2, 98] (a percentage, say): N(0, 1) calibration noise misses it entirely.
_PERCENT = """
import torch


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 8)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def make():
    gen = torch.Generator().manual_seed(3)
    return Mlp(), (2 + 96 * torch.rand(4, 32, generator=gen),)
"""


@pytest.fixture()
def user_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on sys.path for model modules, cleaned up (path and modules) afterwards."""
    src = tmp_path / "user_src"
    src.mkdir()
    sys.path.insert(0, str(src))
    before = set(sys.modules)
    try:
        yield src
    finally:
        sys.path.remove(str(src))
        for name in set(sys.modules) - before:
            if name.startswith("user_model_"):
                del sys.modules[name]


def _write(directory: Path, name: str, source: str) -> str:
    (directory / f"{name}.py").write_text(textwrap.dedent(source))
    return name




def test_inplace_model_keeps_its_inputs_and_infer_compares_user_outputs(
    user_dir: Path, tmp_path: Path
) -> None:
    name = _write(user_dir, "user_model_inplace", _INPLACE)
    x = torch.arange(32, dtype=torch.float32).reshape(4, 8) / 8
    expected = (x + 1).index_put((torch.tensor([1, 3]),), torch.zeros(2, 8)) * 2

    prep = run_prepare(
        PrepareInput(PrepareConfig(model=f"{name}:make", eval_samples=2), tmp_path / "prep")
    )
    eval_inputs = load_samples(prep.path / EVAL_INPUTS)
    references = load_samples(prep.path / REFERENCE_FP32)
    # The saved example is x itself, and its reference is f(x): not f(f(x)).
    torch.testing.assert_close(eval_inputs[0][0], x)
    torch.testing.assert_close(references[0][0], expected)
    # Every reference is f of the saved input next to it.
    for (x_i, rows_i), (ref,) in zip(eval_inputs, references, strict=True):
        torch.testing.assert_close(ref, (x_i + 1).index_put((rows_i,), torch.zeros(2, 8)) * 2)

    out = tmp_path / "pipe"
    argv = ["--model", f"{name}:make", "--skip", "quantize", "--out", str(out), "--runs", "2"]
    assert pipeline_main(argv) == 0
    summary = read_summary(out)
    # The runtime also returns the updated x; compared against the reference it would fail.
    assert float(summary["accuracy"]["sqnr_db_vs_fp32"]) > 100


_INPLACE_LINEAR = """
import torch


class AddsThenProjects(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        x.add_(1)
        return self.fc(x)


def make():
    return AddsThenProjects(), (torch.randn(4, 8),)
"""


def test_quantizing_an_inplace_model_keeps_its_eval_inputs(user_dir: Path, tmp_path: Path) -> None:
    # Calibration, the per-layer report and the fake-quant reference each ran the model on the
    # eval inputs themselves: the reference was then f(x + 1) (measured 3.7 dB vs the .pte).
    name = _write(user_dir, "user_model_inplace_linear", _INPLACE_LINEAR)
    out = tmp_path / "pipe"
    assert pipeline_main(["--model", f"{name}:make", "--out", str(out), "--runs", "2"]) == 0
    accuracy = read_summary(out)["accuracy"]
    assert float(accuracy["sqnr_db_vs_fake_quant"]) > 25
    assert float(accuracy["sqnr_db_vs_fp32"]) > 25


def test_editing_a_factory_reruns_prepare(user_dir: Path, tmp_path: Path) -> None:
    name = _write(user_dir, "user_model_scaled", _SCALED)
    config = PrepareConfig(model=f"{name}:make", eval_samples=1, calibration_samples=2)
    out = tmp_path / "out"
    argv = ["--model", f"{name}:make", "--skip", "quantize", "--skip", "infer",
            "--out", str(out), "--calibration-samples", "2"]
    assert pipeline_main(argv) == 0
    assert stage_statuses(read_summary(out))["prepare"] == "ran"
    key = prepare_cache_key(config)
    assert pipeline_main(argv) == 0
    assert stage_statuses(read_summary(out))["prepare"] == "cached"

    # The same size, within the same second: Python's bytecode cache cannot tell.
    edited = _SCALED.replace("SCALE = 1.0", "SCALE = 3.0")
    (user_dir / f"{name}.py").write_text(textwrap.dedent(edited))
    assert prepare_cache_key(config) != key
    assert pipeline_main(argv) == 0
    summary = read_summary(out)
    assert stage_statuses(summary)["prepare"] == "ran"
    prep_dir = Path(next(s["artifact"] for s in summary["stages"] if s["name"] == "prepare"))
    (ref,) = load_samples(prep_dir / REFERENCE_FP32)[0]
    (example,) = load_samples(prep_dir / EVAL_INPUTS)[0]
    torch.manual_seed(0)
    fc = torch.nn.Linear(16, 8)
    with torch.no_grad():
        torch.testing.assert_close(ref, torch.relu(fc(example)) * 3.0)


def test_editing_the_weights_a_factory_loads_changes_the_key(user_dir: Path) -> None:
    torch.save({"weight": torch.ones(2, 4), "bias": torch.zeros(2)}, user_dir / "weights.pt")
    source = """
    from pathlib import Path
    import torch

    def make():
        fc = torch.nn.Linear(4, 2)
        fc.load_state_dict(torch.load(Path(__file__).parent / "weights.pt"))
        return fc, (torch.ones(1, 4),)
    """
    name = _write(user_dir, "user_model_weights", source)
    config = PrepareConfig(model=f"{name}:make")
    key = prepare_cache_key(config)
    assert prepare_cache_key(config) == key
    torch.save({"weight": 2 * torch.ones(2, 4), "bias": torch.zeros(2)}, user_dir / "weights.pt")
    assert prepare_cache_key(config) != key


def test_calibration_follows_the_example_range(user_dir: Path, tmp_path: Path) -> None:
    name = _write(user_dir, "user_model_percent", _PERCENT)
    prep = run_prepare(
        PrepareInput(PrepareConfig(model=f"{name}:make", calibration_samples=8), tmp_path / "p")
    )
    samples = load_samples(prep.path / CALIBRATION)
    assert len(samples) == 8
    gen = torch.Generator().manual_seed(3)
    example = 2 + 96 * torch.rand(4, 32, generator=gen)
    torch.testing.assert_close(samples[0][0], example)  # the example itself comes first
    low, high = float(example.min()), float(example.max())
    for (x,) in samples:
        assert low <= float(x.min()) and float(x.max()) <= high
    assert len({x.sum().item() for (x,) in samples}) > 1  # variations, not copies
    info = prep.sealed.metrics["calibration"]
    assert info["source"] == "example-range" and info["samples"] == 8
    assert info["inputs"] == [
        {"input": "input_0", "dtype": "float32", "min": pytest.approx(low),
         "max": pytest.approx(high)}
    ]

    # And it matters: 8a8w calibrated on the example's range against N(0, 1) noise, both
    # judged on the same held-out eval inputs (variations of the example).
    noise = tmp_path / "noise.pt"
    torch.save([(torch.randn(4, 32, generator=gen),) for _ in range(8)], noise)
    noisy = run_prepare(
        PrepareInput(
            PrepareConfig(model=f"{name}:make", calibration_samples=8, calibration_file=noise),
            tmp_path / "p-noise",
        )
    )
    assert noisy.sealed.metrics["calibration"]["source"] == "file"
    sqnr = {
        label: run_quantize(
            QuantizeInput(p, QuantizeConfig(report_layers=0), tmp_path / f"q-{label}")
        ).sealed.metrics["accuracy"]["vs_fp32"]["sqnr_db"]
        for label, p in (("example", prep), ("noise", noisy))
    }
    print(f"8a8w SQNR vs fp32: example-range {sqnr['example']:.1f} dB, "
          f"N(0, 1) {sqnr['noise']:.1f} dB")
    assert sqnr["example"] > 30
    assert sqnr["example"] > sqnr["noise"] + 10
