"""Issue 49, items 4, 7 and 9 for Hugging Face directories: configs, tokenizers, templates, prompts.

A malformed config.json under `--prompt` (`"auto_map": null`, a float layer count, heads that do
not divide the hidden size) gave raw tracebacks from transformers or huggingface_hub; a config
whose weights come to tens of gigabytes passed the size check, which ignored the MLP; a corrupt
tokenizer.json was dropped silently at prepare and failed only at infer; a 2 GB chat template
cost gigabytes before it was refused, and a 40 MB prompt in a TOML aborted under a memory limit.
Each test reproduces that with the real CLI or loader on tiny-llama's directory.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from qnn_common.errors import ArtifactError, ConfigValidationError
from qnn_common.stages import TOKENIZER_DIR
from support.crafted_hf import edit_json, tiny_decoder_dir
from support.pipeline_runs import child_env


def _pipeline(*argv: str) -> subprocess.CompletedProcess[str]:
    from qnn_pipeline import cli

    return subprocess.run(
        [sys.executable, "-m", cli.__name__, *argv],
        env=child_env(), text=True, capture_output=True, timeout=300, check=False,
    )


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr[-3000:]
    return errors[0]


def _with_config(tmp_path: Path, **changes: Any) -> Path:
    """tiny-llama's directory with config.json changed (a value of ... deletes the key)."""
    model = tiny_decoder_dir(tmp_path / "m")
    config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    for key, value in changes.items():
        if value is ...:
            del config[key]
        else:
            config[key] = value
    (model / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return model


# --- 7. malformed config.json under --prompt ---------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [("auto_map", None), ("num_hidden_layers", 2.0), ("num_hidden_layers", 2.5),
     ("num_attention_heads", 3)],
    ids=["auto_map-null", "layers-2.0", "layers-2.5", "heads-not-dividing"],
)
def test_a_malformed_config_under_prompt_is_one_error_line(
    tmp_path: Path, field: str, value: object
) -> None:
    model = _with_config(tmp_path, **{field: value})
    out = tmp_path / "out"
    done = _pipeline("--model", str(model), "--out", str(out), "--prompt", "Hi",
                     "--max-new-tokens", "2", "--stop-after", "prepare")
    line = _one_error_line(done)
    assert "config.json" in line and field in line, line
    assert not out.exists(), "refused before --out is touched"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"num_hidden_layers": -1}, "num_hidden_layers"),  # built an empty model, rc 0
        ({"num_hidden_layers": 0}, "num_hidden_layers"),
        ({"hidden_size": "64"}, "hidden_size"),
        ({"vocab_size": None}, "vocab_size"),
        ({"vocab_size": ...}, "vocab_size"),
        ({"model_type": None}, "model_type"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"head_dim": 0}, "head_dim"),
        ({"rms_norm_eps": "small"}, "rms_norm_eps"),
        ({"hidden_act": "nope"}, "hidden_act"),
        ({"rope_parameters": {"rope_type": "nope", "rope_theta": 10000.0}}, "rope_type"),
        ({"eos_token_id": "x"}, "eos_token_id"),
        ({"intermediate_size": 10**30}, "intermediate_size"),
        ({"tie_word_embeddings": "no"}, "tie_word_embeddings"),
        ({"architectures": 5}, "architectures"),
    ],
    ids=lambda v: "-".join(f"{k}={v[k]!r}"[:30] for k in v) if isinstance(v, dict) else None,
)
def test_a_malformed_config_field_is_named_before_transformers_reads_it(
    tmp_path: Path, changes: dict[str, Any], field: str
) -> None:
    """What `--prompt` checks first (check_prompt_fits), in process: the config's own fields."""
    from qnn_prepare.causal_lm.export import check_prompt_fits

    model = _with_config(tmp_path, **changes)
    with pytest.raises(ArtifactError) as info:
        check_prompt_fits(str(model), max_seq_len=None, prefill_len=None, prompt="Hi",
                          max_new_tokens=2)
    assert info.value.path == model / "config.json"
    assert field in info.value.reason and "fix" in info.value.reason, info.value.reason


def test_an_unknown_model_type_is_one_message(tmp_path: Path) -> None:
    """Fields check_config does not know still reach the user as one ArtifactError."""
    from qnn_prepare.causal_lm.export import check_prompt_fits

    model = _with_config(tmp_path, model_type="no_such_family")
    with pytest.raises(ArtifactError, match="transformers cannot read this config"):
        check_prompt_fits(str(model), max_seq_len=None, prefill_len=None, prompt="Hi",
                          max_new_tokens=2)


# --- 4. the weights a config asks for ------------------------------------------------------------


def test_a_config_whose_mlp_cannot_fit_in_memory_is_refused(tmp_path: Path) -> None:
    """16 layers of 4096 with a 1,000,000-wide gated MLP: 197 billion weights. The old check
    counted two hidden x hidden matrices per layer and the embedding: 1 GiB, so it passed."""
    from qnn_common.torchio.hf_untrusted import check_model_dir

    model = _with_config(tmp_path, num_hidden_layers=16, hidden_size=4096, head_dim=128,
                         num_attention_heads=32, num_key_value_heads=8,
                         intermediate_size=1_000_000)
    with pytest.raises(ArtifactError, match="GiB of memory") as info:
        check_model_dir(model)
    assert "MLP" in info.value.reason


@pytest.mark.parametrize(
    "model_type",
    ["llama", "llama-tied", "mixtral", "qwen2_moe", "gpt2"],
)
def test_weight_count_matches_the_model_transformers_builds(model_type: str) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    from qnn_common.torchio.hf_config import weight_count

    small = {"vocab_size": 300, "num_hidden_layers": 2, "num_attention_heads": 4}
    table: dict[str, dict[str, Any]] = {
        "llama": {"hidden_size": 64, "intermediate_size": 96, "num_key_value_heads": 2,
                  "head_dim": 32, "tie_word_embeddings": False},
        "llama-tied": {"hidden_size": 64, "intermediate_size": 96, "tie_word_embeddings": True},
        "mixtral": {"hidden_size": 64, "intermediate_size": 96, "num_key_value_heads": 2,
                    "num_local_experts": 8, "num_experts_per_tok": 2},
        "qwen2_moe": {"hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 48,
                      "num_experts": 6, "num_experts_per_tok": 2, "num_key_value_heads": 4,
                      "shared_expert_intermediate_size": 48, "tie_word_embeddings": False},
        "gpt2": {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 32},
    }
    fields = table[model_type]
    kind = model_type.removesuffix("-tied")
    config = {"model_type": kind, **small, **fields}
    built = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    actual = sum(p.numel() for p in built.parameters())
    counted = weight_count(config)
    assert 0.9 * actual <= counted <= 1.05 * actual, (counted, actual)


# --- 9. a tokenizer that does not load -----------------------------------------------------------


def test_a_corrupt_tokenizer_json_is_refused_at_prepare(tmp_path: Path) -> None:
    model = tiny_decoder_dir(tmp_path / "m")
    tokenizer = model / "tokenizer.json"
    tokenizer.write_bytes(tokenizer.read_bytes()[:300])  # truncated mid-file
    out = tmp_path / "out"
    done = _pipeline("--model", str(model), "--out", str(out), "--stop-after", "prepare")
    line = _one_error_line(done)
    assert "tokenizer.json" in line and "does not load" in line, line


def test_a_corrupt_tokenizer_json_is_refused_by_the_encoder_loader(tmp_path: Path) -> None:
    from qnn_prepare.hf_dir import open_hf_dir

    model = tiny_decoder_dir(tmp_path / "m")
    (model / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ArtifactError, match="does not load") as info:
        open_hf_dir(model, name="m", seed=0)
    assert info.value.path == model / "tokenizer.json"


def test_a_directory_without_tokenizer_files_still_exports_byte_ids(tmp_path: Path) -> None:
    from qnn_prepare.hf_dir import read_tokenizer

    model = tiny_decoder_dir(tmp_path / "m")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).unlink()
    assert read_tokenizer(model) is None


# --- 4. template and prompt sizes ----------------------------------------------------------------


def test_a_huge_chat_template_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """What `qnn-infer A --prompt Hi --chat` loads: a 64 MiB chat_template.jinja in tokenizer/."""
    from qnn_infer.families.causal_lm import load_tokenizer

    artifact = tmp_path / "artifact"
    tiny_decoder_dir(artifact / TOKENIZER_DIR)
    template = artifact / TOKENIZER_DIR / "chat_template.jinja"
    with template.open("w", encoding="utf-8") as file:
        for _ in range(64):
            file.write("{{ 'x' }}" * (2**20 // 9 + 1))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ArtifactError, match="MiB") as info:
        load_tokenizer(artifact)
    assert info.value.path == template
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 32, f"refusing the template grew this process by {grown_mib:.0f} MiB"


def test_a_large_template_in_tokenizer_config_is_refused_before_rendering(tmp_path: Path) -> None:
    """A template inside tokenizer_config.json (bounded as JSON, at 16 MiB) is bounded again
    before Jinja parses it."""
    from qnn_common.torchio.chat_template import render_chat_prompt
    from qnn_infer.families.causal_lm import load_tokenizer

    artifact = tmp_path / "artifact"
    tiny_decoder_dir(artifact / TOKENIZER_DIR)
    edit_json(artifact / TOKENIZER_DIR / "tokenizer_config.json",
              chat_template="{# " + "x" * (3 * 2**20) + " #}{{ messages[0].content }}")
    tokenizer = load_tokenizer(artifact)
    with pytest.raises(ArtifactError, match="the chat template is 3.0 MiB"):
        render_chat_prompt(tokenizer, "Hi", Path(TOKENIZER_DIR))


def test_a_huge_prompt_is_refused_before_tokenizing() -> None:
    from qnn_common.llm_spec import GenerationConfig

    with pytest.raises(ConfigValidationError, match="MiB") as info:
        GenerationConfig(prompt="word " * (2**20))
    assert len(str(info.value)) < 300, "the message must not repeat the prompt"


def test_a_40mb_toml_prompt_is_one_error_line_under_a_memory_limit(tmp_path: Path) -> None:
    """The issue's case: `--config` with a 40 MB prompt, the pipeline under an address space
    limit (the prompt was tokenized whole, then the process aborted: exit 134). 6 GiB, not less:
    importing torch and its CPU kernels reserves several GiB of address space before a byte of
    the file is read."""
    config = tmp_path / "pipeline.toml"
    with config.open("w", encoding="utf-8") as file:
        file.write('[pipeline]\nmodel = "tiny-llama"\nstop_after = "prepare"\n'
                   f'out = "{tmp_path / "out"}"\n[infer.generation]\nprompt = """')
        for _ in range(40):
            file.write("Once upon a time " * (2**20 // 17))
        file.write('"""\n')
    from qnn_pipeline import cli

    limit = ("import resource, runpy, sys; "
             "resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30)); ")
    done = subprocess.run(
        [sys.executable, "-c", limit + f"sys.argv = ['x', '--config', {str(config)!r}]; "
         f"runpy.run_module({cli.__name__!r}, run_name='__main__')"],
        env=child_env(), text=True, capture_output=True, timeout=300, check=False,
    )
    line = _one_error_line(done)
    assert str(config) in line and "MiB" in line, line[:3000]
    assert len(line) < 1000, f"the error line is {len(line):,} characters"


def test_a_long_bad_value_is_shown_by_its_start() -> None:
    """A 40 MB value in a config's unknown key was printed whole, as one 40 MB error line."""
    err = ConfigValidationError("infer.prompt", "x" * 40_000_000, "unknown key")
    assert len(str(err)) < 400 and "40,000,002 characters" in str(err)


def test_a_toml_just_under_the_bound_still_reads_and_its_prompt_is_bounded(
    tmp_path: Path
) -> None:
    from qnn_pipeline.context import load_pipeline_toml

    config = tmp_path / "pipeline.toml"
    config.write_text('[pipeline]\nmodel = "tiny-llama"\n[infer.generation]\nprompt = """'
                      + "word " * (300_000) + '"""\n', encoding="utf-8")
    with pytest.raises(ConfigValidationError, match="prompt"):
        load_pipeline_toml(config)


def test_weights_that_do_not_match_the_config_are_one_message(tmp_path: Path) -> None:
    """A hidden size changed after saving: well-formed, so only loading the weights shows it
    (transformers' RuntimeError said only "look at the above report")."""
    from qnn_prepare.causal_lm.export import load_causal_lm

    model = _with_config(tmp_path, hidden_size=60, num_attention_heads=4)
    with pytest.raises(ArtifactError, match="do not match what config.json describes"):
        load_causal_lm(str(model))
