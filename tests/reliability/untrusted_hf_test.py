"""Issue 27, classes 2, 6 and 8 for Hugging Face files: data runs no code and has sane sizes.

An `auto_map` in a model directory (or in the tokenizer files a compile artifact carries) made
transformers ask "run the custom code? [y/N]", and `y` ran it; an HF directory needing remote
code crashed `--prompt` with a traceback; a config with a million layers was built for minutes;
a non-UTF-8 prompt raised a TypeError. Each test reproduces that with the real CLIs or loaders on
tiny-llama, then checks it is one error line and exit 2, the code unrun.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from qnn_common.errors import ArtifactError, ConfigValidationError
from qnn_common.stages import TOKENIZER_DIR
from qnn_infer.families.causal_lm import load_tokenizer
from support.crafted_hf import edit_json, tiny_decoder_dir, with_custom_code
from support.pipeline_runs import child_env


def _pipeline(*argv: str, stdin: str = "y\n") -> subprocess.CompletedProcess[str]:
    """qnn-pipeline in a child process, answering `y` to any question (as a user might)."""
    from qnn_pipeline import cli

    return subprocess.run(
        [sys.executable, "-m", cli.__name__, *argv],
        env=child_env(), input=stdin, text=True, capture_output=True, timeout=600, check=False,
    )


def _one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr[-3000:]
    return errors[0]


# --- 2. custom code -----------------------------------------------------------------------------


@pytest.mark.parametrize("prompt", [False, True], ids=["logits", "kv-cache"])
def test_custom_code_in_a_model_directory_is_refused_unrun(tmp_path: Path, prompt: bool) -> None:
    marker = tmp_path / "marker"
    model = with_custom_code(tiny_decoder_dir(tmp_path / "m"), marker)
    extra = ("--prompt", "Hi", "--max-new-tokens", "2") if prompt else ()
    done = _pipeline("--model", str(model), "--out", str(tmp_path / "out"),
                     "--stop-after", "prepare", *extra)
    assert not marker.exists(), "the directory's custom code ran"
    assert done.returncode == 2, done.stderr[-3000:]
    line = _one_error_line(done.stderr)
    assert "auto_map" in line and "config.json" in line and "factory" in line, line


@pytest.mark.parametrize("where", ["config.json", "tokenizer_config.json"])
def test_custom_code_in_an_artifacts_tokenizer_is_refused_unrun(tmp_path: Path, where: str) -> None:
    """What `qnn-infer A --prompt Hi` reads from a (re-sealed) compile artifact's tokenizer/."""
    marker = tmp_path / "marker"
    artifact = tmp_path / "artifact"
    tiny_decoder_dir(artifact / TOKENIZER_DIR)
    with_custom_code(artifact / TOKENIZER_DIR, marker, where=where)
    with pytest.raises(ArtifactError, match="auto_map") as info:
        load_tokenizer(artifact)
    assert info.value.path == artifact / TOKENIZER_DIR / where
    assert not marker.exists()


# --- 6. sizes a config asks for -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [("num_hidden_layers", 10**6), ("hidden_size", 2**40), ("vocab_size", 10**12)],
)
def test_a_config_asking_for_a_huge_model_is_refused_before_building_it(
    tmp_path: Path, field: str, value: int
) -> None:
    model = tiny_decoder_dir(tmp_path / "m")
    edit_json(model / "config.json", **{field: value})
    started = time.monotonic()
    done = _pipeline("--model", str(model), "--out", str(tmp_path / "out"), "--stop-after",
                     "prepare")
    assert done.returncode == 2, done.stderr[-3000:]
    line = _one_error_line(done.stderr)
    assert field in line and "config.json" in line, line
    assert time.monotonic() - started < 120


def test_a_huge_config_file_is_refused_unread(tmp_path: Path) -> None:
    from qnn_prepare.hf_dir import open_hf_dir

    model = tiny_decoder_dir(tmp_path / "m")
    with (model / "config.json").open("a", encoding="utf-8") as file:
        file.write(" " * (64 * 2**20))  # trailing whitespace: still valid JSON
    with pytest.raises(ArtifactError, match="MiB") as info:
        open_hf_dir(model, name="m", seed=0)
    assert info.value.path == model / "config.json"


# --- 8. what a prompt may be --------------------------------------------------------------------


def test_a_prompt_that_is_not_utf8_is_one_error_line(tmp_path: Path) -> None:
    """argv bytes that are not UTF-8 reach Python as lone surrogates, which no tokenizer takes."""
    from qnn_pipeline import cli

    done = subprocess.run(
        [sys.executable.encode(), b"-m", cli.__name__.encode(), b"--model", b"tiny-llama",
         b"--out", str(tmp_path / "out").encode(), b"--prompt", b"caf\xe9"],
        env=child_env(), capture_output=True, timeout=600, check=False,
    )
    stderr = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 2, stderr[-3000:]
    line = _one_error_line(stderr)
    assert "prompt" in line and "UTF-8" in line, line
    assert not (tmp_path / "out").exists()


def test_generation_config_refuses_a_prompt_with_surrogates() -> None:
    from qnn_common.llm_spec import GenerationConfig

    with pytest.raises(ConfigValidationError, match="UTF-8"):
        GenerationConfig(prompt="caf\udce9")


# --- 6 and 8. a chat template is a program from outside ---------------------------------------


def _chat_artifact(tmp_path: Path, template: str) -> Path:
    artifact = tmp_path / "artifact"
    tiny_decoder_dir(artifact / TOKENIZER_DIR)
    edit_json(artifact / TOKENIZER_DIR / "tokenizer_config.json", chat_template=template)
    return artifact


def _chat_ids(artifact: Path, prompt: str = "Hi") -> list[int]:
    from qnn_common.llm_spec import GenerationConfig, LlmSpec
    from qnn_infer.families.causal_lm import prompt_ids

    spec = LlmSpec(max_seq_len=64, prefill_len=8, vocab_size=256)
    return prompt_ids(load_tokenizer(artifact), GenerationConfig(prompt=prompt, chat=True), spec)


def test_an_honest_chat_template_gives_the_tokens_transformers_gives(tmp_path: Path) -> None:
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"
    artifact = _chat_artifact(tmp_path, template)
    tokenizer = load_tokenizer(artifact)
    assert tokenizer is not None
    want = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=True,
        return_dict=False,
    )
    assert _chat_ids(artifact) == [int(i) for i in want]


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        ("{{ 'x' * 300000000 }}", "more than"),  # 300 MB of text: past the output bound
        ("{{ 'x' * 3000000000 }}", "memory"),  # 3 GB in one allocation
        ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
         "did not render within"),
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "SecurityError"),
        ("{{ raise_exception('no') }}", "no"),
    ],
    ids=["output", "memory", "time", "sandbox", "raises"],
)
def test_a_chat_template_is_bounded_and_its_errors_are_one_message(
    tmp_path: Path, template: str, reason: str
) -> None:
    import resource

    artifact = _chat_artifact(tmp_path, template)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    with pytest.raises(ArtifactError, match="chat template") as info:
        _chat_ids(artifact)
    assert reason in info.value.reason
    assert time.monotonic() - started < 60
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 256, f"rendering grew this process by {grown_mib:.0f} MiB"


def test_a_nested_sentence_transformers_modules_file_is_one_error(tmp_path: Path) -> None:
    """modules.json is read as the other HF JSON files: bounded, RecursionError refused."""
    from qnn_prepare.encoder import _sentence_transformers_head  # where modules.json is read

    (tmp_path / "modules.json").write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    with pytest.raises(ArtifactError, match="RecursionError") as info:
        _sentence_transformers_head(tmp_path)
    assert info.value.path == tmp_path / "modules.json"
