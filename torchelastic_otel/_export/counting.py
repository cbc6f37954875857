"""The bridge's exporters and batch processors account for what they lose.

- Each span, log record and metric exporter the bridge builds is wrapped (``wrap_exporter``): a failed export counts its
  items as dropped (``torchelastic_otel.dropped {signal, reason="export_failed"}``) and tells ``_export.health`` what is
  in flight, so a flush can stop waiting for the OTLP exporters' 10 s of retries. Exports keep out of the moment a
  process forks (``forkgate``); in a forked child the parent's exporters do nothing.
- One unencodable item never costs the rest of its batch. The OTLP encoders fail a whole export on one string
  UTF-8 cannot encode (a lone surrogate, e.g. a non-UTF-8 file name through ``surrogateescape``), one log body
  of a type ``AnyValue`` has no form for, or one integer beyond int64 -- the gRPC exporter raises, the HTTP
  exporter returns FAILURE. The bridge's own records are made encodable where they are built
  (``_export.attributes.encodable``); records made through the plain OpenTelemetry API on the bridge's providers are
  not, so after a failed export (only then: the normal path costs nothing) the batch is searched for such items
  (``unencodable``); if there are any, they are dropped and counted (``dropped {signal, reason="unencodable"}``)
  and the rest is exported again, once.
- The SDK batch processors count what a full queue drops (``counting_batch_processor``) instead of logging a
  warning per item, and say how much they still hold (``pending``): what a process that ends now loses.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torchelastic_otel import _compat
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._export import forkgate
from torchelastic_otel._export import health as _health
from torchelastic_otel._export.health import ExportHealth


def _failed(result: object) -> bool:
    return getattr(result, "name", None) == "FAILURE"


#: What a salvage finds in a failed batch: ``None`` (nothing unencodable), or how many items are left and how to
#: export them (the unencodable ones are already counted).
Rest = tuple[int, Callable[[], object]] | None


def _exporting(
    signal: str,
    health: ExportHealth,
    pid: int,
    count: int,
    export: Callable[[], object],
    salvage: Callable[[], Rest] | None = None,
) -> object:
    """Run one export of ``count`` items, counting them as dropped (``export_failed``) if it fails or raises.

    If it fails (or raises) and ``salvage`` finds unencodable items in the batch, those are dropped (counted by
    ``salvage``) and the rest is exported again: its result is the export's result.

    In a forked child the parent's exporters do nothing: their metric storage is the parent's (it exports it
    itself), and spans or records that still reach them came from tracers/loggers obtained before the fork
    (counted: ``forked_child``); the child builds its own pipeline (``_fork``).
    """
    if os.getpid() != pid:
        if signal != "metrics" and count:
            selftelemetry.count(selftelemetry.DROPPED, signal, "forked_child", count)
        return None
    gate = forkgate.gate
    gate.enter()
    token = health.begin(signal, count)
    ok = False
    lost = count
    try:
        try:
            result = export()
        except Exception:
            rest = salvage() if salvage is not None else None
            if rest is None:
                raise
            lost, export_rest = rest
            result = export_rest()
        else:
            if salvage is not None and _failed(result):
                rest = salvage()
                if rest is not None:
                    lost, export_rest = rest
                    result = export_rest()
        ok = not _failed(result)
        return result
    finally:
        health.end(token, ok)
        gate.leave()
        if not ok and lost:
            selftelemetry.count(selftelemetry.DROPPED, signal, "export_failed", lost)


# ---- unencodable items ---------------------------------------------------------------------------------------
# What the OTLP encoders cannot encode, and so fails their whole export: a string UTF-8 cannot encode in a field
# set directly (not an attribute: a bad attribute is dropped alone by the encoder), a log body of a type AnyValue
# has no form for, an integer beyond int64 as a body or a metric value. Only read after a failed export.

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
#: Deeper log bodies are taken as unencodable (the encoder recurses into them; a cycle never ends).
_MAX_BODY_DEPTH = 200


def _bad_text(value: object) -> bool:
    """A string field the encoder cannot set: not a string, or a string with lone surrogates (``None``: unset)."""
    if value is None:
        return False
    if not isinstance(value, str):
        return True
    if value.isascii():
        return False
    try:
        str.encode(value, "utf-8")
        return False
    except UnicodeEncodeError:
        return True


def _bad_body(value: object, depth: int = 0) -> bool:
    """Whether a log body has no OTLP ``AnyValue`` form (the encoder's own order of type checks)."""
    if value is None or isinstance(value, (bool, float, bytes)):
        return False
    if isinstance(value, str):
        return _bad_text(value)
    if isinstance(value, int):
        return not _INT64_MIN <= value <= _INT64_MAX
    if depth >= _MAX_BODY_DEPTH:
        return True
    if isinstance(value, Sequence):
        return any(_bad_body(item, depth + 1) for item in value)
    if isinstance(value, Mapping):
        for key, item in value.items():
            try:
                if _bad_text(str(key)) or _bad_body(item, depth + 1):
                    return True
            except Exception:  # a key's __str__ raising fails the encoder too
                return True
        return False
    return True


def _bad_scope(scope: object) -> bool:
    if scope is None:
        return False
    return any(_bad_text(getattr(scope, field, None)) for field in ("name", "version", "schema_url"))


def _bad_resource(resource: object) -> bool:
    return resource is not None and _bad_text(getattr(resource, "schema_url", None))


def _bad_log(item: object) -> bool:
    """A log record (``ReadableLogRecord``, or ``LogData`` of older SDKs) the OTLP encoder would fail on."""
    record = getattr(item, "log_record", item)
    return (
        _bad_body(getattr(record, "body", None))
        or _bad_text(getattr(record, "event_name", None))
        or _bad_text(getattr(record, "severity_text", None))
        or _bad_scope(getattr(item, "instrumentation_scope", None))
        or _bad_resource(getattr(item, "resource", None) or getattr(record, "resource", None))
    )


def _bad_span(span: object) -> bool:
    """A span the OTLP encoder would fail on (its name, status description, an event's name, scope, resource)."""
    return (
        _bad_text(getattr(span, "name", None))
        or _bad_text(getattr(getattr(span, "status", None), "description", None))
        or any(_bad_text(getattr(event, "name", None)) for event in (getattr(span, "events", None) or ()))
        or _bad_scope(getattr(span, "instrumentation_scope", None))
        or _bad_resource(getattr(span, "resource", None))
    )


def _bad_metric(metric: object) -> bool:
    """A metric the OTLP encoder would fail on: its name, description or unit, or an int value beyond int64."""
    if any(_bad_text(getattr(metric, field, None)) for field in ("name", "description", "unit")):
        return True
    for point in getattr(getattr(metric, "data", None), "data_points", None) or ():
        value = getattr(point, "value", None)
        if type(value) is int and not _INT64_MIN <= value <= _INT64_MAX:
            return True
    return False


_UNENCODABLE = "unencodable"


def _success(signal: str) -> object:
    """The SUCCESS result of ``signal``'s exporters (returned when nothing encodable was left to export)."""
    if signal == "traces":
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.SUCCESS
    from opentelemetry.sdk._logs import export as logs_export

    result = getattr(logs_export, "LogRecordExportResult", None) or logs_export.LogExportResult
    return result.SUCCESS


def _salvage_items(signal: str, batch: Any, export: Callable[[object], object]) -> Rest:
    """Drop (and count) the unencodable spans or log records of a failed ``batch``; the rest, to export again.
    ``None`` when every item is encodable (the failure had another cause)."""
    bad = _bad_span if signal == "traces" else _bad_log
    try:
        keep = [item for item in batch if not bad(item)]
    except Exception:
        return None
    dropped = len(batch) - len(keep)
    if not dropped:
        return None
    selftelemetry.count(selftelemetry.DROPPED, signal, _UNENCODABLE, dropped)
    if not keep:
        return 0, lambda: _success(signal)
    return len(keep), lambda: export(keep)


def _salvage_metrics(metrics_data: Any, export: Callable[[object], object]) -> Rest:
    """The same for metrics: the metrics that cannot be encoded (a bad scope or resource: all of its metrics) are
    left out, their data points counted."""
    from opentelemetry.sdk.metrics.export import MetricExportResult

    try:
        removed = dropped = kept = 0
        resource_metrics = []
        for rm in metrics_data.resource_metrics:
            scopes = []
            whole = _bad_resource(rm.resource)
            for sm in rm.scope_metrics:
                out = whole or _bad_scope(sm.scope)
                good = []
                for metric in sm.metrics:
                    if out or _bad_metric(metric):
                        removed += 1
                        dropped += _count_points_of(metric)
                    else:
                        good.append(metric)
                        kept += _count_points_of(metric)
                if good:
                    scopes.append(dataclasses.replace(sm, metrics=good))
            if scopes:
                resource_metrics.append(dataclasses.replace(rm, scope_metrics=scopes))
        if not removed:
            return None
        salvaged = dataclasses.replace(metrics_data, resource_metrics=resource_metrics)
    except Exception:
        return None
    if dropped:
        selftelemetry.count(selftelemetry.DROPPED, "metrics", _UNENCODABLE, dropped)
    if not resource_metrics:
        return 0, lambda: MetricExportResult.SUCCESS
    return kept, lambda: export(salvaged)


def _shutdown_inner(inner: Any, pid: int, timeout_millis: float | None, kwargs: dict[str, object]) -> object:
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
    (``torchelastic_otel.dropped`` ``{signal, reason="export_failed"}``), drops only the unencodable items of a
    batch the encoder failed on (``reason="unencodable"``), and tells the flush when exports are stuck."""

    def __init__(self, signal: str, inner: Any) -> None:
        self._signal, self._inner, self.health, self._pid = signal, inner, _health.health, os.getpid()

    def export(self, batch: Any) -> object:
        inner = self._inner
        return _exporting(
            self._signal,
            self.health,
            self._pid,
            len(batch),
            lambda: inner.export(batch),
            lambda: _salvage_items(self._signal, batch, inner.export),
        )

    def shutdown(self, timeout_millis: float | None = None, **kwargs: object) -> object:
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

    def __init__(self, inner: object) -> None:
        super().__init__("metrics", inner)
        self._preferred_temporality = getattr(inner, "_preferred_temporality", None)
        self._preferred_aggregation = getattr(inner, "_preferred_aggregation", None)

    def export(self, metrics_data: object, timeout_millis: float = 10_000, **kwargs: object) -> object:  # type: ignore[override]
        return _exporting(
            "metrics",
            self.health,
            self._pid,
            _count_points(metrics_data),
            lambda: self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs),
            lambda: _salvage_metrics(
                metrics_data, lambda data: self._inner.export(data, timeout_millis=timeout_millis, **kwargs)
            ),
        )

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis=timeout_millis) if os.getpid() == self._pid else True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:  # type: ignore[override]
        if os.getpid() == self._pid:
            self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def _count_points_of(metric: object) -> int:
    return len(getattr(getattr(metric, "data", None), "data_points", None) or ())


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


def wrap_exporter(signal: str, exporter: object) -> object:
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


def _queue_full(processor: object) -> bool:
    """Whether the SDK batch processor's queue (``OTEL_BLRP_MAX_QUEUE_SIZE`` / ``OTEL_BSP_MAX_QUEUE_SIZE``, default
    2048) is full or shut down, i.e. it would drop the item (the SDK drops the oldest one and logs a warning for
    every item)."""
    state = _compat.batch_queue(processor)
    return state is not None and (state.length >= state.limit or state.shut_down)


def pending(processor: object) -> int:
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

    def accept(self: object, item: Any) -> object:
        if _queue_full(self):
            if signal == "traces" and not (item.context and item.context.trace_flags.sampled):
                return None  # not exported anyway
            state = _compat.batch_queue(self)
            shut = state is not None and state.shut_down
            selftelemetry.count(selftelemetry.DROPPED, signal, "after_shutdown" if shut else "queue_full")
            return None
        return getattr(base, method)(self, item)

    cls = type(f"_Counting{base.__name__}", (base,), {method: accept, "__doc__": counting_batch_processor.__doc__})
    _processor_classes[signal] = cls
    return cls
