"""In-memory OpenTelemetry SDK pipelines (the ``otel`` fixture of ``tests/conftest.py``) and reading their metrics."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import torchelastic_otel

# The self-telemetry instruments are registered once per ``id(meter_provider)``: keep every provider a test built
# alive for the whole session so that a new provider can never reuse a dead one's id.
KEEP_ALIVE: list[Any] = []


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


def metrics_named(metrics_data: Any, name: str) -> Iterator[Any]:
    """Every ``Metric`` (name, unit, data) called ``name`` in one collection's ``MetricsData`` (``None``: none)."""
    if metrics_data is None:
        return
    for resource_metrics in metrics_data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            yield from (metric for metric in scope_metrics.metrics if metric.name == name)


def points_of(metrics_data: Any, name: str) -> list[tuple[dict, Any]]:
    """``(attributes, point)`` of every point of instrument ``name`` in one collection's ``MetricsData``."""
    return [
        (dict(p.attributes or {}), p) for metric in metrics_named(metrics_data, name) for p in metric.data.data_points
    ]


def metric_of(metrics_data: Any, name: str) -> Any:
    """The ``Metric`` (name, unit, data) called ``name`` in one collection, or ``None``."""
    return next(metrics_named(metrics_data, name), None)
