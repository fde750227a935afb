"""Issue 49, reproductions 1 and 2 through an artifact: a prepare artifact's `methods/*.pt2` with
code in its `model.json` (a symbolic size that is Python, a guard), re-sealed as anyone can,
handed to `qnn-quant DIR` and `qnn-pipeline --from DIR`. Both read the program through
`load_program`, which checks it (untrusted_program_json_test.py tests that function); these
tests hold the two entry points to it: the payload never runs, and each run ends in one
`error:` line."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from qnn_pipeline.cli import main as pipeline_main
from qnn_quant.cli import main as quant_main
from support.crafted_pt2 import ProgramEdit, guard_payload, sympy_payload, with_program_json
from support.pipeline_runs import TINY_CNN
from support.pte_variants import reseal
from support.summary import read_summary


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("prepared")
    assert pipeline_main([*TINY_CNN, "--out", str(out), "--stop-after", "prepare", "-q"]) == 0
    return Path(next(s["artifact"] for s in read_summary(out)["stages"]
                     if s["name"] == "prepare"))


def _poisoned(prepared: Path, tmp_path: Path, edit: ProgramEdit) -> Path:
    """A copy of `prepared` whose every method carries `edit`, re-sealed."""
    artifact = tmp_path / "prepared"
    shutil.copytree(prepared, artifact)
    methods = sorted((artifact / "methods").glob("*.pt2"))
    assert methods, f"no methods/*.pt2 in {prepared}"
    for method in methods:
        crafted = with_program_json(method, tmp_path / method.name, edit)
        shutil.copyfile(crafted, method)
        reseal(artifact, str(method.relative_to(artifact)))
    return artifact


@pytest.mark.parametrize(("payload", "says"),
                         [(sympy_payload, "symbolic size"), (guard_payload, None)])
@pytest.mark.parametrize("entry", ["qnn-quant", "qnn-pipeline --from"])
def test_code_in_an_artifacts_method_never_runs(
    prepared: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    payload: Callable[[Path], ProgramEdit], says: str | None, entry: str,
) -> None:
    marker = tmp_path / "marker"
    artifact = _poisoned(prepared, tmp_path, payload(marker))
    if entry == "qnn-quant":
        code = quant_main([str(artifact), "-o", str(tmp_path / "quantized"), "-q"])
    else:
        # The recipe named: from a prepare artifact the pipeline otherwise takes the fp32 path,
        # which skips quantize.
        code = pipeline_main(["--from", str(artifact), "--out", str(tmp_path / "out"),
                              "--recipe", "8a8w", "--stop-after", "quantize", "-q"])
    err = capsys.readouterr().err
    assert not marker.exists(), f"{entry} ran the file's code"
    assert "Traceback" not in err, err[-3000:]
    if says is None:
        # Guards are dropped, not judged: the program is otherwise honest, and it quantizes.
        assert code == 0, err[-3000:]
    else:
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 2 and len(errors) == 1 and says in errors[0], err[-3000:]
