"""Where the reader's two paths put what they read: the telemetry, and what makes its records smaller.

A span and a log record are made here from their fields as written, whichever path read them: the general path
(``otlpjson.Reader``) has the fields from the parsed JSON, the typed path (``typedlines``) from its structs, each with
its own way to convert an attribute list (``attrs_of``). Equal things are kept once, as they are read: one ``Proc``
per process (``Procs``), one dict per distinct attribute set, one tuple per histogram's bounds, one string per trace
or span id. Records are read-only by contract, so they share them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from torchelastic_otel import _names as names
from torchelastic_otel.report.otlpvalues import (
    EMPTY,
    attributes,
    enum_number,
    hex_id,
    int64,
    int_or_none,
    intern,
    json_object,
    string,
    value,
)
from torchelastic_otel.report.records import Attrs, AttrValue, LogRecord, Proc, Span, SpanEvent, Telemetry

__all__ = ["Procs", "Sink"]

#: an attribute list as a path holds it before converting it (parsed JSON; the typed path's raw text)
_Raw = TypeVar("_Raw")

#: the resource attributes a ``Proc`` is made of
_PROC_KEYS = (
    names.RANK,
    names.PROCESS_KIND,
    "host.name",
    "process.pid",
    names.RUN_ID,
    names.LOCAL_RANK,
    names.RESTART_COUNT,
    "service.name",
)


class Procs:
    """One ``Proc`` per distinct resource (every batch of a process repeats its resource)."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, ...], Proc] = {}
        self._by_value: dict[Proc, Proc] = {}
        self._last: tuple[object, Proc] | None = None

    def get(self, raw: object) -> Proc:
        """The process of a raw ``resource`` object: one ``Proc`` object per distinct process (every batch of a
        process repeats its resource, and the model keys on them). The same resource as the last one (the next line
        of the same file, mostly) is one comparison, not a decoding."""
        if self._last is not None and raw == self._last[0]:
            return self._last[1]
        proc = self._decode(raw)
        self._last = (raw, proc)
        return proc

    def canonical(self, proc: Proc) -> Proc:
        """This reader's object for a process equal to ``proc`` (one read by another process, unpickled)."""
        return self._by_value.setdefault(proc, proc)

    def _decode(self, raw: object) -> Proc:
        res = attributes(json_object(raw, "data").get("attributes"))
        key = tuple(repr(res.get(k)) for k in _PROC_KEYS)
        proc = self._cache.get(key)
        if proc is None:
            made = self._make(res)
            proc = self._cache[key] = self._by_value.setdefault(made, made)
        return proc

    @staticmethod
    def _make(res: Attrs) -> Proc:
        rank = int_or_none(res.get(names.RANK))
        kind = str(res.get(names.PROCESS_KIND) or ("worker" if rank is not None else "process"))
        return Proc(
            kind=kind if kind in ("agent", "worker") else "process",
            host=str(res.get("host.name", "")),
            pid=int_or_none(res.get("process.pid")),
            run_id=None if res.get(names.RUN_ID) is None else str(res[names.RUN_ID]),
            rank=rank,
            local_rank=int_or_none(res.get(names.LOCAL_RANK)),
            restart=int_or_none(res.get(names.RESTART_COUNT)),
            service=str(res.get("service.name", "unknown_service")),
        )


class Sink:
    """The telemetry being read, and one object for equal things in it (``forget`` lets the caches go)."""

    def __init__(self) -> None:
        self.telemetry = Telemetry()
        self.procs = Procs()
        self._attrs: dict[tuple[tuple[str, ...], tuple[type, ...], tuple[AttrValue, ...]], Attrs] = {}
        self._bounds: dict[tuple[float, ...], tuple[float, ...]] = {}
        #: trace and span ids as written -> as decoded (``_id``)
        self._ids: dict[str, str] = {}

    def forget(self) -> None:
        """Forget the decoded ids, the shared attribute sets and bounds (the records keep theirs)."""
        self._ids, self._attrs, self._bounds = {}, {}, {}

    def span(
        self,
        trace_id: object,
        span_id: object,
        parent_id: object,
        name: object,
        start: int,
        end: int,
        attrs: _Raw,
        attrs_of: Callable[[_Raw], Attrs],
        status: Mapping[str, object],
        events: list[SpanEvent],
        proc: Proc,
    ) -> None:
        """Append the span of these fields (``status`` checked to be a dict, ``events`` made)."""
        known, ids = self._ids.get, self._id
        trace_id = (type(trace_id) is str and known(trace_id)) or ids(trace_id, "trace_id")
        span_id = (type(span_id) is str and known(span_id)) or ids(span_id, "span_id")
        parent_id = (type(parent_id) is str and known(parent_id)) or ids(parent_id, "parent_span_id")
        code, message = status.get("code"), status.get("message")
        self.telemetry.spans.append(
            Span(
                trace_id,
                span_id,
                parent_id,
                intern(name if type(name) is str else string(name, "name")),
                start,
                end if end > start else start,
                attrs_of(attrs),
                code if type(code) is int else enum_number(code, "code"),
                message if type(message) is str else string(message, "message"),
                events,
                proc,
            )
        )

    def log(
        self,
        time: object,
        observed: object,
        severity: object,
        severity_text: object,
        body: object,
        event_name: object,
        attrs: _Raw,
        attrs_of: Callable[[_Raw], Attrs],
        trace_id: object,
        span_id: object,
        proc: Proc,
    ) -> None:
        """Append the log record of these fields."""
        time = int64(time, "time_unix_nano")
        observed = int64(observed, "observed_time_unix_nano")
        severity = severity if type(severity) is int else enum_number(severity, "severity_number")
        severity_text = intern(severity_text if type(severity_text) is str else string(severity_text, "severity_text"))
        text = body.get("stringValue") if type(body) is dict and len(body) == 1 else None
        body = text if type(text) is str else value(body)
        event_name = intern(event_name if type(event_name) is str else string(event_name, "event_name"))
        converted = attrs_of(attrs)
        known, ids = self._ids.get, self._id
        trace_id = (type(trace_id) is str and known(trace_id)) or ids(trace_id, "trace_id")
        span_id = (type(span_id) is str and known(span_id)) or ids(span_id, "span_id")
        self.telemetry.logs.append(
            LogRecord(time or observed, severity, severity_text, body, event_name, converted, trace_id, span_id, proc)
        )

    def json_attributes(self, raw: object) -> Attrs:
        """An attribute list as the general path converts it: one shared dict for equal sets (``shared``)."""
        return self.shared(attributes(raw))

    def _id(self, raw: object, field: str) -> str:
        """A trace or span id as ``hex_id`` makes it, decoded once per distinct id: a trace's spans and records, a
        span's children, share one string (and its decoding)."""
        if not raw:
            return ""
        if type(raw) is not str:
            return hex_id(raw, field)  # raises: an id is hex text
        known = self._ids.get(raw)
        if known is None:
            known = hex_id(raw, field)
            known = self._ids[raw] = self._ids.setdefault(known, known)
        return known

    def shared_bounds(self, bounds: tuple[float, ...]) -> tuple[float, ...]:
        """One tuple for equal histogram bounds: a metric's points all have the same."""
        return self._bounds.setdefault(bounds, bounds)

    def shared(self, attrs: Attrs) -> Attrs:
        """One dict for equal attribute sets (a metric point's: a process writes the same few on every export; a
        training step's: every rank has a step 5; a log line's: its stream), millions of times on a large run;
        read-only by contract, as every record is."""
        if not attrs:
            return EMPTY
        try:
            values = tuple(attrs.values())
            key = (tuple(attrs), tuple(map(type, values)), values)  # 1, 1.0 and True are equal keys: their types not
            return self._attrs.setdefault(key, attrs)
        except TypeError:  # a list value: not hashable, not shared
            return attrs
