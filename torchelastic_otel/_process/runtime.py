"""The bridge's part in the life of a process: fork, SIGTERM and exit, in one place and in an explicit order.

Every hook of the process that the bridge takes is registered here and calls into the pipeline's state machine
(``pipeline``), never the other way round:

- fork (``os.register_at_fork``, when this module is imported): before, exports in flight finish (bounded); in the
  child, in this order: the counters, the exporters' state, the bounded flushes' state, the buffers, the pipeline
  (FORKED: rebuilt on first use), the SIGTERM watcher; then the drainer thread, once everything it touches is the
  child's; and, in a ``multiprocessing`` child, its exit path.
- SIGTERM (:func:`handle_sigterm`, a worker's ``install()``): :func:`on_signal` runs the final words: the hooks
  (a worker's terminated record, with every thread's stack); where the pipeline is not built yet, the build is
  abandoned and the unbuilt-exit hooks hand the worker's span and buffered records to its agent; then a flush of
  the READY pipeline within ``EXIT_TIMEOUT_MILLIS``, then what asked to hear whether it went out. Never a build,
  an import or a wait for one. For a stretch in which the main thread cannot run Python (a worker's ``import
  torch``: :func:`sigterm_in_c`), ``faulthandler`` writes the stacks from C and the process dies at once.
- exit (:func:`install`, on the pipeline's first phase change): first, among ``threading``'s exit hooks, a build in
  progress is waited for (bounded: thread pools and new threads are refused later in the interpreter's exit);
  then :func:`at_exit` delivers what is left and shuts the bridge's providers down within
  ``EXIT_TIMEOUT_MILLIS``; what could not be is counted.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from torchelastic_otel import _compat
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._export import bounded as _bounded
from torchelastic_otel._export import drainer as _drainer
from torchelastic_otel._export import forkgate
from torchelastic_otel._export import health as _health
from torchelastic_otel._export import state as pipeline
from torchelastic_otel._process import signals as _signals
from torchelastic_otel._process import stacks as _stacks
from torchelastic_otel._settings import EXIT_TIMEOUT_MILLIS

__all__ = ["install", "before_fork", "after_fork_in_parent", "after_fork_in_child", "on_signal", "at_exit"]

_logger = logging.getLogger("torchelastic_otel")


# ---- fork --------------------------------------------------------------------------------------------------------


class _Hooks:
    """What this module keeps for the process: the hooks others registered (on SIGTERM; at an exit before the
    pipeline is built) and what it did once (installed, ``multiprocessing``'s exit hooked, when export garbage was
    last collected). One owner, so that nothing else holds a piece of it."""

    def __init__(self) -> None:
        self.installed = False
        self.multiprocessing_hooked = False  # inherited by forked children, as is the registration it records
        self.signal_hooks: list[SignalHook] = []
        self.unbuilt_exit_hooks: list[Callable[[], bool]] = []
        self.collected_at: tuple[int, float] = (0, -1.0)  # (failed exports, time) at the last collection


_hooks = _Hooks()


def before_fork() -> None:
    """Exports in flight finish first (bounded): gRPC cannot prepare a fork while a thread is inside a call. Then
    the garbage failed exports left is collected here (``_collect_export_garbage``)."""
    forkgate.gate.before_fork()
    _collect_export_garbage()


#: The exporters' failures and last retry at the last collection before a fork (a child starts with neither).


def _collect_export_garbage() -> None:
    """A failed or retried gRPC export leaves the exporter's old channel and call state in reference cycles (the RPC
    error, its traceback, the frames that hold the call) until a garbage collection runs. A forked child inherits
    that garbage; a collection in the child -- whenever its allocations start one -- destroys a gRPC channel of the
    parent's, and gRPC's destructor, joining threads the child does not have, aborts it (``std::system_error:
    Invalid argument``): an agent forked by a launcher dies, and the agents it was to meet in the rendezvous wait
    for it. So the parent collects first, once per fork after exports failed or retried (a collector down), else
    never. Never raises (a fork handler)."""
    try:
        mark = (_health.health.failures, _health.health.last_retry())
        if mark != _hooks.collected_at:
            _hooks.collected_at = mark
            gc.collect()
    except Exception:
        _logger.debug("torchelastic_otel: collection before fork failed", exc_info=True)


def after_fork_in_parent() -> None:
    forkgate.gate.after_fork_in_parent()


def after_fork_in_child() -> None:
    """In this order: the counters (what follows may count), the exporters' state, the bounded flushes, the
    buffers (what they held is the parent's to export), the pipeline (rebuilt on first use), the signal watcher;
    then the drainer thread, once everything it touches is the child's."""
    selftelemetry.after_fork_in_child()
    _health.health.after_fork_in_child()
    _hooks.collected_at = (0, -1.0)
    forkgate.gate.after_fork_in_child()
    _bounded.after_fork_in_child()
    _drainer.after_fork_in_child()
    if pipeline.after_fork_in_child():
        _flush_at_multiprocessing_exit()
    _signals.after_fork_in_child()
    _drainer.restart()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=before_fork, after_in_parent=after_fork_in_parent, after_in_child=after_fork_in_child)


class _ForkToken:
    """Kept alive for ``multiprocessing.util.register_after_fork`` (which holds its object weakly)."""


_fork_token = _ForkToken()


def _flush_at_multiprocessing_exit() -> None:
    """A ``multiprocessing`` child started by fork ends with ``os._exit``, which skips ``atexit``: have its
    ``Process._bootstrap`` exit path (the ``multiprocessing.util`` finalizers) run the bridge's exit handler."""
    util = sys.modules.get("multiprocessing.util")
    if util is None or _hooks.multiprocessing_hooked:
        return
    _hooks.multiprocessing_hooked = True  # inherited by this process's children, as is the registration below

    def register(_token: object) -> None:
        util.Finalize(None, at_exit, exitpriority=0)

    util.register_after_fork(_fork_token, register)


# ---- signals -----------------------------------------------------------------------------------------------------

#: ``hook(signum, stacks)``; what it returns, if callable, is called with whether the final flush went out.
SignalHook = Callable[[int, _stacks.Stacks], Any]


def add_signal_hook(hook: SignalHook) -> None:
    """Run ``hook(signum, stacks)`` first when the process is stopped by a signal (a worker's terminated record)."""
    if hook not in _hooks.signal_hooks:
        _hooks.signal_hooks.append(hook)


def remove_signal_hook(hook: SignalHook) -> None:
    if hook in _hooks.signal_hooks:
        _hooks.signal_hooks.remove(hook)


def on_signal(signum: int, stacks: _stacks.Stacks) -> None:
    """The final words of a process stopped by ``signum``: the hooks; a worker whose pipeline is not built yet
    hands its span and buffered records to its agent instead (never builds, never waits for a build); then a
    flush of a READY pipeline within the exit bound."""
    confirmations = []
    for hook in list(_hooks.signal_hooks):
        try:
            confirm = hook(signum, stacks)
            if callable(confirm):
                confirmations.append(confirm)
        except Exception:
            _logger.debug("signal hook failed", exc_info=True)
    _hand_over_instead_of_build(_drainer.HAND_OVER_LOCK_SECONDS)  # a worker stopped before it was built
    delivered = final_flush(EXIT_TIMEOUT_MILLIS)
    for confirm in confirmations:
        try:
            confirm(delivered)
        except Exception:
            _logger.debug("signal hook confirmation failed", exc_info=True)


def final_flush(timeout_millis: int) -> bool:
    """Flush a READY pipeline within ``timeout_millis``; ``False`` at once if there is none (never builds)."""
    current = pipeline.ready()
    return current is not None and current.flush(timeout_millis)


def handle_sigterm() -> bool:
    """Run :func:`on_signal` on SIGTERM, also while the main thread is blocked in native code (``_process.signals``)."""
    import signal

    return _signals.install(lambda stacks: on_signal(signal.SIGTERM, stacks), EXIT_TIMEOUT_MILLIS)


def uninstall_sigterm() -> None:
    _signals.uninstall()


def sigterm_in_c(dump: object) -> bool:
    """While the main thread cannot run Python: SIGTERM writes the stacks to ``dump`` and ends the process at once
    (``_process.signals.enter_native``); only for a process with nothing of its own to flush. ``False`` where the
    watcher stays in charge."""
    if pipeline.ready() is not None or _drainer.pending():
        return False
    return _signals.enter_native(dump)


def sigterm_in_python() -> None:
    """Back from :func:`sigterm_in_c`: the watcher and the handler run the final words again."""
    _signals.leave_native()


# ---- exit --------------------------------------------------------------------------------------------------------


def at_exit() -> None:
    """Deliver what is left, then shut down the providers the bridge built -- within EXIT_TIMEOUT_MILLIS."""
    deadline = time.monotonic() + EXIT_TIMEOUT_MILLIS / 1000
    pipeline.wait_built(deadline - time.monotonic())
    if pipeline.state.phase in (pipeline.Phase.FORKED, pipeline.Phase.UNSET):
        _drainer.drain_all(time.monotonic() + (deadline - time.monotonic()) / 2)  # what was recorded builds
    current = pipeline.ready()
    if current is not None:
        current.shutdown(max(0, int((deadline - time.monotonic()) * 1000)))
    _drainer.discard_all("exit_timeout")  # what could not be drained in time is lost: counted


#: Called when a process exits before its pipeline was built and with nothing recorded; each returns whether it
#: sent what it had another way (a worker hands its ``torchelastic.worker.start`` span to its agent).


def add_unbuilt_exit_hook(hook: Callable[[], bool]) -> None:
    if hook not in _hooks.unbuilt_exit_hooks:
        _hooks.unbuilt_exit_hooks.append(hook)


def remove_unbuilt_exit_hook(hook: Callable[[], bool]) -> None:
    if hook in _hooks.unbuilt_exit_hooks:
        _hooks.unbuilt_exit_hooks.remove(hook)


def _wait_for_build() -> None:
    """Among ``threading``'s exit hooks: a build in progress finishes while threads can still be started -- unless
    what the build would send can go another way (a worker's span and its buffered log records, to its agent:
    the hooks): then the process does not wait for it (a short-lived worker would pay the build at every exit).
    Buffered metric values wait for the build."""
    if _drainer.can_hand_over() and _hand_over_instead_of_build(None):
        return
    pipeline.wait_built(EXIT_TIMEOUT_MILLIS / 1000)


def _hand_over_instead_of_build(lock_timeout: float | None) -> bool:
    """Abandon a build in progress (or still deferred) and run the unbuilt-exit hooks: ``True`` if they handed over
    everything there was, so nothing waits for the pipeline. Abandoning first means that a build which finishes
    meanwhile sends nothing twice (its READY callbacks, the worker span, are dropped with it). Whatever a hook could
    not hand over stays buffered: an exit then builds on its way out (``at_exit``: UNSET drains), a signal's final
    words do not."""
    if not (pipeline.building() and _hooks.unbuilt_exit_hooks):
        return False
    if not pipeline.abandon_build(lock_timeout):
        return False
    handed = True
    for hook in list(_hooks.unbuilt_exit_hooks):
        try:
            handed = hook() is True and handed
        except Exception:
            handed = False
            _logger.debug("exit hook failed", exc_info=True)
    return handed and not _drainer.pending()


def install(_phase: object = None) -> None:
    """Register the exit handlers (once per process; a listener of the pipeline's phase changes)."""
    if _hooks.installed:
        return
    _hooks.installed = True
    atexit.register(at_exit)
    _compat.register_before_thread_shutdown(_wait_for_build)
    _bounded.start_exit_thread()


pipeline.add_listener(install)
