"""Benchmark: which decoder architectures go through the pipeline with every setting at its default.

For each architecture of `ARCHITECTURES` (transformers' model types), a tiny seeded checkpoint
(2 layers, hidden 64, a 256-token byte vocabulary, no tokenizer; `from_config`) is written and run
through `qnn-pipeline --model DIR --prompt ...` with nothing else set but the backend / SoC /
recipe asked for, in this process:

    ./pants run bench/decoder_survey.py -- --json survey.json                 # XNNPACK 8a8w
    ./pants run bench/decoder_survey.py -- --backend qnn --soc SM8650 --recipe 16a8w

Each row: whether it generates, or where and why not (refused before any work, a stage that
failed, or a gate missed), and the program's next token against eager fp32 on the held-out
windows (KL divergence, same top token, and where fp32 decided). The JSON is rewritten after each
architecture, so a run that dies keeps what it measured; `--only` reruns some, keeping the
file's other rows.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from host import describe_host
from tables import render, survey_count

from qnn_common.errors import ConfigValidationError, PipelineError
from qnn_common.store.atomic import atomic_write_text
from qnn_pipeline.context import PipelineContext
from qnn_pipeline.orchestrator import run_pipeline

# Shared by every config below; a type's own names for the same sizes are in its overrides.
COMMON: dict[str, Any] = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
    "max_position_embeddings": 64, "head_dim": 16, "tie_word_embeddings": False,
    # Inside the byte vocabulary: some configs keep their parent's ids (Phi-3's pad is 32000).
    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
}
# transformers model type -> the config fields it needs besides COMMON (its own names for them,
# or what its defaults would make too big for a tiny checkpoint).
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {},
    "qwen2": {},
    "qwen3": {},
    "phi3": {},
    "phi": {"partial_rotary_factor": 0.5},
    "gemma": {},
    "gemma2": {"sliding_window": 16},
    "gemma3_text": {"sliding_window": 16},
    "granite": {"attention_multiplier": 0.05},
    "glm": {},
    "glm4": {},
    "smollm3": {},
    "olmo": {},
    "olmo2": {},
    "stablelm": {},
    "cohere": {},
    "starcoder2": {},
    "gpt_neox": {"num_key_value_heads": 4},  # no grouped-query attention: one per head
    "qwen3_moe": {"moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2},
    "gpt2": {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64,
             "num_key_value_heads": 4},
    "codegen": {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64, "n_ctx": 64,
                "rotary_dim": 8, "num_key_value_heads": 4},
}


def write_checkpoint(model_type: str, directory: Path, seed: int = 7) -> Path:
    """A seeded tiny `model_type` decoder as a Hugging Face directory."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.for_model(model_type, **{**COMMON, **ARCHITECTURES[model_type]})
    AutoModelForCausalLM.from_config(config).eval().save_pretrained(directory)
    return directory


def survey_one(model_type: str, work: Path, settings: dict[str, Any]) -> dict[str, Any]:
    """One architecture through the default pipeline: its row."""
    row: dict[str, Any] = {"architecture": model_type}
    t = time.perf_counter()
    try:
        model = write_checkpoint(model_type, work / model_type)
    except Exception as err:  # transformers' own refusal of the tiny config
        return {**row, "status": "no checkpoint", "reason": _first_line(err)}
    try:
        ctx = PipelineContext.create(
            str(model), out_dir=work / f"out-{model_type}", **settings,
            prepare={"max_seq_len": 32, "prefill_len": 8},
            infer={"generation": {"prompt": "Once upon a time", "max_new_tokens": 8}},
        )
        result = run_pipeline(ctx)
    except ConfigValidationError as err:
        return {**row, "status": "refused", "reason": _first_line(err),
                "seconds": round(time.perf_counter() - t, 1)}
    except PipelineError as err:
        stage = getattr(err, "stage", None)
        return {**row, "status": "failed", "stage": getattr(stage, "value", stage),
                "reason": _first_line(err), "seconds": round(time.perf_counter() - t, 1)}
    except Exception as err:  # a bug of ours or of a dependency: say which
        return {**row, "status": "error", "reason": _first_line(err),
                "where": traceback.format_exc().splitlines()[-3].strip(),
                "seconds": round(time.perf_counter() - t, 1)}
    summary = result.summary
    compiled = next((Path(s["artifact"]) for s in summary["stages"]
                     if s["name"] == "compile" and s.get("artifact")), None)
    if compiled is not None and (compiled / "model.pte").is_file():
        # Which attention export the default picked: ExecuTorch's custom ops, or the model's own.
        row["custom_ops"] = b"custom_sdpa" in (compiled / "model.pte").read_bytes()
    generation = summary.get("generation") or {}
    program = (generation.get("next_token") or {}).get("program") or {}
    decided = program.get("same_top_decided_percent") or {}
    row.update({
        "status": "gate missed" if result.gate_failure is not None else "generates",
        "reason": None if result.gate_failure is None else _first_line(result.gate_failure),
        "new_tokens": generation.get("new_tokens"),
        "kl_mean": (program.get("kl_divergence") or {}).get("mean"),
        "same_top_percent": program.get("same_top_percent"),
        "same_top_decided_percent": decided.get("value"),
        "sqnr_db_vs_eager": generation.get("sqnr_db_vs_eager"),
        "seconds": round(time.perf_counter() - t, 1),
    })
    return row


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:300]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="xnnpack")
    p.add_argument("--soc", help="for --backend qnn, e.g. SM8650")
    p.add_argument("--recipe", help="default: the backend's default")
    p.add_argument("--only", nargs="+", choices=sorted(ARCHITECTURES), help="these only")
    p.add_argument("--json", type=Path, help="write the rows here (after each architecture)")
    args = p.parse_args()
    settings: dict[str, Any] = {"backend": args.backend}
    if args.soc:
        settings["soc"] = args.soc
    if args.recipe:
        settings["recipe"] = args.recipe
    rows: list[dict[str, Any]] = []
    if args.only and args.json and args.json.is_file():
        # A rerun of some: the file's other rows stay, in the table's order.
        earlier = json.loads(args.json.read_text())
        if earlier.get("settings") != settings:
            raise SystemExit(f"{args.json} holds a survey with other settings: "
                             f"{earlier.get('settings')}")
        rows = [r for r in earlier["rows"] if r["architecture"] not in args.only]
    result: dict[str, Any] = {"bench": "decoder_survey", "host": describe_host(),
                              "date": time.strftime("%Y-%m-%d", time.gmtime()),
                              "settings": settings, "rows": rows}
    order = list(ARCHITECTURES)
    with tempfile.TemporaryDirectory(prefix="decoder-survey-") as tmp:
        for model_type in args.only or ARCHITECTURES:
            row = survey_one(model_type, Path(tmp), settings)
            rows.append(row)
            rows.sort(key=lambda r: order.index(r["architecture"]))
            print(f"{model_type}: {row['status']}" + (f" ({row['reason']})"
                                                      if row.get("reason") else ""), flush=True)
            if args.json:
                atomic_write_text(args.json, json.dumps(result, indent=1) + "\n")
    print(survey_count(result))
    print(render(result))


if __name__ == "__main__":
    main()
