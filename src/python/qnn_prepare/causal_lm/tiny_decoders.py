"""The built-in tiny decoders (`tiny-llama`, `tiny-qwen`): shapes, shipped weights, byte tokenizer.

Small enough for CI, architecture-exact (real transformers classes), and trained: each ships
weights fitted to the packaged public-domain text (next-byte prediction, `train`), so their
logits have the confident margins of a real language model. A random-weight decoder's logits are
nearly flat, which makes argmax agreement after quantization a coin toss that says nothing about
the pipeline (measured on random tiny-llama, QNN 16a4w fake quant: 0.69-0.91 over runs that
differed only in the evaluation windows). Regenerate the weights with
``python -m qnn_prepare.causal_lm.tiny_decoders --out src/python/qnn_prepare/data`` (seeded; about
15 s).
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qnn_common.errors import ArtifactError, ConfigValidationError

TINY_CONTEXT = 128  # max_position_embeddings of the built-in tiny decoders
TINY_DECODERS: dict[str, str] = {
    "tiny-llama": "Llama decoder (2 layers, hidden 64, byte vocab), trained on the shipped text",
    "tiny-qwen": "Qwen2 decoder (2 layers, hidden 64, byte vocab), trained on the shipped text",
}
VOCAB = 257  # 256 bytes + end of text
EOS_ID = 256
_EOS = "<|endoftext|>"
TEXT_RESOURCE = "data/calibration_text.txt"
# Training steps: enough for the margins of a real byte-level LM (0.84 and 1.17 nats per byte on
# the text; uniform is 5.55), short of memorizing it outright (0.16 nats after 500 steps).
STEPS = 250


def text_bytes() -> bytes:
    """The shipped public-domain text (Alice's Adventures in Wonderland, ch. 1)."""
    return importlib.resources.files("qnn_prepare").joinpath(TEXT_RESOURCE).read_bytes()


def weights_resource(name: str) -> str:
    """Package-data path of a built-in decoder's trained weights."""
    return f"data/{name}.safetensors"


def byte_tokenizer() -> Any:
    """A byte-level BPE tokenizer without merges: 256 byte tokens plus an end-of-text token.

    Written as tokenizer.json and loaded by transformers, which keeps the `tokenizers` package
    (a dependency of transformers, not of this project) out of our imports.
    """
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    vocab[_EOS] = EOS_ID
    spec: dict[str, Any] = {
        "version": "1.0", "truncation": None, "padding": None, "normalizer": None,
        "post_processor": None,
        "added_tokens": [{"id": EOS_ID, "content": _EOS, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tokenizer.json"
        path.write_text(json.dumps(spec), encoding="utf-8")
        return PreTrainedTokenizerFast(tokenizer_file=str(path), eos_token=_EOS, pad_token=_EOS)


def build_tiny_decoder(name: str, seed: int = 1126) -> nn.Module:
    """A built-in decoder with seeded random weights (the starting point of `train`)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    shape: dict[str, Any] = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=TINY_CONTEXT,
        eos_token_id=EOS_ID, pad_token_id=EOS_ID,
    )
    torch.manual_seed(seed)
    model: nn.Module
    if name == "tiny-llama":
        model = LlamaForCausalLM(LlamaConfig(**shape))
        return model
    if name == "tiny-qwen":
        model = Qwen2ForCausalLM(Qwen2Config(**shape))
        return model
    raise ConfigValidationError(
        "model", name, "not a built-in decoder", allowed=tuple(TINY_DECODERS)
    )


def save_tiny_decoder(
    name: str, directory: Path, seed: int = 1126, *, trained: bool = True
) -> Path:
    """Write a built-in decoder as a HF directory: its shipped trained weights (or, with
    ``trained=False``, seeded random ones) and the byte tokenizer."""
    model = build_tiny_decoder(name, seed)
    if trained:
        # A dependency of transformers (its weight format), hence in every resolve that has it.
        from safetensors.torch import load  # pants: no-infer-dep

        resource = importlib.resources.files("qnn_prepare").joinpath(weights_resource(name))
        try:
            state = load(resource.read_bytes())
            model.load_state_dict(state, strict=False)  # tied lm_head is not stored twice
        except (OSError, RuntimeError, ValueError) as err:
            raise ArtifactError(
                Path(str(resource)),
                f"the shipped weights of {name} do not load ({err}); reinstall qnn-prepare or "
                "regenerate them with `python -m qnn_prepare.causal_lm.tiny_decoders`",
            ) from err
    model.save_pretrained(directory)  # type: ignore[operator]  # PreTrainedModel method
    byte_tokenizer().save_pretrained(directory)
    return directory


def save_tiny_llama(directory: Path, seed: int = 1126) -> Path:
    """Write a tiny Llama with seeded random weights and no tokenizer as a HF model directory:
    the shape of a bare checkpoint (vocab 256, context 64), for tests of that path."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=64,
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def next_byte_loss(model: nn.Module, data: torch.Tensor, length: int = 64) -> float:
    """Mean next-byte cross entropy (nats) of `model` over consecutive windows of `data`."""
    windows = data[: (len(data) - 1) // length * length + 1]
    inputs = windows[:-1].view(-1, length)
    targets = windows[1:].view(-1, length)
    with torch.no_grad():
        logits = model(input_ids=inputs, use_cache=False).logits
    return float(nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1)))


def train(name: str, *, steps: int = STEPS, seed: int = 1126, log_every: int = 100) -> nn.Module:
    """Fit a built-in decoder to the shipped text: next-byte prediction, AdamW, cosine decay,
    random windows of 64 bytes in batches of 32; deterministic for a seed on one machine."""
    data = torch.tensor(list(text_bytes()), dtype=torch.int64)
    model = build_tiny_decoder(name, seed).train()
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    length, batch = 64, 32
    for step in range(steps):
        lr = 3e-3 * 0.5 * (1 + math.cos(math.pi * step / steps))
        for group in optimizer.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, len(data) - length - 1, (batch,), generator=generator)
        window = torch.stack([data[s : s + length + 1] for s in starts.tolist()])
        logits = model(input_ids=window[:, :-1], use_cache=False).logits
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), window[:, 1:].reshape(-1))
        optimizer.zero_grad()
        torch.autograd.backward(loss)
        optimizer.step()
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(f"{name} step {step:4d} loss {loss.item():.3f}", flush=True)
    return model.eval()


def _tied(model: nn.Module) -> bool:
    """Whether the LM head shares the embedding's weight (then it is stored once)."""
    config: Any = model.config  # a PreTrainedModel's config
    return bool(config.tie_word_embeddings)


def main(argv: list[str] | None = None) -> int:
    """Regenerate the shipped weights.

    ``python -m qnn_prepare.causal_lm.tiny_decoders --out DIR``
    """
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--out", type=Path, required=True, help="directory for <name>.safetensors")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--seed", type=int, default=1126)
    parser.add_argument("--models", nargs="*", default=list(TINY_DECODERS))
    args = parser.parse_args(argv)
    from safetensors.torch import save_file  # pants: no-infer-dep

    # One thread: the model is tiny (threads only contend), and results repeat across machines.
    torch.set_num_threads(1)
    data = torch.tensor(list(text_bytes()), dtype=torch.int64)
    for name in args.models:
        model = train(name, steps=args.steps, seed=args.seed)
        state = {
            key: value.detach().contiguous()
            for key, value in model.state_dict().items()
            if key != "lm_head.weight" or not _tied(model)
        }
        args.out.mkdir(parents=True, exist_ok=True)
        save_file(state, str(args.out / f"{name}.safetensors"), metadata={"seed": str(args.seed)})
        print(f"{name}: next-byte loss {next_byte_loss(model, data):.3f} nats "
              f"(uniform: {math.log(VOCAB):.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
