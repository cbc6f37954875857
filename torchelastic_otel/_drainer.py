"""One background thread per process that moves buffered telemetry into the OpenTelemetry SDK.

The adapters' hot paths (``put_metric``, ``record``) only append to bounded buffers, because an SDK call costs
more than torch's whole null path. Every ``TORCHELASTIC_OTEL_DRAIN_INTERVAL`` seconds (default 0.5), at every
flush (exit, SIGTERM, ``torchelastic_otel.flush()``) and at the start of every metric collection, the drainer
calls ``drain()`` on each registered buffer. After ``fork`` the child starts with empty buffers (what was buffered
belongs to the parent, which exports it) and a new thread.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from typing import Iterator, Protocol

from torchelastic_otel import _selftelemetry, pipeline

__all__ = ["Drainable", "register", "drain_all", "paused", "interval"]


class Drainable(Protocol):
    def drain(self) -> int: ...

    def after_fork_in_child(self) -> None: ...


def _interval() -> float:
    raw = os.environ.get("TORCHELASTIC_OTEL_DRAIN_INTERVAL") or os.environ.get(
        "TORCHELASTIC_OTEL_METRICS_DRAIN_INTERVAL", "0.5"
    )
    try:
        return max(0.01, float(raw))
    except ValueError:
        return 0.5


interval = _interval()
_buffers: weakref.WeakSet = weakref.WeakSet()
_lock = threading.Lock()
_thread: threading.Thread | None = None


def register(buffer: Drainable) -> None:
    """Drain ``buffer`` from now on (held weakly)."""
    _buffers.add(buffer)
    _start()


def _start() -> None:
    global _thread
    with _lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_run, name="torchelastic-otel-drainer", daemon=True)
            _thread.start()


def _run() -> None:
    wait = threading.Event().wait
    while True:
        wait(interval)
        if not _paused:
            drain_all()


_paused: list[bool] = []


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Suspend the periodic drain (flushes and collections still drain): lets tests and benchmarks control when
    buffered values reach the SDK. Waits for a drain in progress to finish."""
    _paused.append(True)
    with _drain_lock:
        pass
    try:
        yield
    finally:
        _paused.pop()


_drain_lock = threading.RLock()


def drain_all() -> None:
    """Drain every registered buffer now; never raises."""
    with _drain_lock:
        for buffer in list(_buffers):
            try:
                buffer.drain()
            except Exception:
                _selftelemetry.count(_selftelemetry.DROPPED, "all", "drain_error")


def _after_fork_in_child() -> None:
    global _lock, _thread, _drain_lock
    _lock = threading.Lock()
    _drain_lock = threading.RLock()
    _thread = None
    for buffer in list(_buffers):
        buffer.after_fork_in_child()
    if len(_buffers):
        _start()


pipeline.add_flush_hook(drain_all)
_selftelemetry.add_before_collect(drain_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
