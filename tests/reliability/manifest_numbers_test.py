"""Issue 49, item 6: a manifest whose JSON Python cannot hold, or that no stage writes.

An integer of more than 4,300 digits made `json.loads` raise a bare ValueError (a traceback), and
once such an artifact sat in `--out` every rerun of the pipeline failed the same way. Now every
manifest is read by one strict reader: such a file is an unreadable manifest (one `error:` line
naming it), and a cached artifact with one is made again.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from qnn_common.errors import ArtifactError
from qnn_common.manifest import MANIFEST_NAME
from qnn_common.sealing import load_manifest
from qnn_pipeline.cli import main as pipeline_main
from support.pipeline_runs import TINY_CNN, leftovers
from support.summary import read_summary, stage_statuses

HUGE_INT = "1" + "0" * 5000


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny-cnn pipeline run; tests copy it before breaking its manifests."""
    out = tmp_path_factory.mktemp("run")
    assert pipeline_main([*TINY_CNN, "--out", str(out), "-q"]) == 0
    return out


def _stage_dir(out: Path, stage: str) -> Path:
    return Path(next(s["artifact"] for s in read_summary(out)["stages"] if s["name"] == stage))


def _break(manifest: Path, insert: str) -> None:
    """Put `insert` (a JSON member, text) first in the manifest's top object."""
    text = manifest.read_text(encoding="utf-8")
    assert text.startswith("{\n")
    manifest.write_text("{" + insert + ",\n" + text[2:], encoding="utf-8")


# Members no stage writes, each once a raw traceback or a value the readers trip over later.
BROKEN = {
    "huge int": (f'"created_unix": {HUGE_INT}', "an integer of 5001 digits"),
    "huge negative int": (f'"x": -{HUGE_INT}', "an integer of 5001 digits"),
    "nan": ('"x": NaN', "NaN"),
    "infinity": ('"x": -Infinity', "-Infinity"),
    "overflowing float": ('"x": 1e999', "1e999"),
    "duplicate key": ('"stage": "compile"', "the key 'stage' twice"),
    "deep nesting": ('"x": ' + "[" * 200 + "]" * 200, "nested"),
}


@pytest.mark.parametrize("case", BROKEN, ids=list(BROKEN))
def test_a_manifest_no_stage_writes_is_refused_as_unreadable(
    run: Path, tmp_path: Path, case: str
) -> None:
    member, said = BROKEN[case]
    quant = tmp_path / "q"
    shutil.copytree(_stage_dir(run, "quantize"), quant)
    _break(quant / MANIFEST_NAME, member)
    with pytest.raises(ArtifactError) as caught:
        load_manifest(quant)
    assert caught.value.path == quant / MANIFEST_NAME
    assert said in caught.value.reason and "rerun the stage" in caught.value.reason
    assert "\n" not in str(caught.value)


def test_resuming_from_an_artifact_with_a_huge_integer_is_one_error_line(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    quant = tmp_path / "q"
    shutil.copytree(_stage_dir(run, "quantize"), quant)
    _break(quant / MANIFEST_NAME, f'"created_unix": {HUGE_INT}')
    capsys.readouterr()
    assert pipeline_main(["--from", str(quant), "--out", str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and str(quant / MANIFEST_NAME) in lines[0], err
    assert "an integer of 5001 digits" in lines[0]


@pytest.mark.parametrize("stage", ["quantize", "infer"])
def test_a_cached_artifact_with_an_unreadable_manifest_is_made_again(
    run: Path, tmp_path: Path, stage: str
) -> None:
    """Not a wedge: the stage runs again, its new artifact replaces the broken one whole."""
    out = tmp_path / "out"
    shutil.copytree(run, out)
    broken = out / _stage_dir(run, stage).name
    _break(broken / MANIFEST_NAME, f'"created_unix": {HUGE_INT}')
    for _ in range(2):  # and the rerun after that finds it cached
        assert pipeline_main([*TINY_CNN, "--out", str(out), "-q"]) == 0
        load_manifest(broken)
    statuses = stage_statuses(read_summary(out))
    assert set(statuses.values()) == {"cached"}, statuses
    assert leftovers(out) == []
