"""A dying worker's last records, kept where its agent reads them when the worker cannot send them itself.

A worker's final words (its ``torchelastic.worker.exception`` and ``torchelastic.worker.terminated`` records) are
the evidence this project exists for, and they are written at the worst moment: a SIGTERM lands anywhere (in an
import, inside the bridge's own locks, before the pipeline was ever built), and the collector may be down or
silent. So each is first written here, to a file in the directory the agent hands its workers
(``TORCHELASTIC_OTEL_FAILURE_DIR``; plain ``os`` calls, no lock, no import), then sent through the worker's
pipeline if it is READY; once a flush confirms it went out, the file is removed. What is left when the worker is
gone, the agent sends (:func:`deliver`), with ``torchelastic.delivered_by="agent"``: a record may then arrive
twice (sent, but not confirmed in time), never not at all. Each file names the worker's resource (its torchrun
attributes and pid: ``resource.torchrun_attributes``, no SDK needed), and the agent sends the record under it, through
its own exporters: in the backend the record is the worker's, as if the worker had sent it.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from torchelastic_otel import _names as names
from torchelastic_otel import _settings
from torchelastic_otel.resource import torchrun_attributes

if TYPE_CHECKING:
    from torchelastic_otel._export.state import Pipeline

__all__ = ["write", "write_span", "open_for_native_stop", "delivered", "deliver", "DIR_ENV"]

_logger = logging.getLogger("torchelastic_otel")

DIR_ENV = _settings.FAILURE_DIR.name
_PREFIX = "final-"
_NATIVE_PREFIX = "native-"
#: Bound on what the agent reads of one file (the stacks of a process with many threads are cut at 8 KiB already).
MAX_BYTES = 256 * 1024
_sequence = itertools.count()


# ---- worker side ----------------------------------------------------------------------------------------------


def has_agent() -> bool:
    """Whether this worker's agent takes what it leaves behind (a bridged agent gives it a directory)."""
    return bool(_settings.FAILURE_DIR.get())


def write(fields: dict[str, object], ctx: object = None) -> str | None:
    """Keep the log record ``fields`` (``Logger.emit`` keywords, as ``events._otel.to_log_fields`` makes them) and
    the span context of ``ctx`` for the agent; the file's path, or ``None`` (no directory, or it failed)."""
    directory = _settings.FAILURE_DIR.get()
    if not directory:
        return None
    try:
        data = _data(fields, ctx)
        path = os.path.join(directory, f"{_PREFIX}{os.getpid()}-{next(_sequence)}.json")
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8", errors="replace") as fh:
            json.dump(data, fh, ensure_ascii=True)
        os.replace(tmp, path)
        return path
    except Exception:
        return None


def _data(fields: dict[str, object], ctx: Any) -> dict[str, object]:
    """What a file holds of a record: its fields, the worker's resource and the span context of ``ctx``."""
    data = {key: _plain(value) for key, value in fields.items()}
    data["resource"] = torchrun_attributes()
    span_context = trace.get_current_span(ctx).get_span_context() if ctx is not None else None
    if span_context is not None and span_context.is_valid:
        data["trace_id"], data["span_id"] = span_context.trace_id, span_context.span_id
        data["trace_flags"] = int(span_context.trace_flags)
    return data


def _span_fields(name: str, start_ns: int | None, end_ns: int, attributes: dict[str, object]) -> dict[str, object]:
    return {"span": name, "start": start_ns or end_ns, "end": end_ns, "attributes": dict(attributes)}


def write_span(
    name: str, start_ns: int | None, end_ns: int, attributes: dict[str, Any], ctx: object = None
) -> str | None:
    """Keep a span of the worker's (its ``torchelastic.worker.start``, when it exits before its pipeline was
    built) for the agent to send; the file's path, or ``None``."""
    return write(_span_fields(name, start_ns, end_ns, attributes), ctx)


def open_for_native_stop(
    metadata: dict[str, object],
    ctx: object,
    span: tuple[str, int | None, int, dict[str, object]] | None,
    thread_names: dict[int, str],
) -> tuple[str, object] | None:
    """A file for the stacks ``faulthandler`` writes if SIGTERM lands while the main thread cannot run Python
    (``_process.signals.enter_native``), and what the agent makes of it then: its first line holds the terminated
    record's ``metadata``, the worker's trace context, its start span (``span``: name, start, end, attributes)
    and thread names; the stacks follow. ``(path, open file)``, or ``None``. The caller removes it afterwards
    (:func:`delivered`); one the worker left without stacks is removed by the agent, unsent."""
    directory = _settings.FAILURE_DIR.get()
    if not directory:
        return None
    path = os.path.join(directory, f"{_NATIVE_PREFIX}{os.getpid()}-{next(_sequence)}.stacks")
    try:
        head = {
            "metadata": {str(k): _plain(v) for k, v in metadata.items()},
            "record": _data({}, ctx),
            "span": _data(_span_fields(*span), ctx) if span is not None else None,
            "main": threading.main_thread().ident,
            "threads": {str(ident): name for ident, name in thread_names.items()},
        }
        fh = open(path, "w", encoding="utf-8", errors="replace")
    except Exception:
        return None
    try:
        fh.write(json.dumps(head, ensure_ascii=True) + "\n")
        fh.flush()
        return path, fh
    except Exception:
        fh.close()
        delivered(path)
        return None


def _plain(value: object) -> object:
    """What JSON holds: a severity enum as its number."""
    number = getattr(value, "value", None)
    return number if isinstance(number, int) and not isinstance(value, (bool, int)) else value


def delivered(path: str | None) -> None:
    """The worker's own flush sent the record: the agent has nothing to send for it."""
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass


# ---- agent side -----------------------------------------------------------------------------------------------


def deliver(directory: str | None, current: Pipeline) -> int:
    """Send the final words the workers of ``directory`` left behind through the agent's pipeline ``current``,
    each under its worker's resource, and remove them; how many were sent. Never raises (a damaged file is removed
    and counted)."""
    if not directory:
        return 0
    sources = _Sources(current)
    try:
        files = sorted(
            name
            for name in os.listdir(directory)
            if name.startswith(_PREFIX)
            and name.endswith(".json")
            or name.startswith(_NATIVE_PREFIX)
            and name.endswith(".stacks")
        )
    except OSError:
        return 0
    sent = 0
    for name in files:
        path = os.path.join(directory, name)
        try:
            sent += _send_native(path, sources) if name.startswith(_NATIVE_PREFIX) else _send(path, sources)
        except Exception:
            from torchelastic_otel import _selftelemetry as selftelemetry

            selftelemetry.count(selftelemetry.DROPPED, "logs", "final_words_unreadable")
            _logger.debug("torchelastic_otel: could not send %s", path, exc_info=True)
        finally:
            delivered(path)
    return sent


class _Sources:
    """The agent's logger, tracer and logging handler for each worker resource (made once, for one delivery)."""

    def __init__(self, current: Pipeline) -> None:
        self.current = current
        self.made: dict[object, dict[str, object]] = {}

    def _for(self, resource: object) -> dict[str, object]:
        attributes = resource if isinstance(resource, dict) else {}
        key = tuple(sorted((str(k), repr(v)) for k, v in attributes.items()))
        if key not in self.made:
            from torchelastic_otel._export import providers
            from torchelastic_otel.version import __version__

            logger_provider = providers.with_resource(self.current.logger_provider, "logs", attributes)
            tracer_provider = providers.with_resource(self.current.tracer_provider, "traces", attributes)
            self.made[key] = {
                "logger_provider": logger_provider,
                "logger": logger_provider.get_logger("torchelastic_otel.worker", __version__),
                "tracer": tracer_provider.get_tracer("torchelastic_otel", __version__),  # the worker's own scopes
            }
        return self.made[key]

    def get(self, resource: object) -> tuple[Any, Any]:
        made = self._for(resource)
        return made["logger"], made["tracer"]

    def logging_handler(self, resource: object) -> Any:
        """OpenTelemetry's logging handler for a worker's resource (the worker's Python log records)."""
        made = self._for(resource)
        if "handler" not in made:
            from torchelastic_otel._torch.worker import log_records

            made["handler"] = log_records.new_handler(made["logger_provider"])
        return made["handler"]


def _send_native(path: str, sources: _Sources) -> int:
    """The records of a worker that SIGTERM ended while it could not run Python (:func:`open_for_native_stop`): its
    ``torchelastic.worker.terminated`` record, with the stacks and the line ``faulthandler`` found it on, and its
    start span. Nothing for a file without stacks (no signal landed: the worker went on, or died another way)."""
    from torchelastic_otel._process import stacks as _stacks

    with open(path, encoding="utf-8", errors="replace") as fh:
        head_line = fh.readline(MAX_BYTES)
        dump = fh.read(MAX_BYTES)
    if not _stacks.has_faulthandler_stacks(dump):
        return 0
    head = json.loads(head_line)
    names_by_ident = {int(k): str(v) for k, v in (head.get("threads") or {}).items() if str(k).isdigit()}
    main = head.get("main") if isinstance(head.get("main"), int) else None
    stacks = _stacks.from_faulthandler(dump, main, names_by_ident)
    stopped_ns = os.stat(path).st_mtime_ns  # when faulthandler wrote: the worker's death
    sent = 0
    if isinstance(head.get("span"), dict):
        sent += _send_data(head["span"], sources)
    sent += _send_data(_native_terminated(head, stacks, stopped_ns), sources)
    return sent


def _native_terminated(head: dict[str, Any], stacks: Any, stopped_ns: int) -> dict[str, object]:
    """The terminated record the worker would have sent (``_torch.worker.hooks``), from what the file holds."""
    from torchelastic_otel.events import _otel as event_adapter
    from torchelastic_otel.events.api import Event, EventSource

    metadata = dict(head.get("metadata") or {})
    if stacks.text:
        metadata.update(stack=stacks.text, stack_threads=stacks.threads, stack_source="faulthandler")
    event = Event(names.WORKER_TERMINATED, EventSource.WORKER, timestamp=stopped_ns // 1_000_000, metadata=metadata)
    fields = event_adapter.to_log_fields(event)
    frame = stacks.user_frame
    if frame is not None:
        fields["attributes"].update(
            {"code.file.path": frame.path, "code.line.number": frame.line, "code.function.name": frame.function}
        )
    record = dict(head.get("record") or {})
    record.update({key: _plain(value) for key, value in fields.items()})
    return record


def _send(path: str, sources: _Sources) -> int:
    with open(path, encoding="utf-8", errors="replace") as fh:
        data = json.loads(fh.read(MAX_BYTES))
    return _send_data(data, sources)


def _send_data(data: object, sources: _Sources) -> int:
    if not isinstance(data, dict) or not isinstance(data.get("attributes"), dict):
        raise ValueError("not a record")
    logger, tracer = sources.get(data.get("resource"))
    attributes = dict(data["attributes"])
    attributes[names.DELIVERED_BY] = "agent"
    if isinstance(data.get("logging"), dict):  # a Python log record the worker buffered (``log_records``)
        from opentelemetry import context as otel_context

        from torchelastic_otel._torch.worker import log_records

        token = otel_context.attach(_context(data) or otel_context.Context())
        try:
            log_records.emit_portable(sources.logging_handler(data.get("resource")), data["logging"], attributes)
        finally:
            otel_context.detach(token)
        return 1
    if "span" in data:
        span = tracer.start_span(
            str(data["span"]), context=_context(data), start_time=_int(data.get("start")), attributes=attributes
        )
        span.end(end_time=_int(data.get("end")))
        return 1
    from opentelemetry._logs import SeverityNumber

    logger.emit(
        timestamp=_int(data.get("timestamp")),
        observed_timestamp=_int(data.get("observed_timestamp")),
        severity_number=SeverityNumber(data["severity_number"]) if data.get("severity_number") else None,
        severity_text=data.get("severity_text"),
        body=data.get("body"),
        attributes=attributes,
        event_name=data.get("event_name"),
        context=_context(data),
    )
    return 1


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and value > 0 else None


def _context(data: dict[str, Any]) -> Any:
    """The worker's trace context (its attempt span), so the record sits where the worker would have put it."""
    trace_id, span_id = data.get("trace_id"), data.get("span_id")
    if not (isinstance(trace_id, int) and isinstance(span_id, int)):
        return None
    span_context = trace.SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(int(data.get("trace_flags", 1)) & 0xFF)
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(span_context))
