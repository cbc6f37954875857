"""Flushes and shutdowns that return in time, whatever the backend does.

The SDK's ``force_flush`` and ``shutdown`` export in the calling thread and ignore their timeouts while the OTLP
exporter retries an unreachable collector (up to 10 s per call). So they run in a helper thread that the caller waits
for, bounded (:func:`run_bounded`), and give up early once the exports are stuck (``_export.health``). Once a flush
timed out, later ones wait at most ``DOWN_WAIT_MILLIS``: a dying job is not held up once per signal and exit path.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from torchelastic_otel import _compat
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._export import health as _health
from torchelastic_otel._settings import DOWN_WAIT_MILLIS, EXIT_TIMEOUT_MILLIS

__all__ = ["run_bounded", "bounded_flush", "backend_down", "flushing", "shutting_down"]


class _Flushes:
    """Which threads run a bounded flush or shutdown now, and how many shutdowns are under way in the process."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.shutdowns = 0


_flushes = _Flushes()


def flushing() -> bool:
    """Whether telemetry is wanted now rather than on the next period: this thread runs a bounded flush or shutdown
    (:func:`run_bounded`), or a shutdown of the bridge's providers is under way (whose periodic reader collects a last
    time on its own thread). Most often a process on its way out: a collection callback then reads what is at hand
    and starts nothing slow (opening a device driver)."""
    return _flushes.shutdowns > 0 or bool(getattr(_flushes.local, "flushing", False))


@contextlib.contextmanager
def shutting_down() -> Iterator[None]:
    """A shutdown of providers, while the block runs (:func:`flushing` is true on every thread meanwhile)."""
    _flushes.shutdowns += 1
    try:
        yield
    finally:
        _flushes.shutdowns -= 1


def _marked(fn: Callable[[], bool]) -> Callable[[], bool]:
    def call() -> bool:
        _flushes.local.flushing = True
        try:
            return fn()
        finally:
            _flushes.local.flushing = False

    return call


def run_bounded(fn: Callable[[], bool], timeout_millis: int, give_up: Callable[[], bool] | None = None) -> bool | None:
    """``fn()`` in a daemon thread, waited for at most ``timeout_millis``; ``None`` if it did not finish.

    ``give_up`` is polled every 20 ms while waiting: when it returns true, stop waiting at once (``None``).
    Where no thread can be started (``atexit`` handlers of Python 3.12.0-3.12.1), ``fn()`` runs on the thread
    :func:`start_exit_thread` started beforehand; without one, in the caller's thread, bounded only by the exporters'
    own timeouts: late rather than lost.
    """
    result: list[bool] = []
    fn = _marked(fn)
    thread = threading.Thread(target=lambda: result.append(fn()), name="torchelastic-otel-flush", daemon=True)
    try:
        thread.start()
    except RuntimeError:  # "can't create new thread at interpreter shutdown"
        thread = _exit_thread.submit(lambda: result.append(fn()))
        if thread is None:
            return fn()
    deadline = time.monotonic() + max(0, timeout_millis) / 1000
    while True:
        remaining = deadline - time.monotonic()
        thread.join(max(0.0, min(remaining, 0.02 if give_up is not None else remaining)))
        if not thread.is_alive() or remaining <= 0:
            break
        if give_up is not None and give_up():
            break
    return result[0] if result else None


class _ExitThread:
    """One daemon thread, started before the interpreter exits, that runs what :func:`run_bounded` hands it there
    (one call at a time, in order) on a Python that starts no thread at exit (``_compat.threads_start_at_exit``)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[[], object], threading.Event]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="torchelastic-otel-exit", daemon=True)
            self._thread.start()

    def submit(self, fn: Callable[[], object]) -> Any:
        """Hand ``fn`` over; something to ``join(timeout)`` on (``None``: no thread here, e.g. after a fork)."""
        if self._thread is None or not self._thread.is_alive():
            return None
        done = threading.Event()
        self._queue.put((fn, done))
        return _Done(done)

    def _run(self) -> None:
        while True:
            fn, done = self._queue.get()
            try:
                fn()
            except Exception:
                pass
            finally:
                done.set()


class _Done:
    """A finished-or-not flag with ``Thread``'s ``join`` / ``is_alive``, for :func:`run_bounded`'s wait loop."""

    def __init__(self, done: threading.Event) -> None:
        self._done = done

    def join(self, timeout: float) -> None:
        self._done.wait(timeout)

    def is_alive(self) -> bool:
        return not self._done.is_set()


_exit_thread = _ExitThread()


def start_exit_thread() -> None:
    """Start the exit thread where this Python will start none at exit (the exit handlers' registration calls it)."""
    if not _compat.threads_start_at_exit():
        _exit_thread.start()


_down = [False]


def backend_down() -> bool:
    """The last bounded flush timed out or failed, or the exporters say the backend is unreachable."""
    return _down[0] or _health.health.down()


def bounded_flush(flush: Callable[[], bool], timeout_millis: int) -> bool:
    """``flush()`` bounded: ``timeout_millis`` while the backend answers; at most ``DOWN_WAIT_MILLIS`` once it is
    known to be down; given up as soon as the exports in flight are stuck. ``False`` if it timed out (counted as
    ``flush_timeout``) or an export failed meanwhile. Never raises."""
    if backend_down():
        timeout_millis = min(timeout_millis, DOWN_WAIT_MILLIS)
    health = _health.health
    failures = health.failures
    ok = run_bounded(lambda: _quietly(flush), max(0, timeout_millis), give_up=health.stuck)
    if ok is None:
        _down[0] = True
        selftelemetry.count(selftelemetry.DROPPED, "all", "flush_timeout")
        return False
    ok = ok and health.failures == failures  # the SDK's force_flush says True even when the export failed
    _down[0] = not ok
    return ok


def _quietly(fn: Callable[[], object]) -> bool:
    try:
        return fn() is not False
    except Exception:
        return False


def user_timeout(timeout_millis: Any, default: int) -> int:
    """The timeout a caller of the plain API passed, capped at the exit bound once the backend is down."""
    try:
        value = int(timeout_millis) if timeout_millis is not None else default
    except (TypeError, ValueError):
        value = default
    return min(value, EXIT_TIMEOUT_MILLIS) if backend_down() else value


def after_fork_in_child() -> None:
    _down[0] = False
    _flushes.shutdowns = 0  # the parent's shutdown in progress is not the child's
