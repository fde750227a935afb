"""What every CLI shares: logging, and turning our errors into one line and an exit code."""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Callable, Sequence

from qnn_common.errors import PipelineError

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130


def add_logging_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")


def setup_logging(verbose: bool = False, quiet: bool = False) -> None:
    """Log to stderr; silence one torch deprecation that floods every export / load."""
    if not verbose:
        # torch 2.13's own pytree pickling triggers it on every (de)serialization; not ours to fix.
        warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)-5s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )


def run_cli(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None) -> int:
    """Run a CLI body; a PipelineError becomes `error: <message>` on stderr and exit code 2.

    Anything else is a bug and keeps its traceback.
    """
    try:
        return main(argv)
    except PipelineError as err:
        where = f"[{err.stage}] " if err.stage and not str(err).startswith(f"[{err.stage}]") else ""
        print(f"error: {where}{err}", file=sys.stderr)
        cause = err.__cause__
        if cause is not None:
            print(f"  caused by {type(cause).__name__}: {cause}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted; no partial artifact was sealed", file=sys.stderr)
        return EXIT_INTERRUPTED
