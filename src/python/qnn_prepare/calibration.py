"""Calibration samples: the inputs a post-training quantizer observes to pick activation ranges.

Sources, in `make_inputs` (and `make_calibration`):

* a ``.txt`` file: one sample per non-blank line, tokenized exactly like the example inputs
  (padding to the model's fixed length, truncating longer lines);
* a ``.pt`` file written by `save_samples` (or by hand): a list whose items are a tensor (one-input
  models), a tuple/list of the positional arguments, or ``{"args": ..., "kwargs": ...}``, each
  matching the example inputs in structure, dtype and shape (and in their non-tensor values,
  which torch.export baked into the program; see `qnn_common.torchio.samples.load_inputs`);
* nothing: text models with a tokenizer use `BUILTIN_SENTENCES`, real sentences of varied topic,
  length and form. Random token ids make activations no real input produces (no sentence
  structure, no [SEP] at the end of the text), so ranges calibrated on them fit real inputs
  worse. ``module:function`` models (kind "custom") get `example_samples`: their own example
  inputs, then seeded variations of their floating-point tensors with the same values and
  range (index tensors, masks and constants are kept as they are), because the example
  is the only thing known about what such a model's inputs look like (N(0, 1) noise for an
  input that lies in [2, 98] cost 29 dB). The other built-ins get seeded random inputs drawn
  like their examples: token ids below the vocabulary size with an all-ones attention mask, or
  standard normal floats.

`calibration_summary` says which of these was used, for the prepare manifest.

`make_inputs` gives each sample as `ModelInputs` (positional and keyword arguments, any
structure); `make_calibration` as the tuple of positional arguments, for models without keyword
arguments (every built-in, and most factories: see FACTORY_CONTRACT).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from qnn_common.errors import ArtifactError, ConfigValidationError
from qnn_common.torchio.samples import ModelInputs, Sample, as_model_inputs, load_inputs
from qnn_prepare.task import LoadedModel

# Varied English: questions, instructions, news, science, dialogue, lists and numbers, short and
# long, so that calibration sees both mostly-padding and nearly-full sequences.
BUILTIN_SENTENCES: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog.",
    "How do I reset my password if I no longer have access to my email?",
    "Stock markets fell sharply on Monday after the central bank raised interest rates "
    "by half a percentage point.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "Please turn off the lights and lock the door when you leave.",
    "She played a Bach partita on the violin at last night's concert.",
    "Thanks a lot, that was really helpful!",
    "The recipe calls for 2 cups of flour, 3 eggs, and a pinch of salt.",
    "Quantization reduces a neural network's memory footprint and speeds up inference on "
    "mobile phones.",
    "Is the museum open on public holidays?",
    "Heavy rain is expected across the northern region this weekend, with possible flooding "
    "near the river.",
    "My cat sleeps on the windowsill every afternoon.",
    "The committee approved the new budget after a long and heated debate.",
    "Error 404: the page you requested could not be found.",
    "Electric cars are becoming cheaper, but charging stations remain scarce in rural areas.",
    "What's the difference between a virus and a bacterium?",
)

_TXT_SUFFIXES = (".txt",)
_PT_SUFFIXES = (".pt", ".pth")


def make_calibration(
    model: LoadedModel,
    *,
    num_samples: int,
    source: Path | None,
    seed: int,
    include_example: bool = True,
) -> list[Sample]:
    """`make_inputs`, each sample as its tuple of positional arguments (`Sample`; a factory's
    model may nest structures and constants in it). Raises ConfigValidationError for a model
    that takes keyword arguments, whose samples only `make_inputs` can hold."""
    if model.example_kwargs:
        raise ConfigValidationError(
            "model", model.name,
            f"takes keyword arguments ({', '.join(model.example_kwargs)}); use make_inputs, whose "
            "samples carry them",
        )
    samples = make_inputs(
        model, num_samples=num_samples, source=source, seed=seed, include_example=include_example
    )
    return [tuple(s.args) for s in samples]


def make_inputs(
    model: LoadedModel,
    *,
    num_samples: int,
    source: Path | None,
    seed: int,
    include_example: bool = True,
) -> list[ModelInputs]:
    """`num_samples` inputs for `model`, from `source` (.txt or .pt) or built in (see module doc).

    A .txt file with fewer lines than `num_samples` gives one sample per line; a .pt file must
    hold at least `num_samples` samples (the first `num_samples` are used).
    `include_example=False` leaves the example inputs themselves out of `example_samples` (for
    held-out samples, which must differ from the example).
    """
    if num_samples < 1:
        raise ConfigValidationError(
            "calibration.num_samples", num_samples, "need at least one sample"
        )
    if source is None:
        kind = default_source(model)
        if kind == "builtin-sentences":
            return [ModelInputs(tokenize_like(model, t)) for t in _builtin_texts(num_samples, seed)]
        if kind == "example-range":
            return example_samples(
                model, num_samples=num_samples, seed=seed, include_example=include_example
            )
        return [ModelInputs(s) for s in random_samples(model, num_samples=num_samples, seed=seed)]

    source = Path(source)
    field = "calibration.source"
    if not source.is_file():
        raise ConfigValidationError(field, str(source), "file does not exist")
    suffix = source.suffix.lower()
    if suffix in _TXT_SUFFIXES:
        if model.tokenizer is None:
            raise ConfigValidationError(
                field,
                str(source),
                f"a text file needs a tokenizer and model {model.name!r} has none; give a .pt "
                "file of input tensors instead (see save_samples)",
            )
        try:
            lines = source.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigValidationError(field, str(source), f"cannot read it: {err}") from err
        texts = [line.strip() for line in lines if line.strip()]
        if not texts:
            raise ConfigValidationError(field, str(source), "the file has no non-blank lines")
        return [ModelInputs(tokenize_like(model, t)) for t in texts[:num_samples]]
    if suffix in _PT_SUFFIXES:
        try:
            samples = load_inputs(source, like=model.example)
        except ArtifactError as err:
            raise ConfigValidationError(field, str(source), err.reason) from None
        if len(samples) < num_samples:
            raise ConfigValidationError(
                field,
                str(source),
                f"holds {len(samples)} samples but num_samples is {num_samples}; lower "
                "num_samples or add samples",
            )
        return samples[:num_samples]
    raise ConfigValidationError(
        field,
        str(source),
        "unknown file type",
        allowed=tuple(f"*{s}" for s in (*_TXT_SUFFIXES, *_PT_SUFFIXES)),
    )


def default_source(model: LoadedModel) -> str:
    """What calibrates `model` without a file: "builtin-sentences", "example-range" or
    "random" (see the module doc)."""
    if model.tokenizer is not None and model.kind in ("text-encoder", "causal-lm"):
        return "builtin-sentences"
    if model.kind == "custom":
        return "example-range"
    return "random"


def example_samples(
    model: LoadedModel, *, num_samples: int, seed: int, include_example: bool = True
) -> list[ModelInputs]:
    """The example inputs (if `include_example`), then seeded variations of their floating-point
    tensors, whatever the structure holding them.

    Variations keep each float tensor's dtype, shape and range [min, max]: odd ones permute its
    elements (the same values), even ones add Gaussian noise at 10 % of its standard deviation,
    clipped to the range (the same structure, e.g. an image stays an image). Integer and bool
    tensors (indices, masks, lengths) and non-tensor values are kept as they are: their meaning
    is unknown, and e.g. index tensors permuted one by one can pair into duplicate positions,
    which make index_put's result depend on the backend's write order.
    """
    gen = torch.Generator().manual_seed(seed)
    example = model.example
    out: list[ModelInputs] = [example.clone()] if include_example else []
    k = 1
    while len(out) < num_samples:
        vary = functools.partial(_vary, permute=k % 2 == 1, gen=gen)
        # From a copy: the kept (non-float) values must not be the example's own objects.
        fresh = example.clone()
        varied = torch.utils._pytree.tree_map(vary, (fresh.args, dict(fresh.kwargs)))
        out.append(ModelInputs(tuple(varied[0]), varied[1]))
        k += 1
    return out


def _vary(value: object, permute: bool, gen: torch.Generator) -> object:
    if (
        not isinstance(value, torch.Tensor)
        or not value.is_floating_point()
        or value.numel() < 1
    ):
        return value
    flat = value.detach().reshape(-1)
    if permute:
        return flat[torch.randperm(flat.numel(), generator=gen)].reshape(value.shape).clone()
    wide = flat.to(torch.float64)
    noise = torch.randn(wide.shape, generator=gen, dtype=torch.float64) * 0.1 * wide.std(0)
    varied = (wide + noise.nan_to_num(0.0)).clamp(float(wide.min()), float(wide.max()))
    return varied.to(value.dtype).reshape(value.shape)


def calibration_summary(
    model: LoadedModel, samples: Sequence[Sample | ModelInputs], source: Path | None
) -> dict[str, Any]:
    """What calibrated `model`, for the prepare manifest's metrics: the source ("file",
    "builtin-sentences", "example-range" or "random"), how many samples, and each input
    tensor's dtype and the [min, max] the samples span. Inputs are named by `input_names` for
    flat models, else by their path in the structure (e.g. ``args[1][0]``, ``kwargs['mask']``)."""
    inputs: list[dict[str, Any]] = []
    names = list(model.input_names)
    if not model.example.is_flat():
        paths, _ = torch.utils._pytree.tree_flatten_with_path(
            {"args": tuple(model.example_inputs), "kwargs": dict(model.example_kwargs)}
        )
        names = [torch.utils._pytree.keystr(path).lstrip(".") for path, _ in paths]
        names = [n.replace("['args']", "args", 1).replace("['kwargs']", "kwargs", 1) for n in names]
    if samples:
        leaves = [as_model_inputs(s).leaves() for s in samples]
        columns = list(zip(*leaves, strict=True))
        for i, column in enumerate(columns):
            tensors = [t for t in column if isinstance(t, torch.Tensor) and t.numel() > 0]
            if not tensors or tensors[0].is_complex():
                continue
            lows = [float(t.min()) for t in tensors]
            highs = [float(t.max()) for t in tensors]
            name = names[i] if i < len(names) else f"input_{i}"
            inputs.append(
                {"input": name, "dtype": str(tensors[0].dtype).removeprefix("torch."),
                 "min": min(lows), "max": max(highs)}
            )
    summary: dict[str, Any] = {
        "source": "file" if source is not None else default_source(model),
        "samples": len(samples),
        "inputs": inputs,
    }
    if source is not None:
        summary["file"] = str(source)
    return summary


def tokenize_like(model: LoadedModel, text: str) -> Sample:
    """Tokenize `text` the way the model's example inputs were: fixed length, int64 tensors."""
    if model.tokenizer is None or model.seq_len is None:
        raise ConfigValidationError("model", model.name, "has no tokenizer to encode text")
    enc: Any = model.tokenizer(
        text,
        padding="max_length",
        truncation=True,
        max_length=model.seq_len,
        return_tensors="pt",
    )
    return tuple(enc[name].to(torch.int64) for name in model.input_names)


def random_samples(model: LoadedModel, *, num_samples: int, seed: int) -> list[Sample]:
    """Seeded random inputs shaped like the example inputs (see module doc for the rules)."""
    gen = torch.Generator().manual_seed(seed)
    out: list[Sample] = []
    for _ in range(num_samples):
        sample: list[torch.Tensor] = []
        for name, like in zip(model.input_names, model.example_inputs, strict=True):
            sample.append(_random_like(name, like, model.vocab_size, gen))
        out.append(tuple(sample))
    return out


def _random_like(
    name: str, like: torch.Tensor, vocab_size: int | None, gen: torch.Generator
) -> torch.Tensor:
    if like.is_floating_point():
        return torch.randn(like.shape, generator=gen, dtype=like.dtype)
    if like.dtype == torch.bool:
        return torch.randint(0, 2, like.shape, generator=gen).to(torch.bool)
    if name == "attention_mask":
        # All ones is always a valid mask; padding-free inputs also exercise every position.
        return torch.ones_like(like)
    if vocab_size is not None:
        low, high = 0, vocab_size
    else:
        # Unknown meaning (custom model): stay within the range the example itself uses.
        low, high = int(like.min()), int(like.max()) + 1
    return torch.randint(low, high, like.shape, generator=gen, dtype=like.dtype)


def _builtin_texts(num_samples: int, seed: int) -> list[str]:
    """The built-in sentences, then (if more are asked for) seeded pairs of them joined.

    Pairs are longer than any single sentence, so extra samples also cover later positions
    instead of repeating what was already observed.
    """
    texts = list(BUILTIN_SENTENCES[:num_samples])
    rng = random.Random(seed)
    while len(texts) < num_samples:
        a, b = rng.sample(BUILTIN_SENTENCES, 2)
        texts.append(f"{a} {b}")
    return texts
