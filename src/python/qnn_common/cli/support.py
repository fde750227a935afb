"""What every CLI shares: logging, path checks, and turning failures into one line and an exit code.

Exit codes, the same for every command: 0 done; 2 an error (one `error:` line on stderr, with the
path when a file is involved; accuracy gates missed also exit 2); 130 interrupted by Ctrl-C
(SIGINT); 143 terminated by SIGTERM. Both signals unwind the same way: temporary files are deleted
and no partial artifact is sealed.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType, TracebackType

from qnn_common.cli.noise import quiet_third_party
from qnn_common.errors import ConfigValidationError, PipelineError, StageError
from qnn_common.store.artifact_dir import cleans_up_artifacts

log = logging.getLogger(__name__)

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM, what a shell reports for a process SIGTERM killed
EXIT_CODES_HELP = (
    "exit codes: 0 done; 2 error (one `error:` line) or accuracy gate missed; 130 interrupted "
    "(Ctrl-C); 143 terminated (SIGTERM). Interrupted runs delete their temporary files and seal "
    "no partial artifact."
)

# Room under an output directory for what the stages put there: a staging directory beside
# "<stage>-<12 hex>" (".prepare-0123456789ab.staging-abcd1234") holding temp names such as
# ".reference_fake_quant.<pid>.abcd1234.tmp.pt" (see artifact_dir and atomic.atomic_path).
_OUTPUT_ROOM = 128

_OS_HINTS = {
    errno.ENOTDIR: "part of this path is a file, not a directory; pick another path",
    errno.EEXIST: "it exists and is not a directory; pick another path",
    errno.EACCES: "no permission; pick a directory you can write",
    errno.EPERM: "pick a directory you can write",
    errno.ENAMETOOLONG: "the path or one of its names is too long; pick a shorter one",
    errno.EROFS: "the file system is read-only; pick a writable directory",
    errno.ENOSPC: "the disk is full; free space or pick another directory",
    errno.EDQUOT: "the disk quota is exhausted; free space or pick another directory",
}


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that it unwinds exactly like Ctrl-C.

    A KeyboardInterrupt subclass: `except Exception` (the stages' error wrapping) lets it through,
    while every `finally` and context manager on the way out runs (temp files are deleted).
    """


def command_parser(prog: str, description: str, examples: str = "") -> argparse.ArgumentParser:
    """A command's parser: its help ends with `examples` (kept as written) and the exit codes
    every command shares."""
    return argparse.ArgumentParser(
        prog=prog, description=description, epilog=examples + EXIT_CODES_HELP,
        formatter_class=(argparse.RawDescriptionHelpFormatter if examples
                         else argparse.HelpFormatter),
    )


def stage_parser(prog: str, description: str, source_help: str,
                 default_out: str) -> argparse.ArgumentParser:
    """A stage command's parser: SOURCE (an upstream artifact or a bare file) and -o / --out."""
    p = command_parser(prog, description)
    p.add_argument("source", type=Path, help=source_help)
    p.add_argument("-o", "--out", type=Path, default=Path(default_out),
                   help="artifact directory to write (default: %(default)s)")
    return p


def add_logging_args(parser: argparse.ArgumentParser) -> None:
    """-v (debug logging and unfiltered third-party output) and -q (warnings and errors only)."""
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="debug logging, and third-party warnings unfiltered",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")


def setup_logging(verbose: bool = False, quiet: bool = False) -> None:
    """Log to stderr; without `verbose`, filter known-harmless third-party noise (`cli.noise`).

    Call it before anything imports torch: some of that noise is logged at import time.
    """
    if not verbose:
        quiet_third_party()
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)-5s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )


def display_path(path: str | bytes | os.PathLike[str]) -> str:
    """A path as it can be printed: bytes that are not UTF-8 shown as \\xNN escapes."""
    raw = path if isinstance(path, bytes) else os.fsencode(path)
    return raw.decode("utf-8", "backslashreplace")


def check_utf8_path(path: Path, field: str) -> None:
    """Refuse a path with bytes that are not UTF-8: torch and ExecuTorch's native code cannot
    take such a name (the process aborts inside pybind11), so it is refused before any work."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigValidationError(
            field,
            os.fsencode(path),  # shown as b'...\xff...': the bytes as they are
            "contains bytes that are not valid UTF-8, which torch and ExecuTorch cannot open; "
            "rename it or pick another path",
        ) from None


def check_path_args(args: argparse.Namespace) -> None:
    """`check_utf8_path` on every path-valued option of a parsed command line."""
    for name, value in vars(args).items():
        if isinstance(value, Path):
            check_utf8_path(value, f"--{name.replace('_', '-')}")


def check_output_writable(path: Path, field: str) -> None:
    """Refuse, before any work starts, an output directory this process could not create or fill.

    Checks without writing anything: the path is UTF-8, its names and length fit the file system,
    it is not a file, the nearest existing ancestor is a directory we may write, and that file
    system is not read-only. What this cannot foresee (a full disk, a file system that refuses
    despite the permission bits) still ends in one `error:` line through `run_cli`.
    """
    check_utf8_path(path, field)
    absolute = Path(os.path.abspath(path))
    shown = _shorten(display_path(path))
    existing = absolute
    while not os.path.lexists(existing) and existing.parent != existing:
        existing = existing.parent
    name_max = _pathconf(existing, "PC_NAME_MAX", 255)
    path_max = _pathconf(existing, "PC_PATH_MAX", 4096)
    for part in absolute.parts[1:]:
        if len(os.fsencode(part)) > name_max:
            raise ConfigValidationError(
                field,
                shown,
                f"the name {display_path(part)[:40]!r}... is "
                f"{len(os.fsencode(part))} bytes, the file system allows {name_max}; "
                "pick a shorter name",
            )
    if len(os.fsencode(absolute)) + _OUTPUT_ROOM > path_max:
        raise ConfigValidationError(
            field,
            shown,
            f"the path is {len(os.fsencode(absolute))} bytes; with the files the "
            f"stages write below it, it would pass the system's limit of {path_max}; "
            "pick a shorter path",
        )
    if existing == absolute and not existing.is_dir():
        raise ConfigValidationError(
            field,
            shown,
            "exists and is not a directory; it must name the directory to write "
            "the artifacts into",
        )
    if not existing.is_dir():
        raise ConfigValidationError(
            field, shown, f"{display_path(existing)} is not a directory; pick another path"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigValidationError(
            field,
            shown,
            f"no permission to write in {display_path(existing)}; pick a directory "
            "you can write",
        )
    if os.statvfs(existing).f_flag & os.ST_RDONLY:
        raise ConfigValidationError(
            field, shown, f"{display_path(existing)} is on a read-only file system"
        )


def _shorten(text: str, keep: int = 100) -> str:
    """`text`, with its middle elided past `keep` characters, so an error stays one line."""
    if len(text) <= keep:
        return text
    return f"{text[: keep * 2 // 3]}...{text[-(keep // 3) :]}"


def _pathconf(path: Path, name: str, default: int) -> int:
    try:
        return os.pathconf(path, name)
    except (OSError, ValueError):  # no such limit here, or the name is unknown to the OS
        return default


def describe_os_error(err: OSError) -> str:
    """`path: reason; what to do` for an OS error (or the error's own text without a path)."""
    reason = err.strerror or str(err)
    hint = _OS_HINTS.get(err.errno or 0)
    text = reason if err.filename is None else f"{display_path(err.filename)}: {reason}"
    if err.filename2 is not None:
        text += f" (-> {display_path(err.filename2)})"
    return f"{text}; {hint}" if hint else text


def _print_error(err: PipelineError) -> None:
    where = f"[{err.stage}] " if err.stage and not str(err).startswith(f"[{err.stage}]") else ""
    cause = err.__cause__
    if isinstance(err, StageError) and isinstance(cause, OSError):
        # A stage that broke on the file system: the path and the reason are the whole story.
        stage = f"[{err.stage}] " if err.stage else ""
        print(f"error: {stage}{describe_os_error(cause)}", file=sys.stderr)
        return
    print(f"error: {where}{err}", file=sys.stderr)
    if cause is not None and str(cause) not in str(err):
        print(f"  caused by {type(cause).__name__}: {cause}", file=sys.stderr)


def _raised_by_argparse(exc: SystemExit) -> bool:
    """Whether `exc` is argparse's own exit (--help, a usage error) rather than foreign code's."""
    frame = _last_frame(exc.__traceback__)
    return frame is not None and frame.f_code.co_filename == argparse.__file__


def _last_frame(tb: TracebackType | None) -> FrameType | None:
    frame = None
    while tb is not None:
        frame, tb = tb.tb_frame, tb.tb_next
    return frame


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Terminated()  # each SIGTERM, like each Ctrl-C; a supervisor's next step is SIGKILL


def _redeliver_swallowed_signals(
    hook: Callable[[sys.UnraisableHookArgs], object],
) -> Callable[[sys.UnraisableHookArgs], None]:
    """An unraisable-exception hook that gives a swallowed Ctrl-C / SIGTERM a second chance.

    The signal's exception is raised wherever the main thread is; if that is a destructor or a
    weakref callback (torch runs many), Python prints "Exception ignored in ..." and drops it, and
    the run goes on as if never interrupted (seen: a Ctrl-C during quantize, exit 0). The hook
    delivers the signal again instead, so that it lands in the main flow; anything else goes to
    the previous hook.
    """

    def hook_(unraisable: sys.UnraisableHookArgs) -> None:
        kind = unraisable.exc_type
        if kind is None or not issubclass(kind, KeyboardInterrupt):
            hook(unraisable)
            return
        signum = signal.SIGTERM if issubclass(kind, Terminated) else signal.SIGINT
        if callable(signal.getsignal(signum)):  # Python handles it (never kill by default action)
            # A real signal to the main thread (it wakes a blocking call, which
            # _thread.interrupt_main does not), from another thread a moment later: sent from
            # here it would be raised inside this hook and dropped again. Swallowed again later,
            # it comes back here and is sent again.
            main = threading.main_thread().ident
            if main is not None:  # always, once the interpreter runs
                threading.Timer(0.01, signal.pthread_kill, args=(main, signum)).start()

    return hook_


def run_cli(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None) -> int:
    """Run a CLI body and turn every way it can fail into one message and an exit code.

    A PipelineError or an OSError becomes `error: <message>` (the path and what to do) and exit
    code 2. So does a SystemExit from anything but argparse (a model factory that calls
    sys.exit(), say), which would otherwise end the run with whatever code it carries and no word.
    Ctrl-C exits 130 and SIGTERM 143, each with a line saying so. Anything else is a bug in this
    project and keeps its traceback.
    """
    # Signal handlers can only be set from the main thread (an embedding app may call us from
    # another; it keeps its own SIGTERM handling).
    # A SIGTERM our parent set to be ignored (as nohup does for SIGHUP) stays ignored.
    handle = (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN
    )
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if handle else None
    previous_hook = sys.unraisablehook
    sys.unraisablehook = _redeliver_swallowed_signals(previous_hook)
    try:
        # A failed stage's staging directory and lock go when this call ends, not only at exit
        # (atexit): a process that calls a CLI's main() again and again leaves none behind either.
        return cleans_up_artifacts(main)(argv)
    except PipelineError as err:
        _print_error(err)
        return EXIT_ERROR
    except OSError as err:
        log.debug("where the OS error came from (-v)", exc_info=err)
        print(f"error: {describe_os_error(err)}", file=sys.stderr)
        return EXIT_ERROR
    except Terminated:
        print(
            "terminated (SIGTERM); temporary files removed, no partial artifact was sealed",
            file=sys.stderr,
        )
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        print(
            "interrupted; temporary files removed, no partial artifact was sealed", file=sys.stderr
        )
        return EXIT_INTERRUPTED
    except SystemExit as exc:
        if _raised_by_argparse(exc):
            raise
        log.debug("where sys.exit() was called from (-v)", exc_info=exc)
        frame = _last_frame(exc.__traceback__)
        where = "" if frame is None else f" at {frame.f_code.co_filename}:{frame.f_lineno}"
        print(
            f"error: sys.exit({exc.code!r}) was called{where}, by code this tool runs (a model "
            "factory or a library), not by the tool; the stage it ended sealed nothing: remove "
            "that call or raise an exception instead",
            file=sys.stderr,
        )
        return EXIT_ERROR
    finally:
        sys.unraisablehook = previous_hook
        if handle:
            # None: the previous handler was installed from C; the default is the closest.
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
