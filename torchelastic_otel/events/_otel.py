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
- trace and span ids: the caller's current span, which also receives the event as a span event.

Conversion runs in the caller's thread because the current span is the caller's; the SDK's batch processor does
the exporting off-thread. Any failure is counted and swallowed: recording an event never raises.
"""

from __future__ import annotations

import json
import logging
import time
from enum import Enum
from typing import Any

from opentelemetry import trace
from opentelemetry._logs import SeverityNumber

from torchelastic_otel import _attributes, _selftelemetry, pipeline
from torchelastic_otel.events.api import Event, EventHandler, RdzvEvent
from torchelastic_otel.version import __version__

__all__ = ["OtelEventHandler", "OtelLoggingHandler", "to_log_fields", "export_event"]

_logger = logging.getLogger("torchelastic_otel")

PREFIX = "torchelastic."
SCOPE = "torchelastic_otel"
_STATUS_PREFIX = "torchelastic.worker.status."

_SEVERITY = {
    "FAILED": (SeverityNumber.ERROR, "ERROR"),
    "TERMINATED": (SeverityNumber.WARN, "WARN"),
    "UNHEALTHY": (SeverityNumber.WARN, "WARN"),
    "RESTART": (SeverityNumber.WARN, "WARN"),
}
_INFO = (SeverityNumber.INFO, "INFO")


def _is_rdzv(event: object) -> bool:
    """A rendezvous event: ours, or one of the same shape (e.g. torch's own ``RdzvEvent`` handed to ``record``)."""
    return isinstance(event, RdzvEvent) or (not isinstance(event, Event) and hasattr(event, "node_state"))


def _state_of(event: Event | RdzvEvent) -> str:
    if _is_rdzv(event):
        state = event.node_state
        return str(state.value if isinstance(state, Enum) else state)  # torch's NodeState too
    metadata = event.metadata if isinstance(event.metadata, dict) else {}
    state = metadata.get("state")
    if isinstance(state, str) and state:
        return state.upper()
    name = event.name if isinstance(event.name, str) else ""
    return name[len(_STATUS_PREFIX) :] if name.startswith(_STATUS_PREFIX) else ""


def _exception_attributes(error: Any, out: dict[str, Any]) -> None:
    """Fill ``exception.*`` from torch's error-file JSON (``{"message": {"message", "extraInfo"}}``) or a traceback."""
    if error is None or error == "":
        return
    text = error if isinstance(error, str) else str(error)
    message: Any = None
    stack: Any = None
    try:
        data = json.loads(text)
    except (ValueError, TypeError, RecursionError):
        data = None
    if isinstance(data, dict):
        inner = data.get("message", data)
        if isinstance(inner, dict):
            message = inner.get("message")
            extra = inner.get("extraInfo")
            stack = extra.get("py_callstack") if isinstance(extra, dict) else None
        else:
            message = inner
        if not message and not stack:
            return  # "{}": torch found no error file; nothing to report
    else:
        stack = text
        lines = [line for line in text.strip().splitlines() if line.strip()]
        message = lines[-1].strip() if lines else text
    if message is not None:
        message = str(message)
        head, sep, rest = message.partition(": ")
        if sep and head.replace(".", "").replace("_", "").isalnum() and " " not in head:
            out["exception.type"] = head
            out["exception.message"] = _attributes.attribute_value(rest)
        else:
            out["exception.message"] = _attributes.attribute_value(message)
    if stack:
        out["exception.stacktrace"] = _attributes.attribute_value(str(stack))


def _event_attributes(event: Event) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if event.source is not None:
        out[PREFIX + "source"] = _attributes.attribute_value(event.source)
    legacy_type = getattr(event, "_type", None)
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
        _flatten(metadata, PREFIX, out, _TORCH_PACKED)
    else:
        _flatten(metadata, PREFIX, out)
    return out


#: torch's agent packs these two metadata keys; they become ``exception.*`` and ``torchelastic.metadata.*``.
_TORCH_PACKED = frozenset(("raw_error", "metadata"))
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _flatten(mapping: dict, prefix: str, out: dict[str, Any], skip: frozenset = frozenset(), unwrap: bool = False) -> None:
    """``_attributes.flatten(mapping, prefix, out)`` with its common case inline (hot path of every event).

    Items whose key is a short non-empty ``str`` and whose value is exactly ``str``/``int``/``float``/``bool``/None
    -- all of torch's agent metadata -- are checked here without a call per item; anything else goes through
    ``_attributes`` unchanged, so the result (and every count) is the same as ``_attributes.flatten``'s. Keys in
    ``skip`` are left out; ``unwrap`` takes the element of 1-element lists/tuples (torch's packed metadata).
    """
    max_len = _attributes.MAX_STRING_LENGTH
    max_key = _attributes.MAX_KEY_LENGTH
    max_attributes = _attributes.MAX_ATTRIBUTES
    for raw_key, value in list(mapping.items()):
        if skip and raw_key in skip:
            continue
        if unwrap and isinstance(value, (list, tuple)) and len(value) == 1:
            value = value[0]
        if value is None:
            continue
        kind = type(value)
        if type(raw_key) is not str or not 0 < len(raw_key) <= max_key:
            _attributes.flatten({raw_key: value}, prefix, out)  # odd keys: _attributes names them
            continue
        key = prefix + raw_key
        if kind is str:
            if len(value) > max_len:
                value = _attributes.attribute_value(value)
        elif kind is int:
            if not _INT64_MIN <= value <= _INT64_MAX:
                value = _attributes.attribute_value(value)
        elif kind is not float and kind is not bool:
            if isinstance(value, dict) and _attributes.MAX_DEPTH > 0 and (unwrap or value is not mapping):
                _attributes.flatten(value, key + ".", out, "logs", 1)
                continue
            value = _attributes.attribute_value(value)
            if value is None:
                continue
        if len(out) >= max_attributes and key not in out:
            _selftelemetry.count(_selftelemetry.DROPPED, "logs", "attribute_limit")
            continue
        out[key] = value


def _nested_metadata(value: Any, out: dict[str, Any]) -> None:
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
    _flatten(parsed, PREFIX + "metadata.", out, unwrap=True)


def _rdzv_attributes(event: RdzvEvent) -> dict[str, Any]:
    out: dict[str, Any] = {}
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


def to_log_fields(event: Event | RdzvEvent) -> dict[str, Any]:
    """The log record fields of ``event`` (keyword arguments of ``Logger.emit``), without trace context."""
    return _log_fields(event, _SEVERITY.get(_state_of(event), _INFO))


def _log_fields(event: Event | RdzvEvent, severity: tuple[SeverityNumber, str]) -> dict[str, Any]:
    if _is_rdzv(event):
        attributes = _rdzv_attributes(event)
        body = event.message if isinstance(event.message, str) else str(event.message)
        kind = "rdzv"
    else:
        attributes = _event_attributes(event)
        body = event.name if isinstance(event.name, str) else str(event.name)
        kind = "legacy" if getattr(event, "_type", None) is not None and event.source is None else "event"
    attributes[PREFIX + "event.kind"] = kind
    severity_number, severity_text = severity
    timestamp_ms = getattr(event, "timestamp", 0)
    now = time.time_ns()
    try:
        timestamp = int(timestamp_ms) * 1_000_000 if timestamp_ms else now
        if not 0 < timestamp < 2**63:
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        _selftelemetry.count(_selftelemetry.SANITIZED, "logs", "timestamp_invalid")
        timestamp = now
    name = event.name if isinstance(event.name, str) and event.name else "torchelastic.event"
    return {
        "event_name": _attributes.attribute_value(name),
        "body": _attributes.attribute_value(body),
        "severity_number": severity_number,
        "severity_text": severity_text,
        "attributes": attributes,
        "timestamp": timestamp,
        "observed_timestamp": now,
    }


def _name_of(event: Event | RdzvEvent) -> str:
    name = event.name
    return name if isinstance(name, str) and name else "torchelastic.event"


class _Emitter:
    """Holds the OTel logger of the current pipeline; re-resolved when the pipeline changes."""

    def __init__(self) -> None:
        self._generation = -1
        self._logger: Any = None

    def logger(self) -> Any:
        if self._generation != pipeline._generation[0] or self._logger is None:
            provider = pipeline.get_pipeline().logger_provider
            self._logger = provider.get_logger(SCOPE, __version__)
            self._generation = pipeline._generation[0]
        return self._logger


_emitter = _Emitter()


def export_event(event: Event | RdzvEvent) -> None:
    """Emit ``event`` as a log record and as a span event on the current recording span. Never raises.

    Nothing is converted when nobody would receive it: no recording span and a logger that is not enabled
    (no-op pipeline / ``OTEL_SDK_DISABLED``, a disabled logger, no log processor).
    """
    try:
        severity = _SEVERITY.get(_state_of(event), _INFO)
        logger = _emitter.logger()
        enabled = logger.enabled(severity_number=severity[0], event_name=_name_of(event))
        span = trace.get_current_span()
        recording = span.is_recording()
        if not (enabled or recording):
            return
        fields = _log_fields(event, severity)
        if recording:
            span.add_event(fields["event_name"], fields["attributes"], fields["timestamp"])
        if enabled:
            logger.emit(**fields)
    except Exception as exc:  # telemetry never raises into the job
        _selftelemetry.count(_selftelemetry.DROPPED, "logs", "conversion_error")
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
        pipeline.get_pipeline()  # set the global providers now, before the application starts spans

    def emit(self, record: logging.LogRecord) -> None:  # noqa: D102 - logging.Handler API
        try:
            msg = record.msg
            if isinstance(msg, (Event, RdzvEvent)):
                event: Event | RdzvEvent | None = msg
            else:
                try:
                    event = _event_from_json(record.getMessage())
                except (ValueError, TypeError, KeyError, RecursionError):
                    event = None
            if event is None:
                event = Event(
                    name=record.name,
                    source=None,
                    timestamp=int(record.created * 1000),
                    metadata={"message": record.getMessage(), "level": record.levelname},
                )
            export_event(event)
        except Exception:
            _selftelemetry.count(_selftelemetry.DROPPED, "logs", "conversion_error")

    def export(self, event: Event | RdzvEvent) -> None:
        """Export an event object directly (the fast path of the bridge's ``record``)."""
        export_event(event)


class OtelEventHandler(EventHandler):
    """Legacy-API handler (``events.configure(OtelEventHandler(), event_type=...)``) exporting to OpenTelemetry.

    ``delegate`` receives every event as well, so console output (or any handler) can be kept while exporting.
    """

    def __init__(self, delegate: EventHandler | None = None) -> None:
        self.delegate = delegate
        pipeline.get_pipeline()

    def record(self, event: Event) -> None:  # noqa: D102 - EventHandler API
        export_event(event)
        if self.delegate is not None:
            try:
                self.delegate.record(event)
            except Exception:
                _selftelemetry.count(_selftelemetry.DROPPED, "logs", "delegate_error")
