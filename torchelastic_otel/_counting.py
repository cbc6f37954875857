"""The bridge's exporters and batch processors account for what they lose.

- Each span, log record and metric exporter the bridge builds is wrapped (``wrap_exporter``): a failed export
  counts its items as dropped (``torchelastic_otel.dropped {signal, reason="export_failed"}``) and tells
  ``_health`` what is in flight, so a flush can stop waiting for the OTLP exporters' 10 s of retries. Exports keep
  out of the moment a process forks (``_forkgate``); in a forked child the parent's exporters do nothing.
- The SDK batch processors count what a full queue drops (``counting_batch_processor``) instead of logging a
  warning per item, and say how much they still hold (``pending``): what a process that ends now loses.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

from torchelastic_otel import _compat, _forkgate, _health, _selftelemetry
from torchelastic_otel._health import ExportHealth

def _failed(result: Any) -> bool:
    return getattr(result, "name", None) == "FAILURE"


def _exporting(signal: str, health: ExportHealth, pid: int, count: int, export: Callable[[], Any]) -> Any:
    """Run one export of ``count`` items, counting them as dropped (``export_failed``) if it fails or raises.

    In a forked child the parent's exporters do nothing: their metric storage is the parent's (it exports it
    itself), and spans or records that still reach them came from tracers/loggers obtained before the fork
    (counted: ``forked_child``); the child builds its own pipeline (``_fork``).
    """
    if os.getpid() != pid:
        if signal != "metrics" and count:
            _selftelemetry.count(_selftelemetry.DROPPED, signal, "forked_child", count)
        return None
    gate = _forkgate.gate
    gate.enter()
    token = health.begin(signal, count)
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
        self._signal, self._inner, self.health, self._pid = signal, inner, _health.health, os.getpid()

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
    _health.watch_retries(exporter)
    if isinstance(exporter, MetricExporter):
        return CountingMetricExporter(exporter)
    if callable(getattr(exporter, "export", None)):
        return CountingExporter(signal, exporter)
    return exporter


_processor_classes: dict[str, type] = {}


def _queue_full(processor: Any) -> bool:
    """Whether the SDK batch processor's queue (``OTEL_BLRP_MAX_QUEUE_SIZE`` / ``OTEL_BSP_MAX_QUEUE_SIZE``, default
    2048) is full or shut down, i.e. it would drop the item (the SDK drops the oldest one and logs a warning for
    every item)."""
    state = _compat.batch_queue(processor)
    return state is not None and (state.length >= state.limit or state.shut_down)


def pending(processor: Any) -> int:
    """Items a batch processor still holds (queued, not yet exported); 0 if unknown."""
    state = _compat.batch_queue(processor)
    return 0 if state is None else state.length


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
            state = _compat.batch_queue(self)
            shut = state is not None and state.shut_down
            _selftelemetry.count(_selftelemetry.DROPPED, signal, "after_shutdown" if shut else "queue_full")
            return None
        return getattr(base, method)(self, item)

    cls = type(f"_Counting{base.__name__}", (base,), {method: accept, "__doc__": counting_batch_processor.__doc__})
    _processor_classes[signal] = cls
    return cls


