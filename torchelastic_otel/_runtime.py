"""The bridge's part in the life of a process: fork, signals and exit, in one place and in an explicit order.

- :func:`after_fork_in_child`: a forked child starts with its own counters, no exports in flight, empty buffers,
  providers marked for a rebuild on first use, and no signal watcher (its thread did not survive the fork).
- :func:`on_signal`: the final words of a process stopped by SIGTERM: the hooks (a worker's terminated record,
  with every thread's stack), then a flush within ``EXIT_TIMEOUT_MILLIS`` (``_signals`` calls it once).
- :func:`at_exit`: what is left is delivered and the bridge's providers are shut down within
  ``EXIT_TIMEOUT_MILLIS``; what could not be is counted.

The fork handlers are registered once, when this module is imported; the exit handlers by :func:`install`, once a
pipeline is built or deferred.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from torchelastic_otel import (
    _bounded,
    _deferred,
    _drainer,
    _fork,
    _forkgate,
    _health,
    _selftelemetry,
    _signals,
    _stacks,
    pipeline,
)
from torchelastic_otel._config import EXIT_TIMEOUT_MILLIS

__all__ = ["install", "before_fork", "after_fork_in_parent", "after_fork_in_child", "on_signal", "at_exit"]

_logger = logging.getLogger("torchelastic_otel")


# ---- fork --------------------------------------------------------------------------------------------------------


def before_fork() -> None:
    """Exports in flight finish first (bounded): gRPC cannot prepare a fork while a thread is inside a call."""
    _forkgate.gate.before_fork()


def after_fork_in_parent() -> None:
    _forkgate.gate.after_fork_in_parent()


def after_fork_in_child() -> None:
    """In this order: the counters (what follows may count), the exporters' state, the pipeline's lock, the
    buffers (what they held is the parent's to export), the providers (rebuilt on first use), the signal watcher;
    then the drainer thread, once everything it touches is the child's."""
    _selftelemetry.after_fork_in_child()
    _health.health.after_fork_in_child()
    _forkgate.gate.after_fork_in_child()
    _bounded.after_fork_in_child()
    pipeline.state.lock = threading.RLock()
    _drainer.after_fork_in_child()
    _fork.after_fork_in_child()
    _signals.after_fork_in_child()
    _drainer.restart()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=before_fork, after_in_parent=after_fork_in_parent, after_in_child=after_fork_in_child)


# ---- signals -----------------------------------------------------------------------------------------------------

_signal_hooks: list[Callable[[int, _stacks.Stacks], Any]] = []


def add_signal_hook(hook: Callable[[int, _stacks.Stacks], Any]) -> None:
    """Run ``hook(signum, stacks)`` first when the process is stopped by a signal (a worker's terminated record)."""
    if hook not in _signal_hooks:
        _signal_hooks.append(hook)


def remove_signal_hook(hook: Callable[[int, _stacks.Stacks], Any]) -> None:
    if hook in _signal_hooks:
        _signal_hooks.remove(hook)


def on_signal(signum: int, stacks: _stacks.Stacks) -> None:
    """The final words of a process stopped by ``signum``: the hooks, then a flush within the exit bound."""
    for hook in list(_signal_hooks):
        try:
            hook(signum, stacks)
        except Exception:
            _logger.debug("signal hook failed", exc_info=True)
    pipeline.flush(timeout_millis=EXIT_TIMEOUT_MILLIS)


def handle_sigterm() -> bool:
    """Run :func:`on_signal` on SIGTERM, also while the main thread is blocked in native code (``_signals``)."""
    import signal

    return _signals.install(lambda stacks: on_signal(signal.SIGTERM, stacks), EXIT_TIMEOUT_MILLIS)


# ---- exit --------------------------------------------------------------------------------------------------------


def at_exit() -> None:
    """Deliver what is left, then shut down the providers the bridge built -- within EXIT_TIMEOUT_MILLIS."""
    deadline = time.monotonic() + EXIT_TIMEOUT_MILLIS / 1000
    if _fork.pending() and not _fork.settle(deadline):
        return  # a forked child that recorded nothing: nothing of its own to deliver
    _deferred.build_pending()
    current = pipeline.state.current
    if current is not None:
        current.shutdown(max(0, int((deadline - time.monotonic()) * 1000)))
    _drainer.discard_all("exit_timeout")  # what could not be drained in time is lost: counted


_installed = [False]


def install() -> None:
    """Register the exit handlers (once per process)."""
    if _installed[0]:
        return
    _installed[0] = True
    atexit.register(at_exit)
    _build_before_shutdown()
    _bounded.start_exit_thread()


def _build_before_shutdown() -> None:
    """At interpreter exit, thread pools stop taking work before ``atexit`` handlers run (the SDK's
    ``Resource.create`` needs one) and Python 3.12+ refuses new threads in them (the batch processors start one):
    a pipeline still deferred then is built earlier, among ``threading``'s own exit hooks, which run
    last-registered first -- so before the one ``concurrent.futures`` registers when it is imported."""
    register = getattr(threading, "_register_atexit", None)
    if register is None:
        return
    import concurrent.futures.thread  # noqa: F401 - its exit hook is registered before ours

    try:
        register(_deferred.build_pending)
    except RuntimeError:  # already shutting down
        pass
