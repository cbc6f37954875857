"""Shared fixtures: an in-memory OpenTelemetry SDK pipeline and a clean slate of the bridge's global state."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import torchelastic_otel
from torchelastic_otel import events as te_events
from torchelastic_otel import pipeline
from torchelastic_otel.events import handlers as te_handlers
from torchelastic_otel.metrics import api as te_metrics_api

# The self-telemetry instruments are registered once per ``id(meter_provider)``: keep every provider a test built
# alive for the whole session so that a new provider can never reuse a dead one's id.
_KEEP_ALIVE: list[Any] = []


def wait_for(condition: Callable[[], Any], timeout: float = 5.0, interval: float = 0.005) -> Any:
    """Poll ``condition`` until it returns a truthy value (returned) or ``timeout`` seconds pass (AssertionError)."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout} s: {condition}")
        time.sleep(interval)


@dataclass
class InMemoryOtel:
    """An SDK pipeline whose exporters keep everything in memory (spans and logs exported synchronously)."""

    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    logger_provider: LoggerProvider
    spans: InMemorySpanExporter
    logs: InMemoryLogRecordExporter
    reader: InMemoryMetricReader

    @property
    def tracer(self) -> trace.Tracer:
        return self.tracer_provider.get_tracer("tests")

    def log_records(self) -> list[Any]:
        """The exported ``LogRecord``s (API objects: ``.body``, ``.attributes``, ``.trace_id``...), after a flush
        (the bridge buffers events and emits them from its drainer)."""
        torchelastic_otel.flush()
        return [readable.log_record for readable in self.logs.get_finished_logs()]

    def metric_points(self, name: str) -> list[tuple[dict, Any]]:
        """Collect once; ``(attributes, point)`` of every point of the instrument ``name``."""
        return points_of(self.reader.get_metrics_data(), name)


def points_of(metrics_data: Any, name: str) -> list[tuple[dict, Any]]:
    """``(attributes, point)`` of every point of instrument ``name`` in one collection's ``MetricsData``."""
    found = []
    if metrics_data is None:
        return found
    for resource_metrics in metrics_data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.name == name:
                    found.extend((dict(p.attributes or {}), p) for p in metric.data.data_points)
    return found


def metric_of(metrics_data: Any, name: str) -> Any:
    """The ``Metric`` (name, unit, data) called ``name`` in one collection, or ``None``."""
    if metrics_data is None:
        return None
    for resource_metrics in metrics_data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.name == name:
                    return metric
    return None


@pytest.fixture
def clean_state() -> Iterator[None]:
    """Restore the bridge's module-level routing state (metric handlers, event handlers and loggers) afterwards."""
    saved_metrics_map = dict(te_metrics_api._metrics_map)
    saved_default_metrics = te_metrics_api._default_metrics_handler
    saved_legacy = dict(te_events._legacy_handlers)
    saved_legacy_default = list(te_events._legacy_default)
    saved_log_handlers = dict(te_handlers._log_handlers)
    _forget_event_loggers(te_events._events_loggers)
    try:
        yield
    finally:
        te_metrics_api._metrics_map.clear()
        te_metrics_api._metrics_map.update(saved_metrics_map)
        te_metrics_api._default_metrics_handler = saved_default_metrics
        te_events._legacy_handlers.clear()
        te_events._legacy_handlers.update(saved_legacy)
        te_events._legacy_default[:] = saved_legacy_default
        _forget_event_loggers(te_events._events_loggers)
        te_handlers._log_handlers.clear()
        te_handlers._log_handlers.update(saved_log_handlers)


def _forget_event_loggers(loggers: dict) -> None:
    """Drop the cached per-destination loggers (and detach their handlers) so the next record rebuilds them."""
    for logger in loggers.values():
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
    loggers.clear()


@pytest.fixture
def otel(clean_state: None) -> Iterator[InMemoryOtel]:
    """The bridge set up (``torchelastic_otel.setup``) with in-memory SDK providers; the pipeline is forgotten after."""
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    logs = InMemoryLogRecordExporter()
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    _KEEP_ALIVE.extend((tracer_provider, meter_provider, logger_provider))
    torchelastic_otel.setup(
        tracer_provider=tracer_provider, meter_provider=meter_provider, logger_provider=logger_provider
    )
    try:
        yield InMemoryOtel(tracer_provider, meter_provider, logger_provider, spans, logs, reader)
    finally:
        pipeline._reset_for_tests()


@pytest.fixture
def paused_drainer() -> Iterator[Any]:
    """Suspend the background drainer so only flushes and collections move buffered values."""
    from torchelastic_otel._export import drainer as _drainer

    with _drainer.paused():
        yield _drainer
