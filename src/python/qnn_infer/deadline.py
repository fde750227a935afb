"""A bound on one native call that may never return: a runtime run on the QNN emulator, say.

ExecuTorch's `Method.execute` holds the GIL for the whole run (measured: a Python thread ticking
every 50 ms ran once during a 24 s execute), so nothing in Python (a thread, a signal handler,
a SIGTERM) can act until it returns. The bound is therefore armed in the C library: two POSIX
timers (`timer_create` with SIGEV_THREAD) whose expiry calls a libc function in a new native
thread, with no Python involved. At the bound the first runs `system()` on a command that prints
our one `error:` line to stderr; a moment later the second calls `_exit(2)`, the exit code every
CLI gives an error. A call that returns between the two is ended all the same: the line said
so. Nothing is unwound (the GIL is held): the stage's staging directory is left, as after a
kill, and the next run sweeps it; no partial artifact was sealed.

This is the seam for running programs in a child process (issue 27): there, the parent waits
for the child with the same bound and kills it instead; `bounded` is the one call to replace.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import shlex
import time
import weakref
from collections.abc import Iterator
from typing import Any, ClassVar, NoReturn

from qnn_common.cli.support import EXIT_ERROR
from qnn_common.errors import ConfigValidationError

# The bound on one method call, unless --run-timeout / QNN_RUN_TIMEOUT_S says otherwise. Far
# above any program here (MiniLM on the emulator: 3.4 s a run), far below "never returns".
DEFAULT_RUN_TIMEOUT_S = 600.0
# Not part of any stage's config: a bound does not change a result, so it is not in the cache
# key; an environment variable, so that a sweep's Ray workers inherit it.
RUN_TIMEOUT_ENV = "QNN_RUN_TIMEOUT_S"

# Seconds between the error line and the exit: time for `system()` to start a shell and print.
_GRACE_S = 2.0
_CLOCK_MONOTONIC = 1
_SIGEV_THREAD = 2


class _Sigevent(ctypes.Structure):
    # glibc's struct sigevent on 64-bit Linux: sigval, signo, notify, then the SIGEV_THREAD
    # members (function, attributes) in a union padded to 64 bytes in all.
    _fields_: ClassVar[list[tuple[str, Any]]] = [
        ("sigev_value", ctypes.c_void_p),
        ("sigev_signo", ctypes.c_int),
        ("sigev_notify", ctypes.c_int),
        ("sigev_notify_function", ctypes.c_void_p),
        ("sigev_notify_attributes", ctypes.c_void_p),
        ("_pad", ctypes.c_byte * 32),
    ]


class _Timespec(ctypes.Structure):
    _fields_: ClassVar[list[tuple[str, Any]]] = [
        ("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long),
    ]


class _Itimerspec(ctypes.Structure):
    _fields_: ClassVar[list[tuple[str, Any]]] = [
        ("it_interval", _Timespec), ("it_value", _Timespec),
    ]


def _libc() -> ctypes.CDLL:
    # timer_* moved from librt into libc in glibc 2.34; either has them.
    for name in (None, ctypes.util.find_library("rt")):
        lib = ctypes.CDLL(name, use_errno=True)
        if hasattr(lib, "timer_create"):
            return lib
    raise OSError("no timer_create in the C library")  # not Linux / glibc


class _NativeTimer:
    """A one-shot POSIX timer that calls `function(argument)` in a native thread at expiry."""

    def __init__(self, libc: ctypes.CDLL, function: str, argument: int | bytes) -> None:
        self._libc = libc
        event = _Sigevent()
        event.sigev_notify = _SIGEV_THREAD
        event.sigev_notify_function = ctypes.cast(getattr(libc, function), ctypes.c_void_p).value
        if isinstance(argument, bytes):
            # Kept alive with the timer: the native thread reads it at expiry.
            self._keep: ctypes.Array[ctypes.c_char] | None = ctypes.create_string_buffer(argument)
            event.sigev_value = ctypes.cast(self._keep, ctypes.c_void_p).value
        else:
            self._keep = None
            event.sigev_value = argument
        self._id = ctypes.c_void_p()
        if libc.timer_create(_CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(self._id)):
            raise OSError(ctypes.get_errno(), "timer_create failed")

    def arm(self, seconds: float) -> None:
        """Fire once, `seconds` from now."""
        spec = _Itimerspec()
        spec.it_value.tv_sec = int(seconds)
        spec.it_value.tv_nsec = int((seconds - int(seconds)) * 1e9)
        self._settime(spec)

    def disarm(self) -> None:
        self._settime(_Itimerspec())

    def delete(self) -> None:
        self._libc.timer_delete(self._id)

    def _settime(self, spec: _Itimerspec) -> None:
        if self._libc.timer_settime(self._id, 0, ctypes.byref(spec), None):
            raise OSError(ctypes.get_errno(), "timer_settime failed")


class _Armed:
    """One timer's two settings, built once: each run then costs one foreign call to arm and
    one to disarm (a timed loop of a 60 us program must not pay for building structures)."""

    def __init__(self, timer: _NativeTimer, seconds: float) -> None:
        self._call = timer._libc.timer_settime
        self._id = timer._id
        on, self._off = _Itimerspec(), _Itimerspec()
        on.it_value.tv_sec = int(seconds)
        on.it_value.tv_nsec = int((seconds - int(seconds)) * 1e9)
        self._on, self._old = on, _Itimerspec()
        self._on_ref, self._off_ref = ctypes.byref(on), ctypes.byref(self._off)
        self._old_ref = ctypes.byref(self._old)

    def arm(self) -> None:
        if self._call(self._id, 0, self._on_ref, None):
            raise OSError(ctypes.get_errno(), "timer_settime failed")

    def disarm(self) -> bool:
        """Disarm; True if the timer had already expired (its function has run or is running)."""
        self._call(self._id, 0, self._off_ref, self._old_ref)
        left = self._old.it_value
        return bool(left.tv_sec == 0 and left.tv_nsec == 0)


class RunBound:
    """Arms, around a call, the two timers that end the process past `seconds`.

    Create it once per loaded program (the timers are made up front) and enter `bounded()` around
    each call of it.
    """

    def __init__(self, seconds: float, message: str) -> None:
        self.seconds = seconds
        libc = _libc()
        line = f"error: {message}"
        self._say = _NativeTimer(libc, "system", f"printf '%s\\n' {shlex.quote(line)} >&2".encode())
        self._exit = _NativeTimer(libc, "_exit", EXIT_ERROR)
        self._armed_say = _Armed(self._say, seconds)
        self._armed_exit = _Armed(self._exit, seconds + _GRACE_S)
        self._proven = False
        # The timers are the process's until deleted: a test session makes thousands of runners.
        weakref.finalize(self, _delete, self._say, self._exit)

    @contextlib.contextmanager
    def bounded(self) -> Iterator[None]:
        """Bound the block, until one block has returned within the bound: after that, the same
        program is trusted (a run that never returns does so the first time; seen on the
        emulator), and timed loops pay nothing. Arming costs four timer_settime calls, measured
        25 us each on this 2-core VM under load: a quarter of a decode step."""
        if self._proven:
            yield
            return
        self._armed_say.arm()
        self._armed_exit.arm()
        try:
            yield
        finally:
            if self._armed_say.disarm():
                # The error line is printed or being printed: the run is over even if the call
                # returned in the grace before the exit, or one line would say "ended" of a run
                # that went on to succeed. The exit timer, still armed, ends the process.
                _await_exit()
            self._armed_exit.disarm()
        self._proven = True  # not on an exception: a failed run proves nothing


def _await_exit() -> NoReturn:
    """Wait for the exit timer (armed `_GRACE_S` after the message); exit as it would if not."""
    time.sleep(2 * _GRACE_S)
    os._exit(EXIT_ERROR)


def _delete(*timers: _NativeTimer) -> None:
    for timer in timers:
        timer.delete()


def run_timeout_s() -> float:
    """The bound on one method call, in seconds (0: none): QNN_RUN_TIMEOUT_S, or the default."""
    raw = os.environ.get(RUN_TIMEOUT_ENV)
    if raw is None or raw == "":
        return DEFAULT_RUN_TIMEOUT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= 7 * 24 * 3600:
        raise ConfigValidationError(
            "--run-timeout", raw, "must be seconds between 0 (no bound) and 604800 (a week)"
        )
    return seconds


def set_run_timeout(seconds: float | None) -> None:
    """--run-timeout: bound this process's method calls, and its children's (None: unchanged)."""
    if seconds is not None:
        os.environ[RUN_TIMEOUT_ENV] = repr(float(seconds))
        run_timeout_s()  # refuses a bad value now, before any work


def bound_for(what: str) -> RunBound | None:
    """A `RunBound` for calls described by `what` at the current bound, or None (bound 0)."""
    seconds = run_timeout_s()
    if not seconds:
        return None
    return RunBound(seconds, (
        f"[infer] {what} did not return within {seconds:g} s, the bound on one run; it may "
        "never finish on this runtime (the QNN emulator can run a quantized program far slower "
        f"than its float one): raise it with --run-timeout SECONDS ({RUN_TIMEOUT_ENV}; 0 = no "
        "bound); the run was ended and sealed nothing, the next run sweeps what it left"
    ))


@contextlib.contextmanager
def bounded(bound: RunBound | None) -> Iterator[None]:
    """`bound.bounded()`, or nothing without a bound."""
    if bound is None:
        yield
        return
    with bound.bounded():
        yield
