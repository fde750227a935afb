"""Starting a local Ray, or joining a cluster within a bound, with SIGTERM left to the CLI.

`ray.init` puts SIGTERM handlers of its own over the one the CLI set (`qnn_common.cli.support`:
unwind, delete temp files, exit 143): a Python one that calls `sys.exit(15)`, and in the driver's
core worker absl's failure handler, which prints a native "*** SIGTERM received" dump and may
abort the process (exit 134). Ray also turns an exception a signal handler raises while it waits
into a KeyboardInterrupt or a `SystemExit(1)`. So `joined_ray` puts the CLI's handler back once
`ray.init` returns, and notes every SIGTERM the process receives (the interpreter's wakeup fd, which
sees each signal whoever handles it): whatever Ray raised for it leaves the block as `Terminated`.

Ray retries a cluster address that does not answer for minutes. The address is probed first (a TCP
connection to its host and port: nothing listening fails at once), and `ray.init` runs under an
alarm: past `timeout_s` it is interrupted, and the sweep ends with one line naming the address.
A `ray://` address goes through Ray Client, which needs `ray[client]` (grpcio), a dependency no
wheel of this project pulls in: said before anything starts.
"""

from __future__ import annotations

import contextlib
import importlib.util
import signal
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from types import FrameType
from typing import Any

from qnn_common.cli.child_env import path_exported
from qnn_common.cli.support import Terminated
from qnn_common.errors import PipelineError

# Seconds to join a cluster at --ray-address: a cluster that answers is joined in a few.
DEFAULT_JOIN_TIMEOUT_S = 60.0
CLIENT_SCHEME = "ray://"
_TRY = "run with --jobs 1 to sweep in this process without Ray"


class _JoinTimedOut(BaseException):
    """Raised by the alarm into `ray.init`: not an Exception, which Ray's retry loops catch."""


def check_ray_address(address: str) -> None:
    """Refuse, before Ray starts, a `ray://` address without Ray Client installed."""
    if address.startswith(CLIENT_SCHEME) and importlib.util.find_spec("grpc") is None:
        raise PipelineError(
            f"--ray-address {address}: a ray:// address goes through Ray Client, which needs "
            "`pip install 'ray[client]'` (no qnn-pipeline wheel pulls it in); install it, or "
            f"give the head's GCS address (host:6379), or {_TRY}"
        )


def _host_port(address: str) -> tuple[str, int] | None:
    host, _, port = address.removeprefix(CLIENT_SCHEME).rpartition(":")
    return (host.strip("[]"), int(port)) if host and port.isdigit() else None


def _probe(address: str, timeout_s: float) -> None:
    """Fail at once if nothing accepts a connection at the address's host and port."""
    where = _host_port(address)
    if where is None:  # "auto", or a form only Ray knows: left to ray.init and the alarm
        return
    try:
        socket.create_connection(where, timeout=timeout_s).close()
    except OSError as err:
        reason = "timed out" if isinstance(err, TimeoutError) else err.strerror or str(err)
        raise PipelineError(
            f"could not join the Ray cluster at {address}: nothing answers at "
            f"{where[0]}:{where[1]} ({reason}); check that the cluster runs and that "
            f"--ray-address names its head (ray://host:10001 or host:6379), or {_TRY}"
        ) from None


@contextlib.contextmanager
def _sigterm_noted() -> Iterator[Any]:
    """Yields a function telling whether a SIGTERM arrived inside the block (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    seen = bytearray()

    def arrived() -> bool:
        with contextlib.suppress(BlockingIOError):
            while chunk := reader.recv(4096):
                seen.extend(chunk)
        return signal.SIGTERM in seen

    previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    try:
        yield arrived
    finally:
        signal.set_wakeup_fd(previous)
        reader.close()
        writer.close()


@contextlib.contextmanager
def _alarm(timeout_s: float | None) -> Iterator[Any]:
    """Raise `_JoinTimedOut` in the main thread past `timeout_s`, then every second after (Ray
    may swallow one, or raise a KeyboardInterrupt for it); yields whether it rang."""
    rang = threading.Event()
    if timeout_s is None or threading.current_thread() is not threading.main_thread():
        yield rang.is_set
        return

    def ring(signum: int, frame: FrameType | None) -> None:
        rang.set()
        raise _JoinTimedOut()

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, timeout_s, 1.0)
    try:
        yield rang.is_set
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def joined_ray(
    ray: Any, init_kwargs: Mapping[str, Any], address: str | None,
    timeout_s: float = DEFAULT_JOIN_TIMEOUT_S,
) -> Iterator[None]:
    """`ray.init(**init_kwargs)` ... `ray.shutdown()`, SIGTERM ending it as it ends any command.

    With an `address`, joining must succeed within `timeout_s` seconds. Raises PipelineError
    (one line: what failed, why and what to do) when Ray does not start or join.
    """
    if address is not None:
        check_ray_address(address)
        _probe(address, timeout_s)
    main = threading.current_thread() is threading.main_thread()
    cli_handler = signal.getsignal(signal.SIGTERM) if main else None
    with _sigterm_noted() as sigterm_arrived:
        try:
            try:
                _init(ray, init_kwargs, address, timeout_s, sigterm_arrived)
            finally:
                if cli_handler is not None:
                    signal.signal(signal.SIGTERM, cli_handler)  # over Ray's (and absl's)
            try:
                yield
            finally:
                ray.shutdown()
        except (KeyboardInterrupt, SystemExit) as err:
            if sigterm_arrived() and not isinstance(err, Terminated):
                raise Terminated() from None  # Ray's KeyboardInterrupt / sys.exit for our SIGTERM
            raise


def _init(ray: Any, init_kwargs: Mapping[str, Any], address: str | None, timeout_s: float,
          sigterm_arrived: Callable[[], bool]) -> None:
    """`ray.init`, its failures as PipelineError; joining `address` bounded by `timeout_s`."""
    with _alarm(timeout_s if address is not None else None) as rang:
        try:
            # A local Ray's node (raylet, its runtime_env and dashboard agents) is started by
            # ray.init as `sys.executable` children with this environment: under a PEX they
            # could not import ray, exited at once and the node timed out (issue 24).
            with path_exported():
                ray.init(**init_kwargs)
        except Exception as err:  # Ray raises bare Exception (node timeout), OSError, ...
            if rang():
                raise PipelineError(_not_started(address, _timed_out(timeout_s))) from None
            raise PipelineError(_not_started(address, first_line(err))) from err
        except BaseException:  # the alarm's own exception, or what Ray made of it
            if rang() and not sigterm_arrived():
                raise PipelineError(_not_started(address, _timed_out(timeout_s))) from None
            raise


def _timed_out(timeout_s: float) -> str:
    return f"no answer within {timeout_s:g} s (--ray-timeout)"


def first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


def _not_started(address: str | None, reason: str) -> str:
    """One line: what failed, why (Ray's own first line) and what to do."""
    if address is not None:
        return (f"could not join the Ray cluster at {address}: {reason}; check --ray-address "
                f"(ray://host:10001 or host:6379), or {_TRY}")
    return (f"could not start a local Ray: {reason}; its logs are under "
            f"<tmp>/ray/session_latest/logs; {_TRY}")
