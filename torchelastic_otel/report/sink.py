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


#: span names the model reads one by one (an agent's run, attempts, rendezvous, restarts; a worker's start): never
#: folded (``Sink(fold=True)``)
_UNFOLDED_NAMES = frozenset((names.RUN, names.ATTEMPT, names.RENDEZVOUS, names.RESTART, names.WORKER_START))
#: attributes that make a record more than a time for the model (its run, who sent it; a span's verdict): never
#: folded
_RUN_ID, _DELIVERED_BY, _VERDICT = names.RUN_ID, names.DELIVERED_BY, names.ROOT_CAUSE_PREFIX + "rank"
#: the bridge's events, which the model reads one by one: never folded
_BRIDGE_EVENTS = "torchelastic."


class Sink:
    """The telemetry being read, and one object for equal things in it (``forget`` lets the caches go).

    With ``fold``, a worker's plain spans (its training steps: most spans of a large run) are kept as no more than
    two per process, name, trace and parent: the first one, its times widened to the earliest start and the latest
    end of those folded into it, and the second one, its times widened to the latest start and the latest end; and
    the log records that are no event of the bridge's (output lines, a framework's logging, a user's events) as no
    more than two per process and trace: the earliest and the latest. What the summary (``report --json``) reads of
    them is kept so: when each rank was first and last seen, the run's times, its processes, hosts and traces. The
    terminal and HTML views draw every span and show output lines: they read unfolded."""

    def __init__(self, fold: bool = False) -> None:
        self.telemetry = Telemetry()
        self.procs = Procs()
        self._fold = fold
        #: (process, name, trace id, parent id) -> [first span, second span or None] (``fold``)
        self._folds: dict[tuple[Proc, str, str, str], list[Span | None]] = {}
        #: (process, trace id) -> [first log record, second or None] (``fold``)
        self._log_folds: dict[tuple[Proc, str], list[LogRecord | None]] = {}
        #: while a line is read tentatively (``tentative``): the times of the records kept before it that folding
        #: changed (record, field, as it was)
        self._undo: list[tuple[Span | LogRecord, str, int]] | None = None
        #: the shared attribute sets by the hash of their keys, types and values (``shared``), and those whose hash
        #: another one had, by all of these
        self._attrs: dict[int, Attrs] = {}
        self._collided: dict[tuple[tuple[str, ...], tuple[type, ...], tuple[AttrValue, ...]], Attrs] = {}
        self._bounds: dict[tuple[float, ...], tuple[float, ...]] = {}
        #: trace and span ids as written -> as decoded (``_id``)
        self._ids: dict[str, str] = {}

    def forget(self) -> None:
        """Forget the decoded ids, the shared attribute sets and bounds (the records keep theirs), and the spans
        folded into (``restart_folds``)."""
        self._ids, self._attrs, self._collided, self._bounds = {}, {}, {}, {}
        self.restart_folds()

    def restart_folds(self) -> None:
        """Fold no more span into one already kept: the spans kept were taken away (a batch handed over) or some
        dropped (a line the typed path gave up on, read again by the general path). Folding starts again; what is
        folded twice is still right (an earliest start, a latest end)."""
        self._folds, self._log_folds = {}, {}

    def tentative(self) -> None:
        """What follows may be taken back (``roll_back``) until ``commit``: the typed path's line."""
        self._undo = [] if self._fold else None

    def commit(self) -> None:
        """What was read since ``tentative`` stays."""
        self._undo = None

    def roll_back(self) -> None:
        """Undo what folding did since ``tentative`` to the spans kept before it (the caller drops the records
        appended since)."""
        if self._undo:
            for record, field, was in reversed(self._undo):
                setattr(record, field, was)
            self.restart_folds()
        self._undo = None

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
        fold = self._fold and proc.kind == "worker"
        trace_id = (type(trace_id) is str and known(trace_id)) or ids(trace_id, "trace_id")
        if fold:  # most are folded away: decoded, not remembered (one a span: much memory on a large run)
            span_id = (type(span_id) is str and known(span_id)) or (hex_id(span_id, "span_id") if span_id else "")
        else:
            span_id = (type(span_id) is str and known(span_id)) or ids(span_id, "span_id")
        parent_id = (type(parent_id) is str and known(parent_id)) or ids(parent_id, "parent_span_id")
        code, message = status.get("code"), status.get("message")
        name = intern(name if type(name) is str else string(name, "name"))
        converted = attrs_of(attrs)
        code = code if type(code) is int else enum_number(code, "code")
        message = message if type(message) is str else string(message, "message")
        end = end if end > start else start
        if fold and self._folded(proc, name, trace_id, parent_id, start, end, converted, code, message, events):
            return
        span = Span(trace_id, span_id, parent_id, name, start, end, converted, code, message, events, proc)
        self.telemetry.spans.append(span)
        if fold and start > 0:
            self._keep_fold(proc, name, trace_id, parent_id, span, converted, code, message, events)

    def _foldable(self, name: str, attrs: Attrs, code: int, message: str, events: list[SpanEvent]) -> bool:
        """A plain span: no events, no status, no attribute the model reads on it, no name it reads one by one."""
        return (
            not events
            and code == 0
            and not message
            and name not in _UNFOLDED_NAMES
            and _RUN_ID not in attrs
            and _DELIVERED_BY not in attrs
            and _VERDICT not in attrs
        )

    def _folded(
        self,
        proc: Proc,
        name: str,
        trace_id: str,
        parent_id: str,
        start: int,
        end: int,
        attrs: Attrs,
        code: int,
        message: str,
        events: list[SpanEvent],
    ) -> bool:
        """Whether this span was folded into the two kept for its process, name, trace and parent (``fold``)."""
        kept = self._folds.get((proc, name, trace_id, parent_id))
        if kept is None or start <= 0 or not self._foldable(name, attrs, code, message, events):
            return False
        first, second = kept
        if second is None:
            return False  # kept as the second
        assert first is not None
        if self._undo is not None:
            self._undo += ((first, "start", first.start), (first, "end", first.end))
            self._undo += ((second, "start", second.start), (second, "end", second.end))
        if start < first.start:
            first.start = start
        if end > first.end:
            first.end = end
        if start > second.start:
            second.start = start
        if first.end > second.end:
            second.end = first.end
        elif second.end > first.end:
            first.end = second.end
        return True

    def _keep_fold(
        self,
        proc: Proc,
        name: str,
        trace_id: str,
        parent_id: str,
        span: Span,
        attrs: Attrs,
        code: int,
        message: str,
        events: list[SpanEvent],
    ) -> None:
        """Remember ``span`` as the first or second kept of its fold (``fold``)."""
        if not self._foldable(name, attrs, code, message, events):
            return
        key = (proc, name, trace_id, parent_id)
        kept = self._folds.get(key)
        if kept is None:
            self._folds[key] = [span, None]
            return
        first = kept[0]
        assert first is not None
        if self._undo is not None:
            self._undo += ((first, "start", first.start), (first, "end", first.end))
        kept[1] = span
        # the two agree: the earliest start on the first, the latest start on the second, the latest end on both
        if span.start < first.start:
            first.start, span.start = span.start, first.start
        if span.end > first.end:
            first.end = span.end
        else:
            span.end = first.end

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
        if self._fold:  # decoded, not remembered: the summary reads no record's span, and most are folded away
            span_id = (type(span_id) is str and known(span_id)) or (hex_id(span_id, "span_id") if span_id else "")
        else:
            span_id = (type(span_id) is str and known(span_id)) or ids(span_id, "span_id")
        time = time or observed
        fold = self._fold and time > 0 and self._foldable_log(event_name, body, converted)
        if fold and self._log_folded(proc, trace_id, time):
            return
        record = LogRecord(time, severity, severity_text, body, event_name, converted, trace_id, span_id, proc)
        self.telemetry.logs.append(record)
        if fold:
            self._keep_log_fold(proc, trace_id, record)

    @staticmethod
    def _foldable_log(event_name: str, body: AttrValue, attrs: Attrs) -> bool:
        """A record the model reads only for its time, process and trace: none of the bridge's events (those the
        model and the summary look for by name: failures, verdicts, statuses, stalls, restarts), no run or sender
        attribute. An output line is one: the summary shows none."""
        name = event_name or (body if isinstance(body, str) and len(body) < 200 else "")  # ``LogRecord.name``
        return not name.startswith(_BRIDGE_EVENTS) and _RUN_ID not in attrs and _DELIVERED_BY not in attrs

    def _log_folded(self, proc: Proc, trace_id: str, time: int) -> bool:
        """Whether a record at ``time`` was folded into the two kept for its process and trace (``fold``): the
        first holds the earliest time, the second the latest."""
        kept = self._log_folds.get((proc, trace_id))
        if kept is None:
            return False
        first, second = kept
        if second is None:
            return False  # kept as the second
        assert first is not None
        if self._undo is not None:
            self._undo += ((first, "time", first.time), (second, "time", second.time))
        if time < first.time:
            first.time = time
        elif time > second.time:
            second.time = time
        return True

    def _keep_log_fold(self, proc: Proc, trace_id: str, record: LogRecord) -> None:
        """Remember ``record`` as the first or second kept of its fold (``fold``)."""
        kept = self._log_folds.get((proc, trace_id))
        if kept is None:
            self._log_folds[(proc, trace_id)] = [record, None]
            return
        first = kept[0]
        assert first is not None
        kept[1] = record
        if record.time < first.time:
            if self._undo is not None:
                self._undo.append((first, "time", first.time))
            first.time, record.time = record.time, first.time

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
        keys, values = tuple(attrs), tuple(attrs.values())
        types = tuple(map(type, values))  # 1, 1.0 and True are equal values: their types not
        try:
            digest = hash((keys, types, values))
        except TypeError:  # a list value: not hashable, not shared
            return attrs
        # kept by the hash of its keys, types and values: a key of three tuples for each of the hundreds of thousands
        # of sets of a large run would take more memory than the sets; two sets of one hash are told apart by all
        kept = self._attrs.setdefault(digest, attrs)
        if kept is attrs or (
            tuple(kept) == keys and tuple(kept.values()) == values and tuple(map(type, kept.values())) == types
        ):
            return kept
        return self._collided.setdefault((keys, types, values), attrs)
