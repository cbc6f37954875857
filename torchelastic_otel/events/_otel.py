"""Event adapter: an ``Event`` / ``RdzvEvent`` becomes one OpenTelemetry log record and a span event.

Mapping (documented in the README):

- ``event_name``: the event's name; body: the rendezvous message, else the event's name;
- severity from the state (``metadata["state"]``, the ``torchelastic.worker.status.<STATE>`` name, or
  ``node_state``): FAILED -> ERROR, TERMINATED / UNHEALTHY -> WARN, anything else INFO;
- ``raw_error`` (torch's error-file JSON or a traceback) and ``error_trace`` -> ``exception.type``,
  ``exception.message``, ``exception.stacktrace``;
- timestamp: the event's (milliseconds) when non-zero, else now (torch's agent always sends 0);
- metadata -> attributes under ``torchelastic.`` (None left out, containers made valid); torch's JSON-string
  ``metadata`` field is parsed into ``torchelastic.metadata.<key>``, its 1-element lists unwrapped;
- trace and span ids: the caller's current span, which also receives the event as a span event;
- every string (name, body, keys, values) goes through ``_export.attributes``: made encodable (lone surrogates become
  U+FFFD, counted as ``sanitized{reason="lone_surrogates"}``), so one event can never fail an export batch.

The span event is added in the caller's thread (the current span is the caller's). The log record is buffered
with the caller's context and converted and emitted by the drainer, off the caller's thread: the SDK's record
construction costs more than torch's whole null ``record``. Any failure is counted and swallowed: recording an
event never raises.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import context, trace
from opentelemetry._logs import Logger, NoOpLogger, SeverityNumber
from opentelemetry.context import Context
from opentelemetry.util.types import AnyValue

from torchelastic_otel import _names as names
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel import pipeline
from torchelastic_otel._export import attributes as _attributes
from torchelastic_otel._export import drainer as _drainer
from torchelastic_otel._export.meters import PerPipeline
from torchelastic_otel.events import api
from torchelastic_otel.events.api import Event, EventHandler, RdzvEvent
from torchelastic_otel.version import __version__

if TYPE_CHECKING:
    from typing_extensions import TypeIs

__all__ = ["OtelEventHandler", "OtelLoggingHandler", "to_log_fields", "export_event"]

_logger = logging.getLogger("torchelastic_otel")

PREFIX = "torchelastic."
SCOPE = "torchelastic_otel"
_STATUS_PREFIX = names.WORKER_STATUS_PREFIX

_SEVERITY = {
    "FAILED": (SeverityNumber.ERROR, "ERROR"),
    "TERMINATED": (SeverityNumber.WARN, "WARN"),
    "UNHEALTHY": (SeverityNumber.WARN, "WARN"),
    "RESTART": (SeverityNumber.WARN, "WARN"),
    "STALLED": (SeverityNumber.WARN, "WARN"),
}
_INFO = (SeverityNumber.INFO, "INFO")

_Event = TypeVar("_Event", bound="Event | RdzvEvent")
#: The keyword arguments of OpenTelemetry's ``Logger.emit`` for one event (:func:`to_log_fields`): each keyword of
#: its own type, handed on as they are (``_export.drainer``'s hand-over, the final words).
LogFields = dict[str, Any]
#: A buffered event: a copy of it, or its log record fields when they were made at once; when; the caller's context.
_Pending = tuple[Event | RdzvEvent, None, int, Context] | tuple[None, LogFields, int, Context]


def _is_rdzv(event: object) -> TypeIs[RdzvEvent]:
    """A rendezvous event: ours, or one of the same shape (e.g. torch's own ``RdzvEvent`` handed to ``record``).
    Typed ``TypeIs[RdzvEvent]``: the bridge reads one as its ``RdzvEvent``, anything else as an ``Event`` (torch's
    too)."""
    return isinstance(event, RdzvEvent) or (not isinstance(event, Event) and hasattr(event, "node_state"))


def _state_of(event: Event | RdzvEvent) -> str:
    if _is_rdzv(event):
        node_state = event.node_state
        return _attributes.safe_str(node_state.value if isinstance(node_state, Enum) else node_state)  # torch's too
    metadata = event.metadata if isinstance(event.metadata, dict) else {}
    state = metadata.get("state")
    if isinstance(state, str) and state:
        return state.upper()
    name = event.name if isinstance(event.name, str) else ""
    return name[len(_STATUS_PREFIX) :] if name.startswith(_STATUS_PREFIX) else ""


def parse_error(error: object) -> tuple[str | None, str | None, str | None] | None:
    """``(type, message, stacktrace)`` of torch's error-file JSON (``{"message": {"message": "Type: text",
    "extraInfo": {"py_callstack": ...}}}``, as text) or of a traceback, uncut; ``None`` when there is nothing to
    report (``"{}"``: torch found no error file). Shared by the event mapping and the agent's root cause."""
    if error is None or error == "":
        return None
    text = _attributes.safe_str(error)
    raw_message: object = None
    stack: object = None
    try:
        data = json.loads(text)
    except (ValueError, TypeError, RecursionError):
        data = None
    if isinstance(data, dict):
        inner = data.get("message", data)
        if isinstance(inner, dict):
            raw_message = inner.get("message")
            extra = inner.get("extraInfo")
            stack = extra.get("py_callstack") if isinstance(extra, dict) else None
        else:
            raw_message = inner
        if not raw_message and not stack:
            return None
    else:
        stack = text
        lines = [line for line in text.strip().splitlines() if line.strip()]
        raw_message = lines[-1].strip() if lines else text
    kind = None
    message = None if raw_message is None else _attributes.safe_str(raw_message)
    if message is not None:
        head, sep, rest = message.partition(": ")
        if sep and head.replace(".", "").replace("_", "").isalnum() and " " not in head:
            kind, message = head, rest
    return kind, message, (_attributes.safe_str(stack) if stack else None)


def _exception_attributes(error: object, out: dict[str, AnyValue]) -> None:
    """Fill ``exception.*`` from torch's error-file JSON or a traceback (:func:`parse_error`)."""
    parsed = parse_error(error)
    if parsed is None:
        return
    kind, message, stack = parsed
    if kind is not None:
        out["exception.type"] = _attributes.attribute_value(kind)
    if message is not None:
        out["exception.message"] = _attributes.attribute_value(message)
    if stack:
        out["exception.stacktrace"] = _attributes.attribute_value(stack)


def _event_attributes(event: Event) -> dict[str, AnyValue]:
    out: dict[str, AnyValue] = {}
    if event.source is not None:
        out[PREFIX + "source"] = _attributes.attribute_value(event.source)
    legacy_type = api.legacy_type(event)
    if legacy_type is not None:
        out[PREFIX + "event_type"] = _attributes.attribute_value(legacy_type)
    metadata = event.metadata
    if not isinstance(metadata, dict):
        if metadata is not None:
            value = _attributes.attribute_value(metadata)
            if value is not None:
                out[PREFIX + "metadata"] = value
        return out
    if "raw_error" in metadata or isinstance(metadata.get("metadata"), str):
        _exception_attributes(metadata.get("raw_error"), out)
        _nested_metadata(metadata.get("metadata"), out)
        _attributes.flatten(metadata, PREFIX, out, skip=_TORCH_PACKED)
    else:
        _attributes.flatten(metadata, PREFIX, out)
    return out


#: torch's agent packs these two metadata keys; they become ``exception.*`` and ``torchelastic.metadata.*``.
_TORCH_PACKED = frozenset(("raw_error", "metadata"))


def _nested_metadata(value: object, out: dict[str, AnyValue]) -> None:
    """torch packs worker details into a JSON string with 1-element lists; make them plain attributes."""
    if value is None:
        return
    try:
        parsed = json.loads(value) if isinstance(value, str) else value
    except (ValueError, RecursionError):
        parsed = None
    if not isinstance(parsed, dict):
        converted = _attributes.attribute_value(value)
        if converted is not None:
            out[PREFIX + "metadata"] = converted
        return
    _attributes.flatten(parsed, PREFIX + "metadata.", out, unwrap=True)


def _rdzv_attributes(event: RdzvEvent) -> dict[str, AnyValue]:
    out: dict[str, AnyValue] = {}
    fields = {
        "run_id": event.run_id,
        "hostname": event.hostname,
        "pid": event.pid,
        "node_state": event.node_state,
        "master_endpoint": event.master_endpoint or None,
        "rank": event.rank,
        "local_id": event.local_id,
    }
    _attributes.flatten(fields, PREFIX, out)
    if event.error_trace:
        _exception_attributes(event.error_trace, out)
    return out


def to_log_fields(event: Event | RdzvEvent, now: int | None = None) -> LogFields:
    """The log record fields of ``event`` (keyword arguments of ``Logger.emit``), without trace context.

    ``now`` (ns) is when the event was recorded; default: now.
    """
    if _is_rdzv(event):
        attributes = _rdzv_attributes(event)
        body = _attributes.safe_str(event.message)
        kind = "rdzv"
    else:
        attributes = _event_attributes(event)
        body = _attributes.safe_str(event.name)
        kind = "legacy" if api.legacy_type(event) is not None and event.source is None else "event"
    attributes[PREFIX + "event.kind"] = kind
    severity_number, severity_text = _SEVERITY.get(_state_of(event), _INFO)
    timestamp_ms = getattr(event, "timestamp", 0)
    if now is None:
        now = time.time_ns()
    try:
        timestamp = int(timestamp_ms) * 1_000_000 if timestamp_ms else now
        if not 0 < timestamp < 2**63:
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        selftelemetry.count(selftelemetry.SANITIZED, "logs", "timestamp_invalid")
        timestamp = now
    name = event.name if isinstance(event.name, str) and event.name else names.EVENT
    event_name = _attributes.attribute_value(name)
    return {
        "event_name": event_name,
        "body": event_name if body is name else _attributes.attribute_value(body),  # one string, made valid once
        "severity_number": severity_number,
        "severity_text": severity_text,
        "attributes": attributes,
        "timestamp": timestamp,
        "observed_timestamp": now,
    }


class _Emitter:
    """The OTel logger of the current pipeline (made again when the pipeline changes: ``_export.meters``)."""

    def __init__(self) -> None:
        self._logger: PerPipeline[Logger] = PerPipeline(
            lambda current: current.logger_provider.get_logger(SCOPE, __version__)
        )

    def logger(self) -> Logger:
        return self._logger.get()


_emitter = _Emitter()


#: Events buffered before new ones are dropped (and counted).
DEFAULT_MAX_PENDING = 65536


def _snapshot(event: _Event) -> _Event:
    """A copy whose metadata dict the caller can no longer change before the event is converted."""
    copy = object.__new__(type(event))
    copy.__dict__.update(event.__dict__)
    metadata = copy.__dict__.get("metadata")
    if type(metadata) is dict:
        copy.__dict__["metadata"] = dict(metadata)
    return copy


class _EventBuffer(_drainer.Buffer):
    """Events on their way to the SDK's ``Logger.emit``.

    The SDK's record construction alone costs a good part of torch's whole null ``record``, so the caller only
    appends ``(event, time, context)`` here; the drainer (``torchelastic_otel._export.drainer``) converts and emits them
    off the caller's thread, and every flush drains first. The caller's context is kept, so each record still
    carries the trace and span ids that were current when the event was recorded.
    """

    signal = "logs"

    def __init__(self, max_pending: int = DEFAULT_MAX_PENDING) -> None:
        super().__init__(max_pending)
        _drainer.register(self)

    def submit(self, item: _Pending) -> None:
        pending = self._pending
        if len(pending) < self.max_pending:
            pending.append(item)
        else:
            self._overflow += 1

    def drain(self, deadline: float | None = None) -> int:
        """Convert and emit buffered events, oldest first, until ``deadline`` (``time.monotonic()``) if given."""
        with self._lock:
            self._count_overflow()
            pending = self._pending
            if not pending:
                return 0
            logger = _emitter.logger()
            emitted = 0
            tried = 0
            while pending:
                if deadline is not None and tried & 63 == 0 and time.monotonic() >= deadline:
                    break
                tried += 1
                try:
                    event, fields, now, ctx = pending.popleft()
                except IndexError:
                    break
                try:
                    logger.emit(context=ctx, **(fields if fields is not None else to_log_fields(event, now)))
                    emitted += 1
                except Exception as exc:
                    selftelemetry.count(selftelemetry.DROPPED, "logs", "conversion_error")
                    _logger.debug("torchelastic_otel: event dropped: %s", exc, exc_info=True)
            return emitted

    def hand_over(self, keep: Callable[[LogFields, Context], object]) -> bool:
        """An exit before the pipeline was built: each buffered event, as log record fields, to ``keep(fields,
        ctx)`` (``_export.drainer.hand_over_all``); ``True`` if every one was kept."""
        return self._hand_over_items(keep, _portable_event)


def _portable_event(item: _Pending) -> tuple[LogFields, Context]:
    if item[1] is not None:
        return item[1], item[3]
    return to_log_fields(item[0], item[2]), item[3]


_buffer = _EventBuffer()


def export_event(event: Event | RdzvEvent, extra_attributes: dict[str, AnyValue] | None = None) -> None:
    """Export ``event`` as a log record (buffered) and as a span event on the current recording span (now).

    ``extra_attributes`` (valid attribute values) are added outside the ``torchelastic.`` namespace, their strings
    made encodable: semantic-convention attributes the bridge sets itself (``code.*``, a root cause's
    ``exception.*`` read back from a worker's file).

    Never raises. Nothing is done when nobody can receive it: a no-op logger (``OTEL_SDK_DISABLED``, a no-op
    provider) and no recording span.
    """
    try:
        # While a worker's pipeline is being built, the record is buffered for it.
        enabled = pipeline.building() or not isinstance(_emitter.logger(), NoOpLogger)
        span = trace.get_current_span()
        recording = span.is_recording()
        if not (enabled or recording):
            return
        now = time.time_ns()
        fields = None
        if recording or extra_attributes:
            fields = to_log_fields(event, now)
            if extra_attributes:
                fields["attributes"].update(_attributes.encodable_attributes(extra_attributes, "logs"))
            if recording:
                span.add_event(fields["event_name"], fields["attributes"], fields["timestamp"])
        if enabled:
            ctx = context.get_current()
            _buffer.submit((_snapshot(event), None, now, ctx) if fields is None else (None, fields, now, ctx))
    except Exception as exc:  # telemetry never raises into the job
        selftelemetry.count(selftelemetry.DROPPED, "logs", "conversion_error")
        _logger.debug("torchelastic_otel: event dropped: %s", exc, exc_info=True)


def _event_from_json(text: str) -> Event | RdzvEvent | None:
    data = json.loads(text)
    if not isinstance(data, dict):
        return None
    if "node_state" in data:
        return RdzvEvent.deserialize(text)
    if "name" in data:
        return Event.deserialize(text)
    return None


class OtelLoggingHandler(logging.Handler):
    """The "otel" destination: a ``logging.Handler`` that exports torch's serialized events.

    torch's ``record(event, destination)`` logs ``event.serialize()``; this handler turns that JSON back into the
    event and exports it. The bridge's own ``record`` hands it the event object directly (no JSON round trip).
    A message that is not an event is exported as a plain log record with the logger's level, never dropped.
    """

    def __init__(self, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        pipeline.prepare()  # the bridge's global providers now, before the application starts spans

    def emit(self, record: logging.LogRecord) -> None:  # logging.Handler's API
        try:
            msg = record.msg
            event: Event | RdzvEvent | None
            if isinstance(msg, (Event, RdzvEvent)):
                event = msg
            else:
                try:
                    message = record.getMessage()
                except Exception:  # arguments that do not fit the format: keep the raw message, as logging does
                    message = _attributes.safe_str(msg)
                try:
                    event = _event_from_json(message)
                except (ValueError, TypeError, KeyError, RecursionError):
                    event = None
                if event is None:
                    event = Event(
                        name=record.name,
                        source=None,
                        timestamp=int(record.created * 1000),
                        metadata={"message": message, "level": record.levelname},
                    )
            export_event(event)
        except Exception:
            selftelemetry.count(selftelemetry.DROPPED, "logs", "conversion_error")

    def export(self, event: Event | RdzvEvent) -> None:
        """Export an event object directly (the fast path of the bridge's ``record``)."""
        export_event(event)


class OtelEventHandler(EventHandler):
    """Legacy-API handler (``events.configure(OtelEventHandler(), event_type=...)``) exporting to OpenTelemetry.

    ``delegate`` receives every event as well, so console output (or any handler) can be kept while exporting.
    """

    def __init__(self, delegate: EventHandler | None = None) -> None:
        self.delegate = delegate
        pipeline.prepare()

    def record(self, event: Event) -> None:  # EventHandler's API
        export_event(event)
        if self.delegate is not None:
            try:
                self.delegate.record(event)
            except Exception:
                selftelemetry.count(selftelemetry.DROPPED, "logs", "delegate_error")
