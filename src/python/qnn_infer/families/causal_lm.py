"""Infer for a causal-LM .pte: teacher-forced logits against the references, then generation.

The eval texts travel with the artifact (token sequences) together with the eager HF model's
logits on them (fp32) and the fake-quantized program's: feeding each text through the .pte gives
logits at every position, compared with `qnn_common.numerics.metrics.logits_accuracy` (SQNR,
cosine and argmax agreement), and the perplexity of the texts under each of the three; the
fake-quantized model and the program are also compared with eager fp32 next token by next token
(`qnn_common.numerics.lm_metrics`: KL divergence, same top token, perplexity intervals). Then the
program generates from the prompt, timed. `run` is infer for this family (`qnn_infer.families`).
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from qnn_common.artifact import Artifact
from qnn_common.causal_lm.steps import SinkTable, feed, teacher_forced_logits, without_sink
from qnn_common.causal_lm.tables import rope_of, sink_of
from qnn_common.cli.noise import native_noise_filtered
from qnn_common.config import InferConfig
from qnn_common.errors import ArtifactError, ConfigValidationError
from qnn_common.llm_spec import DECODE, PREFILL, GenerationConfig, LlmSpec
from qnn_common.manifest import Manifest
from qnn_common.numerics.lm_metrics import compare_next_tokens, perplexity, perplexity_interval
from qnn_common.numerics.metrics import logits_accuracy
from qnn_common.recipes import Backend
from qnn_common.reports import InferReport
from qnn_common.sealing import load_manifest
from qnn_common.stages import (
    EVAL_INPUTS,
    PTE,
    REFERENCE_FAKE_QUANT,
    REFERENCE_FP32,
    TOKENIZER_DIR,
    InferInput,
    compiled_for,
    llm_spec_of,
)
from qnn_common.store.artifact_dir import begin_artifact
from qnn_common.torchio.chat_template import render_chat_prompt
from qnn_common.torchio.hf_untrusted import HF_LOAD, refuse_custom_code
from qnn_common.torchio.samples import load_samples
from qnn_infer.families import single
from qnn_infer.gate_check import judge_accuracy
from qnn_infer.generate import Generation, PteLm, generate, prompt_rest_decode_up_to
from qnn_infer.isolation import Rehearsal, Step, rehearse_unless_compiled_here
from qnn_infer.profile import PROFILE_JSON, PROFILE_MD, Profile, write_method_profiles
from qnn_infer.profile import summary as profile_summary
from qnn_infer.program_check import check_program_matches
from qnn_infer.pte import check_pte_header
from qnn_infer.runtimes import delegates_in, prepare_runtime, set_cpu_threads
from qnn_infer.sealing import seal

log = logging.getLogger(__name__)


def load_tokenizer(artifact: Path) -> Any | None:
    """The artifact's tokenizer (from its tokenizer/ files), or None if it carries none."""
    directory = artifact / TOKENIZER_DIR
    if not (directory / "tokenizer.json").is_file() and not (
        directory / "tokenizer.model"
    ).is_file():
        return None
    refuse_custom_code(directory)  # an artifact's files are data: none may run code
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(directory), **HF_LOAD)
    except (OSError, ValueError) as err:
        raise ArtifactError(directory, f"cannot load the tokenizer ({err})") from err


def prompt_ids(tokenizer: Any | None, cfg: GenerationConfig, spec: LlmSpec) -> list[int]:
    """The prompt's token ids (through the chat template with `cfg.chat`)."""
    if tokenizer is None:
        return [b % spec.vocab_size for b in cfg.prompt.encode("utf-8")]
    if cfg.chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ArtifactError(
                Path(TOKENIZER_DIR), "the tokenizer has no chat template; drop --chat"
            )
        text = render_chat_prompt(tokenizer, cfg.prompt, Path(TOKENIZER_DIR))
        # What apply_chat_template(tokenize=True) does with the text: the template has put the
        # special tokens in already.
        ids = [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]
    else:
        ids = [int(i) for i in tokenizer(cfg.prompt, add_special_tokens=False)["input_ids"]]
    # A prompt opening with the attention sink's token (every chat template's conversation does)
    # starts after it, as the float model reads it.
    return without_sink(ids, spec)


def program_logits(compiled: Path) -> list[torch.Tensor]:
    """A compile artifact's causal LM run teacher-forced on its eval texts, prefill then decode
    as generation calls them (the QNN SDK made ready first for an HTP program): its logits per
    text. For comparing programs (shard counts, a resumed compile) in tests and benches."""
    lm, spec, _ = open_program_lm(compiled)
    texts = [sample[0] for sample in load_samples(compiled / EVAL_INPUTS)]
    return teacher_forced_logits(lm.prefill, lm.decode, texts, spec)


def open_program_lm(compiled: Path) -> tuple[PteLm, LlmSpec, Backend]:
    """A compile artifact's causal LM program, its spec and its backend, the runtime made ready
    first (the QNN SDK for an HTP program); the caller closes the PteLm."""
    manifest = load_manifest(compiled)
    spec = llm_spec_of(compiled, manifest)
    if spec is None:
        raise ArtifactError(compiled, "holds no causal LM (prefill and decode) to run")
    target, _ = compiled_for(compiled, manifest)
    prepare_runtime(delegates_in(compiled / PTE))
    lm = PteLm(compiled / PTE, spec, rope_of(compiled, manifest), sink_of(compiled, manifest))
    return lm, spec, target.backend


def teacher_forced_accuracy(
    lm: PteLm, artifact: Path, spec: LlmSpec, have: set[str]
) -> dict[str, Any]:
    """logits_accuracy of the .pte vs fp32 (eager HF) and vs fake quant, where carried."""
    if EVAL_INPUTS not in have:
        return {}
    texts = [s[0] for s in load_samples(artifact / EVAL_INPUTS)]
    logits = teacher_forced_logits(lm.prefill, lm.decode, texts, spec)
    accuracy: dict[str, Any] = {}
    ids = [t.numpy() for t in texts]
    program = [x.numpy() for x in logits]
    ppl = {"program": perplexity(program, ids)}
    references: dict[str, list[Any]] = {}
    for key, name, who in (
        ("vs_fp32", REFERENCE_FP32, "fp32"), ("vs_fake_quant", REFERENCE_FAKE_QUANT, "fake_quant"),
    ):
        if name in have:
            references[who] = [s[0].numpy() for s in load_samples(artifact / name)]
            accuracy[key] = logits_accuracy(references[who], program)
            ppl[who] = perplexity(references[who], ids)
    if "fp32" in references:
        accuracy["next_token"] = next_token_record(references, program, ids)
    # Of the held-out eval texts (prepare), next token by next token: the model's own figure of
    # merit, which logits' SQNR is not (a tied LM head's error can cost little perplexity).
    accuracy["perplexity"] = {
        **{k: round(v, 4) for k, v in ppl.items()},
        "tokens": sum(max(0, int(t.numel()) - 1) for t in texts),
        **({"vs_fp32": round(ppl["program"] / ppl["fp32"] - 1, 5)} if "fp32" in ppl else {}),
    }
    return accuracy


def next_token_record(
    references: dict[str, list[Any]], program: list[Any], ids: list[Any]
) -> dict[str, Any]:
    """The fake-quantized model (where carried) and the program against eager fp32 on the eval
    windows, as llama.cpp's `--kl-divergence` scores a quantization: KL divergence, same top
    token (with the float model's margin where they differ), perplexity with bootstrap intervals
    over the windows (few windows make wide ones: the figures say how few)."""
    fp32 = references["fp32"]
    candidates = {"fake_quant": references.get("fake_quant"), "program": program}
    return {
        "reference": "fp32",
        "windows": len(ids),
        "fp32": {"perplexity": perplexity_interval(fp32, ids).to_json()},
        **{who: compare_next_tokens(fp32, logits, ids).to_json()
           for who, logits in candidates.items() if logits is not None},
    }


def run_generation(
    lm: PteLm, artifact: Path, spec: LlmSpec, cfg: GenerationConfig, backend: Backend
) -> Generation:
    """Tokenize the prompt, generate, and decode the new tokens to text."""
    tokenizer = load_tokenizer(artifact)
    ids = prompt_ids(tokenizer, cfg, spec)

    def decode_text(tokens: list[int]) -> str:
        if tokenizer is None:
            return bytes(t % 256 for t in tokens).decode("utf-8", errors="replace")
        text: str = tokenizer.decode(tokens, skip_special_tokens=True)
        return text

    # The QNN emulator's runtime writes [INFO] lines to fd 2 on every call; held for the whole
    # generation (not per call: that would cost each token a redirect), so the streamed text
    # reads as one; anything else it wrote follows it.
    up_to = prompt_rest_decode_up_to(cfg, backend)
    with native_noise_filtered():
        result = generate(lm.prefill, lm.decode, ids, cfg, spec, decode_text, decode_up_to=up_to)
    log.info(
        "generated %d token(s): ttft %.1f ms, prefill %.1f tok/s, decode %.1f tok/s",
        len(result.tokens), result.ttft_ms, result.prefill_tokens_per_s,
        result.decode_tokens_per_s,
    )
    return result


def generation_latency(generation: Generation) -> dict[str, float]:
    """Latency figures of a causal LM for the manifest: per decoded token, and to first token."""
    per_token = 1000 / generation.decode_tokens_per_s if generation.decode_tokens_per_s else 0.0
    return {"ttft": round(generation.ttft_ms, 3), "decode_per_token": round(per_token, 3)}


def run(
    inp: InferInput, upstream: Manifest | None, pte: Path, have: set[str]
) -> Artifact:
    """Teacher-forced logits vs the references, then a timed generation; a causal LM exported
    without a KV cache (no LLM record, one logits method) runs as any one-method program."""
    cfg: InferConfig = inp.config
    spec = None if upstream is None else llm_spec_of(inp.source.path, upstream)
    if spec is None:
        return single.run(inp, upstream, pte, have)
    assert upstream is not None  # family_for picks this family from the artifact's record
    if cfg.device is not None or cfg.inputs_file is not None or (cfg.etdump and not cfg.profile):
        raise ConfigValidationError(
            "infer", "causal-lm",
            "a causal-LM program runs on the host from its eval texts and a prompt; "
            "drop --device / --inputs / --etdump (--profile traces a decode step and a prefill "
            "window, each method in a table of its own)",
        )
    target, recipe = compiled_for(inp.source.path, upstream)
    check_program_matches(inp.source.path, upstream)
    if upstream.config.get("weight_sharing"):
        raise ConfigValidationError(
            "infer", str(inp.source.path),
            "this program's methods share one copy of their weights (compiled with "
            "--weight-sharing), which only a device loads: the x86 HTP emulator refuses it (QNN: "
            "\"Shared weights buffer isn't supported on this platform\"); compile without "
            "--weight-sharing to run the program here",
        )
    runtime = prepare_runtime({target.backend})
    generation_cfg = cfg.generation or GenerationConfig()
    threads = set_cpu_threads(cfg.threads)
    rope, sink = rope_of(inp.source.path, upstream), sink_of(inp.source.path, upstream)
    check_pte_header(pte)
    rehearse_unless_compiled_here(pte, inp.source.pte_sha256, _generating(pte, spec, rope, sink))
    out = begin_artifact(inp.out_dir, inputs=[inp.source.path])
    lm = PteLm(pte, spec, rope, sink)
    try:
        t = time.perf_counter()
        accuracy = teacher_forced_accuracy(lm, inp.source.path, spec, have)
        check_s = time.perf_counter() - t
        generation = run_generation(lm, inp.source.path, spec, generation_cfg, target.backend)
    finally:
        lm.close()
    profiles = (_profile_methods(pte, spec, rope, sink, out, cfg.runs) if cfg.profile else {})
    verdict = judge_accuracy(accuracy, cfg.gates_for(recipe, causal_lm=True), recipe)
    manifest = seal(
        out, inp, [PROFILE_MD, PROFILE_JSON] if profiles else [], {"run_s": check_s},
        extra_tools=runtime.tools,
        program=upstream.program,
        metrics=InferReport(
            model=upstream.metrics.get("model"),
            runner="host",
            threads=threads,
            samples=(len(load_samples(inp.source.path / EVAL_INPUTS))
                     if EVAL_INPUTS in have else 0),
            latency_ms=generation_latency(generation),
            accuracy=accuracy,
            accuracy_gates=verdict,
            generation=generation.to_json(),
            profile={m: profile_summary(p) for m, p in profiles.items()} or None,
        ).to_metrics(),
    )
    return Artifact(inp.out_dir, manifest)  # the verdict is in it: gate_check.gate_failure


def _profile_methods(
    pte: Path, spec: LlmSpec, rope: tuple[torch.Tensor, torch.Tensor] | None,
    sink: SinkTable | None, out: Path, runs: int,
) -> dict[str, Profile]:
    """--profile: `runs` decode steps, then `runs` prefill windows, each method traced by a
    runtime of its own (one ETDump per method, so a table's shares are of that method's time),
    on pad tokens from position 0: what a step costs does not depend on the token."""
    etdumps: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix=".profile.", dir=out) as tmp:
        for method in (DECODE, PREFILL):
            traced = PteLm(pte, spec, rope, sink, trace=True)
            try:
                for i in range(min(runs, spec.context - spec.prefill_len)):
                    if method == DECODE:
                        traced.decode(torch.tensor([[spec.pad_token_id]]), torch.tensor([i]))
                    else:
                        traced.prefill(torch.full((1, spec.prefill_len), spec.pad_token_id),
                                       torch.arange(spec.prefill_len))
                etdumps[method] = Path(tmp) / method / "etdump"
                etdumps[method].parent.mkdir()
                traced.write_etdump(etdumps[method])
            finally:
                traced.close()
        profiles = write_method_profiles(etdumps, out, pte.name)
    for method, profile in profiles.items():
        log.info("profile of %s: Method::execute %.3f ms per traced run (%s)", method,
                 profile.execute_ms, out / PROFILE_MD)
    return profiles


# What the runtime does first with a program this process did not compile, rehearsed in a child
# (qnn_infer.isolation): the same loads and the same inputs as the run that follows.


def _generating(
    pte: Path, spec: LlmSpec, rope: tuple[torch.Tensor, torch.Tensor] | None,
    sink: SinkTable | None,
) -> Rehearsal:
    """A causal LM: load both methods, then one prefill window and one decode step."""

    def rehearsal(step: Step) -> None:
        step("loading it")
        lm = PteLm(pte, spec, rope, sink)
        step("running prefill and decode")
        tokens = [spec.pad_token_id] * min(spec.prefill_len + 1, spec.context)
        feed(lm.prefill, lm.decode, tokens, 0, spec)

    return rehearsal
