"""Benchmark: what a recipe search costs (issue 53): `qnn-pipeline tune` run in its own process,
its wall time and peak RSS, with what it found (the candidates it verified, the winner, the
sensitivity pass's seconds) from its front.json.

    ./pants run bench/tune_bench.py -- --json tune.json -- --model smollm2-135m --max-kl 0.1 \\
        --max-seq-len 256
    ./pants run bench/tune_bench.py -- -- --model smollm2-135m --backend qnn --soc SM8650 \\
        --recipe 16a4w_block --max-kl 0.01 --max-seq-len 256 --tokens 256

Everything after `--` goes to `qnn-pipeline tune`; `--out` is the bench's own directory (a fresh
temporary one unless given, so nothing is taken from an earlier search's cache).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from host import describe_host
from stage_process import run_stage


def summary(front: dict[str, Any], seconds: float, peak_mb: float,
            tune_args: list[str]) -> dict[str, Any]:
    """The bench's record of one search from its front.json."""
    winner = front.get("winner")
    chosen = next(({k: v for k, v in c.items() if k != "artifact"}  # a path under --out
                   for c in front["candidates"] if c["promoted"] == winner), None)
    return {
        "host": describe_host(), "date": time.strftime("%Y-%m-%d"), "args": tune_args,
        "wall_s": round(seconds, 1), "peak_rss_mb": round(peak_mb, 1),
        "groups": len(front["plan"]["order"]), "cheap": front["plan"]["cheap"],
        "rich": front["plan"]["rich"], "tokens": front.get("tokens"),
        "sensitivity_s": front.get("sensitivity_seconds"),
        "verified": len(front["candidates"]), "winner": chosen,
        "program_bytes": front.get("program_bytes"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the record here too")
    parser.add_argument("--out", type=Path, help="the search's --out (default: a fresh one)")
    parser.add_argument("tune_args", nargs=argparse.REMAINDER,
                        help="-- then qnn-pipeline tune's arguments")
    args = parser.parse_args()
    tune_args = [a for a in args.tune_args if a != "--"]
    with tempfile.TemporaryDirectory(prefix="tune-bench-") as tmp:
        out = args.out or Path(tmp) / "out"
        seconds, peak = run_stage(["qnn_pipeline.cli", "tune", *tune_args, "--out", str(out)],
                                  Path(tmp) / "work")
        front = json.loads((out / "tune" / "front.json").read_text())
    record = {"bench": "tune", "rows": [summary(front, seconds, peak, tune_args)]}
    text = json.dumps(record, indent=2) + "\n"
    print(text, end="")
    if args.json is not None:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
