"""Seeded config.json mutations of a tiny checkpoint, and a child that runs the pipeline on each.

`mutations` draws, from a seed, cases that change one or two fields of tiny-llama's config.json
to what a hostile or careless file holds: wrong types (floats, strings, lists, objects), nulls,
zero, negative and huge numbers, heads that disagree with the hidden size or each other, odd
`auto_map`s, a field deleted. Run as a module (`python -m support.config_fuzz CASES.json`), it
is the child process that runs `qnn-pipeline --model DIR --prompt ... --stop-after prepare`'s
main() in process on each case directory, one after another (one interpreter: the imports are
paid once), and prints one JSON line per case: the exit code, or "traceback" / "hang" with what
escaped, and stderr's `error:` lines.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import signal
import sys
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import Any

DELETE = "<delete>"
FIELDS = (
    "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "vocab_size", "max_position_embeddings", "rms_norm_eps", "model_type",
    "auto_map", "eos_token_id", "bos_token_id", "pad_token_id", "tie_word_embeddings",
    "rope_parameters", "architectures", "hidden_act", "dtype", "attention_bias",
)
VALUES: tuple[Any, ...] = (
    None, -1, 0, 1, 3, 2.0, 2.5, "2", "", 10**12, 2**63, 1e308, True, [], {}, [1, 2],
    {"a": 1}, "llama", DELETE,
)
AUTO_MAPS: tuple[Any, ...] = (
    None, "", [], {}, "x.Y", 5, {"AutoConfig": None}, ["a", "b"], {"AutoModel": ["m.C", None]},
)
# Heads against hidden size (64) and each other (4 heads, 2 key-value heads, head_dim 16).
INCONSISTENT: tuple[dict[str, Any], ...] = (
    {"num_attention_heads": 5}, {"num_key_value_heads": 3}, {"hidden_size": 60},
    {"num_key_value_heads": 8}, {"head_dim": 7}, {"num_attention_heads": 64, "head_dim": 1},
    {"hidden_size": 65_536, "num_hidden_layers": 1024},
)
HANG_S = 60  # per case; a tiny-llama prepare takes about 10 s


def mutations(seed: int, count: int) -> list[dict[str, Any]]:
    """`count` cases, each a {field: new value (or DELETE)} to apply to config.json."""
    rng = random.Random(seed)
    cases: list[dict[str, Any]] = []
    while len(cases) < count:
        kind = rng.random()
        if kind < 0.15:
            case = {"auto_map": rng.choice(AUTO_MAPS)}
        elif kind < 0.35:
            case = dict(rng.choice(INCONSISTENT))
        else:
            case = {rng.choice(FIELDS): rng.choice(VALUES) for _ in range(rng.choice((1, 1, 2)))}
        if case not in cases:
            cases.append(case)
    return cases


def apply(config_file: Path, case: dict[str, Any]) -> None:
    config = json.loads(config_file.read_text(encoding="utf-8"))
    for field, value in case.items():
        if value == DELETE:
            config.pop(field, None)
        else:
            config[field] = value
    config_file.write_text(json.dumps(config), encoding="utf-8")


class _Hang(BaseException):
    """Raised by the alarm in a case that ran past HANG_S (not an Exception: nothing catches it)."""


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise _Hang


def _run(model: Path, out: Path) -> dict[str, Any]:
    from qnn_pipeline.cli import main

    err = io.StringIO()
    started = time.monotonic()
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(HANG_S)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code: int | str = main(["--model", str(model), "--out", str(out), "--prompt", "Hi",
                                    "--max-new-tokens", "2", "--stop-after", "prepare", "-q"])
        escaped = ""
    except _Hang:
        code, escaped = "hang", ""
    except BaseException:  # what the CLI let escape: a traceback a user would see
        code, escaped = "traceback", traceback.format_exc()[-2000:]
    finally:
        signal.alarm(0)
    lines = err.getvalue().splitlines()
    return {
        "code": code, "escaped": escaped, "seconds": round(time.monotonic() - started, 1),
        "errors": [line for line in lines if line.startswith("error:")],
        "traceback": any("Traceback" in line for line in lines),
    }


def main(cases_file: Path) -> None:
    """Run each case directory listed in `cases_file` ([[model dir, out dir], ...])."""
    for model, out in json.loads(cases_file.read_text(encoding="utf-8")):
        print(json.dumps(_run(Path(model), Path(out))), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
