"""A line of OTLP JSON decoded by a typed schema: the reader's fast path, with msgspec (the ``report`` extra).

Most of the general path's time on a large run goes to making and converting objects no view reads: every attribute
list is a list of ``{"key": ..., "value": {"stringValue": ...}}`` dicts, repeated on millions of records (every
rank's ``{"step": 5}``, every output line's stream), and every item carries fields nothing reads (descriptions,
flags, scopes). Decoded by msgspec into the ``Struct`` s below, an attribute list, a resource and a histogram
point's bounds and bucket counts stay their raw JSON text (``msgspec.Raw``: found, not parsed), which is looked up by
its bytes: each distinct one is converted once.
Fields no view reads are skipped by the parser.

The fast path takes only what it can take exactly as the general path (``otlpjson.Reader``) would: a line the
schema rejects (an unknown top-level key, a ``null`` list, a value of another JSON type, an exponential histogram)
or an item whose conversion raises is handed whole to the general path, with nothing of it kept, so the records,
their order and every problem counted are the general path's. ``tests/unit/test_report_input.py`` reads lines both
ways and compares.
"""

from __future__ import annotations

from hashlib import blake2b as _digest

import msgspec
from msgspec import UNSET, Raw, Struct, UnsetType

from torchelastic_otel.report import otlpvalues as general
from torchelastic_otel.report.records import Attrs, Distribution, Point, Proc, SpanEvent
from torchelastic_otel.report.sink import Sink

_NULL = Raw(b"null")  # an absent attribute list or resource: decoded as ``None``, as the general path reads it

# The schema, as far as the fast path reads a line: a Struct per OTLP message (alike by nature: declarations). A
# field holds any JSON value (``object``): the general path's checks (``otlpvalues``) apply to it as written.


class _Event(Struct, rename="camel"):
    name: object = None
    time_unix_nano: object = None
    attributes: Raw = _NULL


class _Span(Struct, rename="camel"):
    trace_id: object = None
    span_id: object = None
    parent_span_id: object = None
    name: object = None
    start_time_unix_nano: object = None
    end_time_unix_nano: object = None
    attributes: Raw = _NULL
    events: list[_Event] | None = None
    links: object = None
    status: object = None


class _Log(Struct, rename="camel"):
    time_unix_nano: object = None
    observed_time_unix_nano: object = None
    severity_number: object = None
    severity_text: object = None
    body: object = None
    event_name: object = None
    attributes: Raw = _NULL
    trace_id: object = None
    span_id: object = None


class _DataPoint(Struct, rename="camel"):
    attributes: Raw = _NULL
    time_unix_nano: object = None
    as_double: object = None
    as_int: object = None
    count: object = None
    sum: object = None
    explicit_bounds: Raw = _NULL  # both by their text: equal texts are converted once (``_buckets``)
    bucket_counts: Raw = _NULL
    min: object = None
    max: object = None


class _Data(Struct, rename="camel"):
    data_points: list[_DataPoint] = []
    is_monotonic: object = False


class _Metric(Struct, rename="camel"):
    name: object = None
    unit: object = None
    gauge: _Data | None = None
    sum: _Data | None = None
    histogram: _Data | None = None
    exponential_histogram: object = None  # not read by the fast path: such a line goes the general way
    summary: object = None


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


class Line(Struct, rename="camel", forbid_unknown_fields=True):
    """A line: an unknown top-level key is the general path's to count."""

    resource_spans: list[_ResourceSpans] | UnsetType = UNSET
    resource_logs: list[_ResourceLogs] | UnsetType = UNSET
    resource_metrics: list[_ResourceMetrics] | UnsetType = UNSET


_DECODE = msgspec.json.Decoder(Line).decode
_DECODE_ANY = msgspec.json.Decoder().decode
#: distinct attribute lists (or resources) remembered by their text; past this many, new ones are converted each
#: time (a run whose every record has its own attributes would otherwise keep each one's text twice)
MAX_REMEMBERED = 1 << 18
#: distinct histogram (bounds, bucket counts) texts remembered: a quiet histogram repeats its counts, a busy one's
#: cumulative counts differ at every export; past this many, a new pair is converted each time (the texts of a busy
#: run's every point would take more memory than they save time)
MAX_BUCKET_TEXTS = 1 << 14
#: read for the summary (``TypedLines(short_texts=True)``), attribute lists longer than this (bytes) are not
#: remembered: those are a record's own (a rank's status with its metadata, an exception with its traceback), seldom
#: seen twice, and their texts would take more memory than the records the summary keeps
MAX_REMEMBERED_TEXT = 512


#: top-level key -> the ``Line`` field
_FIELDS = {"resourceSpans": "resource_spans", "resourceLogs": "resource_logs", "resourceMetrics": "resource_metrics"}


def _named(line: Line) -> bool:
    """Whether the line names a signal (an empty list of one is still OTLP)."""
    return any(blocks is not UNSET for blocks in (line.resource_spans, line.resource_logs, line.resource_metrics))


class Bail(Exception):
    """The line is not the fast path's to read: the general path reads it whole."""


class TypedLines:
    """The fast path of one ``otlpjson.Reader``: converts a line's items as its general path does, into the same
    ``Sink``, or nothing."""

    def __init__(self, sink: Sink, short_texts: bool = False) -> None:
        self._sink = sink
        #: the longest attribute list remembered (``MAX_REMEMBERED_TEXT`` with ``short_texts``)
        self._max_text = MAX_REMEMBERED_TEXT if short_texts else 1 << 62
        self._attrs: dict[bytes, Attrs] = {}
        self._procs: dict[bytes, Proc] = {}
        #: the last data point's time as written and as read: the points of one export share their time (the
        #: collection's), so they share one int, converted once
        self._time: tuple[str | None, int] = (None, 0)
        #: (process, metric, attributes) -> its last histogram point (``_share_counts``)
        self._streams: dict[tuple[Proc, str, int], Distribution] = {}
        #: a histogram point's (bounds, bucket counts) texts -> the bounds and counts (``_buckets``)
        self._bucket_texts: dict[tuple[bytes, bytes], tuple[tuple[float, ...], tuple[int, ...]]] = {}

    def forget(self) -> None:
        """Forget the texts seen (``Reader.forget``)."""
        self._attrs, self._procs, self._streams, self._bucket_texts = {}, {}, {}, {}

    def read(self, text: str, pinned: Proc | None, pinned_key: str | None) -> Line:
        """Read ``text`` (a line, its first resource perhaps cut out: then ``pinned`` is the process of the first
        block of ``pinned_key``), or raise ``Bail`` having kept nothing."""
        try:
            line = _DECODE(text)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise Bail from exc
        tel = self._sink.telemetry
        sizes = (len(tel.spans), len(tel.logs), len(tel.points))
        self._sink.tentative()
        try:
            self._convert(line, pinned, pinned_key)
        except Exception as exc:  # whatever the general path would count or reject, it does
            del tel.spans[sizes[0] :], tel.logs[sizes[1] :], tel.points[sizes[2] :]
            self._sink.roll_back()
            raise Bail from exc
        self._sink.commit()
        return line

    def first_resource(self, line: Line, key: str) -> tuple[str, Proc]:
        """The text of the first ``key`` block's resource, as the parser delimited it, and its process."""
        raw = getattr(line, _FIELDS[key])[0].resource
        return bytes(raw).decode(), self._proc(raw)

    def _convert(self, line: Line, pinned: Proc | None, pinned_key: str | None) -> None:
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
        """The process of a resource's text, remembered by its digest: a resource is long (a worker's: some 1.5 kB),
        read once in every file of its process, and a large run has tens of thousands of them."""
        text = bytes(raw)
        key = _digest(text, digest_size=16).digest()
        proc = self._procs.get(key)
        if proc is None:
            proc = self._sink.procs.get(_DECODE_ANY(text) or {})
            if len(self._procs) < MAX_REMEMBERED:
                self._procs[key] = proc
        return proc

    def _attributes(self, raw: Raw) -> Attrs:
        key = bytes(raw)
        attrs = self._attrs.get(key)
        return attrs if attrs is not None else self._converted(key)

    def _converted(self, key: bytes) -> Attrs:
        """The attributes of a list's text not remembered yet, converted, and remembered by their text: one dict for
        equal texts. Of a text too long to remember (``MAX_REMEMBERED_TEXT``), or past ``MAX_REMEMBERED`` texts, one
        dict for equal sets, as the general path shares them (``Sink.shared``)."""
        attrs = general.attributes(_DECODE_ANY(key)) or general.EMPTY
        if len(key) > self._max_text:
            return self._sink.shared(attrs)
        if len(self._attrs) < MAX_REMEMBERED:
            self._attrs[key] = attrs
            return attrs
        return self._sink.shared(attrs)

    def _buckets(self, key: tuple[bytes, bytes]) -> tuple[tuple[float, ...], tuple[int, ...]]:
        """The bounds and bucket counts of a histogram point's texts of them not remembered yet (``otlpvalues.buckets``,
        the bounds one tuple for equal bounds), remembered: a metric's points share their bounds, and a cumulative
        histogram repeats its counts until it sees something new (up to ``MAX_BUCKET_TEXTS`` pairs)."""
        bounds, counts = general.buckets(_DECODE_ANY(key[0]), _DECODE_ANY(key[1]))
        found = (self._sink.shared_bounds(bounds), counts)
        if len(self._bucket_texts) < MAX_BUCKET_TEXTS:
            self._bucket_texts[key] = found
        return found

    def _share_counts(self, point: Distribution) -> None:
        """The bucket counts and the count of a histogram point: the objects of its stream's last point when equal
        (a cumulative histogram that saw nothing new since the last export repeats them)."""
        key = (point.proc, point.name, id(point.attrs))  # the attributes: one dict for equal texts, kept by records
        last = self._streams.get(key)
        self._streams[key] = point
        if last is not None:
            if last.buckets == point.buckets:
                point.buckets = last.buckets
            if last.count == point.count:
                point.count = last.count

    # ---- items: each as ``Reader._add_span`` / ``_add_log`` / ``_add_metric`` makes it ---------------------------

    def _add_span(self, span: _Span, proc: Proc) -> None:
        sink = self._sink
        status = span.status
        if status is None:
            status = general.EMPTY
        elif type(status) is not dict:
            raise Bail("status")
        start = general.int64(span.start_time_unix_nano, "start_time_unix_nano")
        end = general.int64(span.end_time_unix_nano, "end_time_unix_nano")
        events = [self._event(event) for event in span.events] if span.events else general.NO_EVENTS
        links = span.links
        if links is not None and type(links) is not list:
            raise Bail("links")
        sink.span(
            span.trace_id,
            span.span_id,
            span.parent_span_id,
            span.name,
            start,
            end,
            span.attributes,
            self._attributes,
            status,
            events,
            proc,
        )

    def _event(self, event: _Event) -> SpanEvent:
        name = event.name
        name = general.intern(name if type(name) is str else general.string(name, "name"))
        return SpanEvent(
            name, general.int64(event.time_unix_nano, "time_unix_nano"), self._attributes(event.attributes)
        )

    def _add_log(self, record: _Log, proc: Proc) -> None:
        self._sink.log(
            record.time_unix_nano,
            record.observed_time_unix_nano,
            record.severity_number,
            record.severity_text,
            record.body,
            record.event_name,
            record.attributes,
            self._attributes,
            record.trace_id,
            record.span_id,
            proc,
        )

    def _add_metric(self, metric: _Metric, proc: Proc) -> None:
        """A metric's points: the common case (a gauge's or a sum's double, a time already read, attributes already
        seen) inline, millions of times on a large run; anything else as ``otlpvalues`` reads it."""
        if metric.exponential_histogram is not None or metric.summary is not None:
            raise Bail("a kind the fast path does not read")
        name, unit = metric.name, metric.unit
        name = general.intern(name if type(name) is str else general.string(name, "name"))
        unit = general.intern(unit if type(unit) is str else general.string(unit, "unit"))
        append = self._sink.telemetry.points.append
        known, known_buckets = self._attrs.get, self._bucket_texts.get
        time_text, time = self._time
        for kind, data in (("gauge", metric.gauge), ("sum", metric.sum), ("histogram", metric.histogram)):
            if data is None:
                continue
            monotonic = bool(data.is_monotonic)
            histogram = kind == "histogram"
            for dp in data.data_points:
                number = dp.as_double
                if type(number) is float and not histogram:
                    count = None
                else:
                    number, count = general.point_value(kind, number, dp.as_int, dp.count, dp.sum)
                raw_time = dp.time_unix_nano
                if type(raw_time) is not str or raw_time != time_text:
                    time = general.int64(raw_time, "time_unix_nano")
                    time_text = raw_time if type(raw_time) is str else None
                key = bytes(dp.attributes)
                attrs = known(key)
                if attrs is None:
                    attrs = self._converted(key)
                if histogram:
                    dist = Distribution(name, kind, unit, time, number, attrs, proc, monotonic, count)
                    texts = (bytes(dp.explicit_bounds), bytes(dp.bucket_counts))
                    found = known_buckets(texts)
                    general.fill_distribution(
                        dist, dp.sum, found if found is not None else self._buckets(texts), dp.min, dp.max
                    )
                    self._share_counts(dist)
                    append(dist)
                else:
                    append(Point(name, kind, unit, time, number, attrs, proc, monotonic, count))
        self._time = (time_text, time)
