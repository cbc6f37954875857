"""Metric adapter: torchelastic metric streams become OpenTelemetry instruments.

``emit`` is on the job's hot path (torch's agent calls it many times a second, users may call it per step), and an
SDK instrument call costs many times torch's whole null ``put_metric``. So ``emit`` only appends the ``MetricData``
to a bounded buffer; the values reach the SDK instruments (chosen by the rule table in :mod:`.rules`) from a
background drainer (``torchelastic_otel._export.drainer``): every ``TORCHELASTIC_OTEL_DRAIN_INTERVAL``, at the start
of every metric collection, and at every flush. A full buffer drops the newest value and counts it; nothing blocks
the caller.

A metric's group and name become the instrument name and its attributes; both are made encodable first
(``_export.attributes.encodable``: lone surrogates become U+FFFD, counted once per distinct stream as
``sanitized{signal="metrics", reason="lone_surrogates"}``), so no value can fail a metric export.
"""

from __future__ import annotations

import collections
import logging
import math
import time
from collections.abc import Callable
from typing import Any, SupportsFloat, cast

from opentelemetry.metrics import Meter, MeterProvider

from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel import pipeline
from torchelastic_otel._export import attributes as _attributes
from torchelastic_otel._export import drainer as _drainer
from torchelastic_otel.metrics.api import MetricData, MetricHandler
from torchelastic_otel.metrics.rules import DEFAULT_RULES, DURATION_BUCKETS_S, Binding, MetricRule, resolve
from torchelastic_otel.version import __version__

__all__ = ["OtelMetricHandler", "DEFAULT_MAX_PENDING"]

_logger = logging.getLogger("torchelastic_otel")

#: Values buffered per handler before new ones are dropped (and counted).
DEFAULT_MAX_PENDING = 65536
#: Distinct (group, name) pairs whose resolution is cached; further ones are resolved on every value.
_MAX_BINDINGS = 4096
_INT64 = 2**63


def _number(value: object) -> float | int | None:
    """A finite int/float for ``value`` (bools count as ints), else ``None``."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        if -_INT64 <= value < _INT64:
            return value
        try:
            return float(value)  # beyond int64: the nearest float, as precise as any backend stores it
        except OverflowError:  # beyond float too (> ~1.8e308)
            return None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    try:
        number = float(cast(SupportsFloat, value))  # numpy scalars, torch 0-d tensors, Decimals: float() decides
    except (TypeError, ValueError, OverflowError):
        return None
    except Exception:
        return None
    return number if math.isfinite(number) else None


#: How a drain combines the values of one binding: added up (counters), the last one (gauges), or each (histograms).
_ADD, _SET, _EACH = "add", "set", "each"
_COMBINE = {"counter": _ADD, "updown_counter": _ADD, "gauge": _SET, "histogram": _EACH}
#: Values a drain takes at a time (between two looks at its deadline).
_CHUNK = 1024


class _Bound:
    """A resolved (group, name): the SDK call to make, the scale, the attributes and what values it accepts."""

    __slots__ = ("call", "scale", "attributes", "non_negative", "kind")

    def __init__(self, call: Callable[..., None], binding: Binding) -> None:
        self.call = call
        self.scale = binding.scale
        self.attributes = binding.attributes
        self.non_negative = binding.kind in ("counter", "histogram")
        self.kind = _COMBINE.get(binding.kind, _EACH)


class OtelMetricHandler(_drainer.Buffer, MetricHandler):
    """A ``MetricHandler`` exporting to OpenTelemetry instruments by a rule table.

    Args:
        meter_provider: the provider to use; default: the bridge's pipeline (global or built from ``OTEL_*``).
        rules: the rule table (default :data:`~torchelastic_otel.metrics.DEFAULT_RULES`).
        delegate: another handler that also receives every value (e.g. ``ConsoleMetricHandler()``).
        max_pending: buffer bound; values beyond it are dropped and counted.
    """

    def __init__(
        self,
        meter_provider: MeterProvider | None = None,
        rules: list[MetricRule] | tuple[MetricRule, ...] | None = None,
        delegate: MetricHandler | None = None,
        max_pending: int = DEFAULT_MAX_PENDING,
    ) -> None:
        self.delegate = delegate
        self.rules = tuple(rules) if rules is not None else DEFAULT_RULES
        self._meter_provider = meter_provider
        _drainer.Buffer.__init__(self, max_pending)
        self._generation = -1
        self._meter: Meter | None = None
        self._instruments: dict[str, Any] = {}  # the SDK's instruments by name
        self._bound: dict[tuple[str, str], _Bound] = {}
        # The bridge's providers become the global ones now, before the application starts spans, and the
        # self-telemetry instruments are registered (by the pipeline, when it is built): their collection callback
        # drains the buffer, so even the first collection (e.g. a Prometheus scrape before the drainer's first
        # run) sees every value put before it.
        if meter_provider is not None:
            selftelemetry.instrument(meter_provider)
        else:
            pipeline.prepare()
        _drainer.register(self)

    signal = "metrics"

    # -- hot path ------------------------------------------------------------------------------------------------
    def emit(self, metric_data: MetricData) -> None:
        """Buffer one value (O(1), no lock, no SDK call)."""
        pending = self._pending
        if len(pending) < self.max_pending:
            pending.append(metric_data)
        else:
            self._overflow += 1
        if self.delegate is not None:
            self.delegate.emit(metric_data)

    # -- off the hot path ----------------------------------------------------------------------------------------
    def drain(self, deadline: float | None = None) -> int:
        """Move buffered values into their instruments, oldest first, until ``deadline`` (``time.monotonic()``) if
        given; returns how many were recorded. Never raises.

        An SDK instrument call is costly, and a training loop may put values every step: so the values of one
        counter are added up and only the last value of a gauge is set, one SDK call per instrument and chunk.
        What an exporter or a scrape sees is the same (a cumulative sum, the last value); histograms still get
        every value.
        """
        with self._lock:
            self._count_overflow()
            pending = self._pending
            if not pending:
                return 0
            self._ensure_meter()
            recorded = 0
            while pending:
                recorded += self._drain_chunk(pending)
                if deadline is not None and time.monotonic() >= deadline:
                    break
            return recorded

    def _drain_chunk(self, pending: collections.deque[MetricData]) -> int:
        """Record up to ``_CHUNK`` values: counters summed and gauges last-valued per instrument and attributes."""
        totals: dict[_Bound, float] = {}
        recorded = 0
        for _ in range(_CHUNK):
            try:
                data = pending.popleft()
            except IndexError:
                break
            accepted = self._accept(data)
            if accepted is None:
                continue
            bound, value = accepted
            recorded += 1
            if bound.kind == _ADD:
                totals[bound] = totals.get(bound, 0) + value
            elif bound.kind == _SET:
                totals[bound] = value
            else:
                self._call(bound, value)
        for bound, value in totals.items():
            if type(value) is int and not -_INT64 <= value < _INT64:
                value = float(value)  # a sum beyond int64 (the values were each within it)
            self._call(bound, value)
        return recorded

    def _accept(self, data: MetricData) -> tuple[_Bound, float] | None:
        """The instrument binding and the scaled value of ``data``; ``None`` if it is dropped (counted)."""
        try:
            group, name = data.group_name, data.name
            if type(name) is not str:  # torch accepts any name and group; an unhashable one cannot be a key
                name = str(name)
            if type(group) is not str:
                group = str(group)
            key = (group, name)
            bound = self._bound.get(key)
            if bound is None:
                bound = self._bind(group, name)
                if len(self._bound) < _MAX_BINDINGS:
                    self._bound[key] = bound
            value = _number(data.value)
            if value is None:
                selftelemetry.count(selftelemetry.DROPPED, "metrics", "non_numeric_value")
                return None
            if bound.non_negative and value < 0:
                selftelemetry.count(selftelemetry.DROPPED, "metrics", "negative_value")
                return None
            return bound, (value * bound.scale if bound.scale != 1.0 else value)
        except Exception as exc:
            selftelemetry.count(selftelemetry.DROPPED, "metrics", "record_error")
            _logger.debug("torchelastic_otel: metric dropped: %s", exc, exc_info=True)
            return None

    @staticmethod
    def _call(bound: _Bound, value: float) -> None:
        try:
            bound.call(value, bound.attributes)
        except Exception as exc:
            selftelemetry.count(selftelemetry.DROPPED, "metrics", "record_error")
            _logger.debug("torchelastic_otel: metric dropped: %s", exc, exc_info=True)

    def _ensure_meter(self) -> None:
        if self._meter_provider is not None:
            if self._meter is None:
                self._meter = self._meter_provider.get_meter("torchelastic_otel", __version__)
                selftelemetry.instrument(self._meter_provider)
            return
        generation = pipeline.generation()
        if self._meter is None or generation != self._generation:
            provider = pipeline.get_pipeline().meter_provider
            self._meter = provider.get_meter("torchelastic_otel", __version__)
            selftelemetry.instrument(provider)
            self._instruments.clear()
            self._bound.clear()
            self._generation = generation

    def _bind(self, group: str, name: str) -> _Bound:
        """Resolve ``(group, name)`` (made encodable: they become attribute values) to its instrument."""
        group, name = _attributes.encodable(group, "metrics"), _attributes.encodable(name, "metrics")
        binding = resolve(self.rules, group, name)
        instrument = self._instruments.get(binding.instrument)
        if instrument is None:
            instrument = self._create(binding)
            self._instruments[binding.instrument] = instrument
        if binding.kind == "histogram":
            call = instrument.record
        elif binding.kind == "gauge":
            call = instrument.set
        else:
            call = instrument.add
        return _Bound(call, binding)

    def _create(self, binding: Binding) -> Any:  # an SDK instrument of the binding's kind
        meter, name = self._meter, binding.instrument
        if meter is None:  # never: a drain gets its meter first
            raise RuntimeError("no meter")
        # A user's rule may carry any text; the description is sent as it is (an unencodable one fails the export).
        unit, desc = (
            _attributes.encodable(text, "metrics") if isinstance(text, str) else text
            for text in (binding.unit, binding.description)
        )
        if binding.kind == "counter":
            return meter.create_counter(name, unit=unit, description=desc)
        if binding.kind == "updown_counter":
            return meter.create_up_down_counter(name, unit=unit, description=desc)
        if binding.kind == "histogram":
            buckets = DURATION_BUCKETS_S if unit == "s" else None
            return meter.create_histogram(
                name, unit=unit, description=desc, explicit_bucket_boundaries_advisory=buckets
            )
        return meter.create_gauge(name, unit=unit, description=desc)
