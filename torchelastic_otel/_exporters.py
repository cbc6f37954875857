"""The bridge's exporters account for what they lose, and never hold a flush, an exit or a fork for long.

- Each span, log record and metric exporter the bridge builds is wrapped (``wrap_exporter``): a failed export
  counts its items as dropped (``torchelastic_otel.dropped {signal, reason="export_failed"}``), and
  ``health`` knows when exports are stuck -- retrying an unreachable collector, or in flight for too long --
  so a flush can stop waiting for the OTLP exporters' 10 s of retries.
- The SDK batch processors count what a full queue drops (``counting_batch_processor``) instead of logging a
  warning per item.
- ``run_bounded`` runs the SDK's flushes, which ignore their timeouts when the backend is down, in a helper thread
  that the caller waits for, bounded.
- ``fork_gate`` keeps exports out of the moment a process forks (gRPC cannot prepare a fork while a thread is
  inside a call); in a forked child the parent's exporters do nothing.
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from torchelastic_otel import _selftelemetry

_logger = logging.getLogger("torchelastic_otel")


def run_bounded(
    fn: Callable[[], bool], timeout_millis: int, give_up: Callable[[], bool] | None = None
) -> bool | None:
    """``fn()`` in a daemon thread, waited for at most ``timeout_millis``; ``None`` if it did not finish.

    ``give_up`` is polled every 20 ms while waiting: when it returns true, stop waiting at once (``None``).
    Where no thread can be started (``atexit`` handlers of Python 3.12.0-3.12.1), ``fn()`` runs in the caller's
    thread, bounded only by the exporters' own timeouts: late rather than lost.
    """
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(fn()), name="torchelastic-otel-flush", daemon=True)
    try:
        thread.start()
    except RuntimeError:  # "can't create new thread at interpreter shutdown"
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


def env_millis(name: str, default: int) -> int:
    try:
        return max(0, int(os.environ.get(name, "") or default))
    except ValueError:
        return default


#: An export in flight for longer than this means the backend is unreachable (or too slow to wait for at exit).
EXPORT_STALL_MILLIS = env_millis("TORCHELASTIC_OTEL_EXPORT_STALL_MILLIS", 2000)


class ExportHealth:
    """What the bridge's exporters are doing: when each export in flight started, whether one of them is retrying,
    and whether the last one failed.

    A flush waits for the exporters, and the OTLP exporters retry an unreachable collector for up to
    ``OTEL_EXPORTER_OTLP_TIMEOUT`` (10 s): this is how the flush knows not to wait that long. An export counts as
    stuck once it retries (the exporters log each retry: ``_RetryWatch``; a refused connection or a failed TLS
    handshake shows within milliseconds) or once it has been in flight for ``EXPORT_STALL_MILLIS`` (a collector
    that does not answer at all).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started: dict[int, float] = {}
        self._next = 0
        self._retried_at = -1.0
        self.failing = False
        self.failures = 0

    def begin(self) -> int:
        with self._lock:
            self._next += 1
            self._started[self._next] = time.monotonic()
            return self._next

    def end(self, token: int, ok: bool) -> None:
        with self._lock:
            self._started.pop(token, None)
            self.failing = not ok
            self.failures += not ok

    def retrying(self) -> None:
        self._retried_at = time.monotonic()

    def stuck(self) -> bool:
        """An export in flight has retried, or has been in flight for longer than ``EXPORT_STALL_MILLIS``."""
        with self._lock:
            oldest = min(self._started.values(), default=None)
        if oldest is None:
            return False
        return self._retried_at >= oldest or (time.monotonic() - oldest) * 1000 > EXPORT_STALL_MILLIS

    def down(self) -> bool:
        """The last export failed, or one is stuck: the backend is unreachable for now."""
        return self.failing or self.stuck()


class _RetryWatch(logging.Filter):
    """Notes the OTLP exporters' "Transient error ..., retrying in ..." warnings (it filters nothing out): the
    first attempt of an export failed, and the exporter now waits before the next one."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg
        if isinstance(msg, str) and msg.startswith("Transient error"):
            health.retrying()
        return True


_retry_watch = _RetryWatch()


def _watch_retries(exporter: Any) -> None:
    """Watch the loggers of the exporter's modules (the OTLP exporters log their retries there)."""
    for klass in type(exporter).__mro__:
        module = getattr(klass, "__module__", "") or ""
        if module.startswith("opentelemetry.exporter."):
            logger = logging.getLogger(module)
            if _retry_watch not in logger.filters:
                logger.addFilter(_retry_watch)


health = ExportHealth()


def _failed(result: Any) -> bool:
    return getattr(result, "name", None) == "FAILURE"


def _exporting(signal: str, health: ExportHealth, pid: int, count: int, export: Callable[[], Any]) -> Any:
    """Run one export of ``count`` items, counting them as dropped (``export_failed``) if it fails or raises.

    In a forked child the parent's exporters do nothing: their metric storage is the parent's (it exports it
    itself), and spans or records that still reach them came from tracers/loggers obtained before the fork
    (counted: ``forked_child``); the child builds its own pipeline (``pipeline._after_fork_in_child``).
    """
    if os.getpid() != pid:
        if signal != "metrics" and count:
            _selftelemetry.count(_selftelemetry.DROPPED, signal, "forked_child", count)
        return None
    gate = fork_gate
    gate.enter()
    token = health.begin()
    ok = False
    try:
        result = export()
        ok = not _failed(result)
        return result
    finally:
        health.end(token, ok)
        gate.leave()
        if not ok and count:
            _selftelemetry.count(_selftelemetry.DROPPED, signal, "export_failed", count)


class ForkGate:
    """Keeps the bridge's exports out of the moment a process forks.

    gRPC can only prepare a fork (its ``fork()`` handlers) when no thread is inside a gRPC call; otherwise the
    child inherits gRPC in a broken state ("Other threads are currently calling into gRPC, skipping fork()
    handlers"), and the child's own OTLP/gRPC exports hang. Before a fork, new exports wait and the fork waits
    (at most ``FORK_WAIT_MILLIS``, and not at all for exports that are stuck retrying) for those in flight.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._in_flight = 0
        self._forking = False

    def enter(self) -> None:
        with self._cond:
            deadline = time.monotonic() + FORK_WAIT_MILLIS / 1000
            while self._forking and (remaining := deadline - time.monotonic()) > 0:
                self._cond.wait(remaining)
            self._in_flight += 1

    def leave(self) -> None:
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()

    def before_fork(self) -> None:
        with self._cond:
            self._forking = True
            deadline = time.monotonic() + FORK_WAIT_MILLIS / 1000
            while self._in_flight and not health.stuck() and (remaining := deadline - time.monotonic()) > 0:
                self._cond.wait(min(remaining, 0.02))

    def after_fork_in_parent(self) -> None:
        with self._cond:
            self._forking = False
            self._cond.notify_all()


#: How long a fork may wait for the bridge's exports in flight (a reachable collector answers in milliseconds).
FORK_WAIT_MILLIS = env_millis("TORCHELASTIC_OTEL_FORK_WAIT_MILLIS", 1000)
fork_gate = ForkGate()


def _shutdown_inner(inner: Any, pid: int, timeout_millis: float | None, kwargs: dict[str, Any]) -> Any:
    if os.getpid() != pid:
        return None  # the parent's exporter (and its connection) stays the parent's
    shutdown = inner.shutdown
    try:
        accepts = "timeout_millis" in inspect.signature(shutdown).parameters
    except (TypeError, ValueError):
        accepts = False
    if accepts and timeout_millis is not None:
        return shutdown(timeout_millis=timeout_millis, **kwargs)
    return shutdown(**kwargs) if kwargs else shutdown()


class CountingExporter:
    """Delegates everything to a span or log record exporter; counts the items of a failed export as dropped
    (``torchelastic_otel.dropped`` ``{signal, reason="export_failed"}``) and tells the flush when exports are stuck."""

    def __init__(self, signal: str, inner: Any) -> None:
        self._signal, self._inner, self.health, self._pid = signal, inner, health, os.getpid()

    def export(self, batch: Any) -> Any:
        return _exporting(self._signal, self.health, self._pid, len(batch), lambda: self._inner.export(batch))

    def shutdown(self, timeout_millis: float | None = None, **kwargs: Any) -> Any:
        return _shutdown_inner(self._inner, self._pid, timeout_millis, kwargs)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis) if os.getpid() == self._pid else True

    def __getattr__(self, name: str) -> Any:
        if name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)

    def __repr__(self) -> str:
        return f"<counting {self._inner!r}>"


class CountingMetricExporter(CountingExporter):
    """The same for a metric exporter (a failed export counts its data points); it keeps the exporter's preferred
    temporality and aggregation, which ``PeriodicExportingMetricReader`` reads."""

    def __init__(self, inner: Any) -> None:
        super().__init__("metrics", inner)
        self._preferred_temporality = getattr(inner, "_preferred_temporality", None)
        self._preferred_aggregation = getattr(inner, "_preferred_aggregation", None)

    def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:  # type: ignore[override]
        return _exporting(
            "metrics",
            self.health,
            self._pid,
            _count_points(metrics_data),
            lambda: self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs),
        )

    def force_flush(self, timeout_millis: float = 10_000) -> bool:  # type: ignore[override]
        return self._inner.force_flush(timeout_millis=timeout_millis) if os.getpid() == self._pid else True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:  # type: ignore[override]
        if os.getpid() == self._pid:
            self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def _count_points(metrics_data: Any) -> int:
    try:
        return sum(
            len(metric.data.data_points)
            for resource_metrics in metrics_data.resource_metrics
            for scope_metrics in resource_metrics.scope_metrics
            for metric in scope_metrics.metrics
        )
    except Exception:
        return 0


def wrap_exporter(signal: str, exporter: Any) -> Any:
    """A span/log/metric exporter wrapped to count failed exports; anything else (a metric reader) as it is."""
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader

    if isinstance(exporter, MetricReader):
        return exporter
    _watch_retries(exporter)
    if isinstance(exporter, MetricExporter):
        return CountingMetricExporter(exporter)
    if callable(getattr(exporter, "export", None)):
        return CountingExporter(signal, exporter)
    return exporter


_processor_classes: dict[str, type] = {}


def _queue_full(processor: Any) -> bool:
    """Whether the SDK batch processor's queue (``OTEL_BLRP_MAX_QUEUE_SIZE`` / ``OTEL_BSP_MAX_QUEUE_SIZE``, default
    2048) is full or shut down, i.e. it would drop the item (full: the SDK drops the oldest one and logs a warning
    for every item). Reads the SDK's internal ``BatchProcessor``; ``False`` if its layout is unknown."""
    batch = getattr(processor, "_batch_processor", None)
    queue = getattr(batch, "_queue", None)
    limit = getattr(batch, "_max_queue_size", None)
    if queue is None or not isinstance(limit, int):
        return False
    return len(queue) >= limit or getattr(batch, "_shutdown", False) is True


def counting_batch_processor(base: type, signal: str) -> type:
    """``base`` (the SDK's BatchSpanProcessor / BatchLogRecordProcessor) counting what its full queue drops.

    When the queue is full (the backend is slow or down), the new item is dropped -- as the bridge's own buffers
    do -- and counted as ``torchelastic_otel.dropped {signal, reason="queue_full"}`` (``"after_shutdown"`` once the
    processor is shut down) instead of the SDK's warning per dropped item.
    """
    cls = _processor_classes.get(signal)
    if cls is not None:
        return cls
    method = "on_end" if signal == "traces" else "on_emit"

    def accept(self: Any, item: Any) -> Any:
        if _queue_full(self):
            if signal == "traces" and not (item.context and item.context.trace_flags.sampled):
                return None  # not exported anyway
            shut = getattr(self._batch_processor, "_shutdown", False) is True
            _selftelemetry.count(_selftelemetry.DROPPED, signal, "after_shutdown" if shut else "queue_full")
            return None
        return getattr(base, method)(self, item)

    cls = type(f"_Counting{base.__name__}", (base,), {method: accept, "__doc__": counting_batch_processor.__doc__})
    _processor_classes[signal] = cls
    return cls


def _after_fork_in_child() -> None:
    """A forked child starts with no exports in flight and no fork in progress (the locks may have been held)."""
    global health, fork_gate
    health = ExportHealth()
    fork_gate = ForkGate()


def _before_fork() -> None:
    fork_gate.before_fork()


def _after_fork_in_parent() -> None:
    fork_gate.after_fork_in_parent()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
