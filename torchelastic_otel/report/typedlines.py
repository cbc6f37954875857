"""A line of OTLP JSON decoded by a typed schema: the reader's fast path, with msgspec (the ``report`` extra).

Most of a 1,000-node run's reading time was spent making and converting objects no view reads: every attribute
list is a list of ``{"key": ..., "value": {"stringValue": ...}}`` dicts, repeated on millions of records (every
rank's ``{"step": 5}``, every output line's stream), and every item carries fields nothing reads (descriptions,
flags, scopes). Decoded by msgspec into the ``Struct`` s below, an attribute list or a resource stays its raw JSON
text (``msgspec.Raw``: found, not parsed), which is looked up by its bytes: each distinct one is converted once.
Fields no view reads are skipped by the parser.

The fast path takes only what it can take exactly as the general path (``otlpjson.Reader``) would: a line the
schema rejects (an unknown top-level key, a ``null`` list, a value of another JSON type, an exponential histogram)
or an item whose conversion raises is handed whole to the general path, with nothing of it kept, so the records,
their order and every problem counted are the general path's. ``tests/unit/test_report_input.py`` reads lines both
ways and compares.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import msgspec
from msgspec import UNSET, Raw, Struct, UnsetType

from torchelastic_otel.report import otlpvalues as general
from torchelastic_otel.report.records import Point, Proc, SpanEvent, Telemetry

_NULL = Raw(b"null")  # an absent attribute list or resource: decoded as ``None``, as the general path reads it


class _Event(Struct, rename="camel"):
    name: Any = None
    time_unix_nano: Any = None
    attributes: Raw = _NULL


class _Span(Struct, rename="camel"):
    trace_id: Any = None
    span_id: Any = None
    parent_span_id: Any = None
    name: Any = None
    start_time_unix_nano: Any = None
    end_time_unix_nano: Any = None
    attributes: Raw = _NULL
    events: list[_Event] | None = None
    links: Any = None
    status: Any = None


class _Log(Struct, rename="camel"):
    time_unix_nano: Any = None
    observed_time_unix_nano: Any = None
    severity_number: Any = None
    severity_text: Any = None
    body: Any = None
    event_name: Any = None
    attributes: Raw = _NULL
    trace_id: Any = None
    span_id: Any = None


class _DataPoint(Struct, rename="camel"):
    attributes: Raw = _NULL
    time_unix_nano: Any = None
    as_double: Any = None
    as_int: Any = None
    count: Any = None
    sum: Any = None
    explicit_bounds: Any = None
    bucket_counts: Any = None
    min: Any = None
    max: Any = None


class _Data(Struct, rename="camel"):
    data_points: list[_DataPoint] = []
    is_monotonic: Any = False


class _Metric(Struct, rename="camel"):
    name: Any = None
    unit: Any = None
    gauge: _Data | None = None
    sum: _Data | None = None
    histogram: _Data | None = None
    exponential_histogram: Any = None  # not read by the fast path: such a line goes the general way
    summary: Any = None


class _ScopeSpans(Struct, rename="camel"):
    spans: list[_Span] = []


class _ScopeLogs(Struct, rename="camel"):
    log_records: list[_Log] = []


class _ScopeMetrics(Struct, rename="camel"):
    metrics: list[_Metric] = []


class _ResourceSpans(Struct, rename="camel"):
    resource: Raw = _NULL
    scope_spans: list[_ScopeSpans] = []


class _ResourceLogs(Struct, rename="camel"):
    resource: Raw = _NULL
    scope_logs: list[_ScopeLogs] = []


class _ResourceMetrics(Struct, rename="camel"):
    resource: Raw = _NULL
    scope_metrics: list[_ScopeMetrics] = []


class _Line(Struct, rename="camel", forbid_unknown_fields=True):
    """A line: an unknown top-level key is the general path's to count."""

    resource_spans: list[_ResourceSpans] | UnsetType = UNSET
    resource_logs: list[_ResourceLogs] | UnsetType = UNSET
    resource_metrics: list[_ResourceMetrics] | UnsetType = UNSET


_DECODE = msgspec.json.Decoder(_Line).decode
_DECODE_ANY = msgspec.json.Decoder().decode
#: distinct attribute lists (or resources) remembered by their text; past this many, new ones are converted each
#: time (a run whose every record has its own attributes would otherwise keep each one's text twice)
MAX_REMEMBERED = 1 << 18


#: top-level key -> the ``_Line`` field
_FIELDS = {"resourceSpans": "resource_spans", "resourceLogs": "resource_logs", "resourceMetrics": "resource_metrics"}


def _named(line: _Line) -> bool:
    """Whether the line names a signal (an empty list of one is still OTLP)."""
    return any(blocks is not UNSET for blocks in (line.resource_spans, line.resource_logs, line.resource_metrics))


class Reader(Protocol):
    """What the typed path uses of ``otlpjson.Reader``: its records, caches and processes."""

    telemetry: Telemetry
    _bounds: dict[tuple[float, ...], tuple[float, ...]]

    @property
    def procs(self) -> Any: ...

    def _shared(self, attrs: dict[str, Any]) -> dict[str, Any]: ...

    def span(self, trace_id: Any, span_id: Any, parent_id: Any, name: Any, start: int, end: int, attrs: Any,
             attrs_of: Callable[[Any], dict[str, Any]], status: dict[str, Any], events: list[SpanEvent],
             proc: Proc) -> None: ...  # fmt: skip

    def log(self, time: Any, observed: Any, severity: Any, severity_text: Any, body: Any, event_name: Any, attrs: Any,
            attrs_of: Callable[[Any], dict[str, Any]], trace_id: Any, span_id: Any,
            proc: Proc) -> None: ...  # fmt: skip


class Bail(Exception):
    """The line is not the fast path's to read: the general path reads it whole."""


class TypedLines:
    """The fast path of one ``Reader``: converts a line's items as the reader's general path does, or nothing."""

    def __init__(self, reader: Reader) -> None:
        self._reader = reader
        self._attrs: dict[bytes, dict[str, Any]] = {}
        self._procs: dict[bytes, Proc] = {}

    def forget(self) -> None:
        """Forget the texts seen (``Reader.forget``)."""
        self._attrs, self._procs = {}, {}

    def read(self, text: str, pinned: Proc | None, pinned_key: str | None) -> _Line:
        """Read ``text`` (a line, its first resource perhaps cut out: then ``pinned`` is the process of the first
        block of ``pinned_key``), or raise ``Bail`` having kept nothing."""
        try:
            line = _DECODE(text)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise Bail from exc
        tel = self._reader.telemetry
        sizes = (len(tel.spans), len(tel.logs), len(tel.points))
        try:
            self._convert(line, pinned, pinned_key)
        except Exception as exc:  # whatever the general path would count or reject, it does
            del tel.spans[sizes[0] :], tel.logs[sizes[1] :], tel.points[sizes[2] :]
            raise Bail from exc
        return line

    def first_resource(self, line: _Line, key: str) -> tuple[str, Proc]:
        """The text of the first ``key`` block's resource, as the parser delimited it, and its process."""
        raw = getattr(line, _FIELDS[key])[0].resource
        return bytes(raw).decode(), self._proc(raw)

    def _convert(self, line: _Line, pinned: Proc | None, pinned_key: str | None) -> None:
        if not _named(line):
            raise Bail("no signal: the general path counts it")
        if line.resource_spans is not UNSET:
            for index, spans in enumerate(line.resource_spans):
                pin = pinned if index == 0 and pinned_key == "resourceSpans" else None
                proc = self._block_proc(spans.resource, pin)
                for scope in spans.scope_spans:
                    for span in scope.spans:
                        self._add_span(span, proc)
        if line.resource_logs is not UNSET:
            for index, logs in enumerate(line.resource_logs):
                pin = pinned if index == 0 and pinned_key == "resourceLogs" else None
                proc = self._block_proc(logs.resource, pin)
                for log_scope in logs.scope_logs:
                    for record in log_scope.log_records:
                        self._add_log(record, proc)
        if line.resource_metrics is not UNSET:
            for index, metrics in enumerate(line.resource_metrics):
                pin = pinned if index == 0 and pinned_key == "resourceMetrics" else None
                proc = self._block_proc(metrics.resource, pin)
                for metric_scope in metrics.scope_metrics:
                    for metric in metric_scope.metrics:
                        self._add_metric(metric, proc)

    # ---- shared parts ----------------------------------------------------------------------------------------

    def _block_proc(self, raw: Raw, pinned: Proc | None) -> Proc:
        """A block's process: ``pinned`` when its resource text was cut out (``Reader._known_resource``)."""
        return pinned if pinned is not None else self._proc(raw)

    def _proc(self, raw: Raw) -> Proc:
        key = bytes(raw)
        proc = self._procs.get(key)
        if proc is None:
            proc = self._reader.procs.get(_DECODE_ANY(key) or {})
            if len(self._procs) < MAX_REMEMBERED:
                self._procs[key] = proc
        return proc

    def _attributes(self, raw: Raw) -> dict[str, Any]:
        key = bytes(raw)
        attrs = self._attrs.get(key)
        if attrs is None:
            attrs = self._reader._shared(general.attributes(_DECODE_ANY(key)))
            if len(self._attrs) < MAX_REMEMBERED:
                self._attrs[key] = attrs
        return attrs

    # ---- items: each as ``Reader._add_span`` / ``_add_log`` / ``_add_metric`` makes it ---------------------------

    def _add_span(self, span: _Span, proc: Proc) -> None:
        reader = self._reader
        status = span.status
        if status is None:
            status = general._EMPTY
        elif type(status) is not dict:
            raise Bail("status")
        start = general._i64(span.start_time_unix_nano, "start_time_unix_nano")
        end = general._i64(span.end_time_unix_nano, "end_time_unix_nano")
        events = [self._event(event) for event in span.events] if span.events else general._NO_EVENTS
        links = span.links
        if links is not None and type(links) is not list:
            raise Bail("links")
        reader.span(span.trace_id, span.span_id, span.parent_span_id, span.name, start, end, span.attributes,
                    self._attributes, status, events, proc)  # fmt: skip

    def _event(self, event: _Event) -> SpanEvent:
        name = event.name
        name = general._intern(name if type(name) is str else general._str(name, "name"))
        return SpanEvent(name, general._i64(event.time_unix_nano, "time_unix_nano"), self._attributes(event.attributes))

    def _add_log(self, record: _Log, proc: Proc) -> None:
        self._reader.log(record.time_unix_nano, record.observed_time_unix_nano, record.severity_number,
                         record.severity_text, record.body, record.event_name, record.attributes, self._attributes,
                         record.trace_id, record.span_id, proc)  # fmt: skip

    def _add_metric(self, metric: _Metric, proc: Proc) -> None:
        if metric.exponential_histogram is not None or metric.summary is not None:
            raise Bail("a kind the fast path does not read")
        name, unit = metric.name, metric.unit
        name = general._intern(name if type(name) is str else general._str(name, "name"))
        unit = general._intern(unit if type(unit) is str else general._str(unit, "unit"))
        out = self._reader.telemetry.points
        for kind, data in (("gauge", metric.gauge), ("sum", metric.sum), ("histogram", metric.histogram)):
            if data is None:
                continue
            monotonic = bool(data.is_monotonic)
            for dp in data.data_points:
                number, count = general.point_value(kind, dp.as_double, dp.as_int, dp.count, dp.sum)
                point = Point(name, kind, unit, general._i64(dp.time_unix_nano, "time_unix_nano"), number,
                              self._attributes(dp.attributes), proc, monotonic, count)  # fmt: skip
                if kind == "histogram":
                    general.distribution(point, dp.sum, dp.explicit_bounds, dp.bucket_counts, dp.min, dp.max)
                    point.bounds = self._reader._bounds.setdefault(point.bounds, point.bounds)
                out.append(point)
