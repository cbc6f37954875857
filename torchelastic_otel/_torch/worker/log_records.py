"""Python ``logging`` records in a torchrun worker become OpenTelemetry log records, with trace and span ids.

The conversion is OpenTelemetry's own ``LoggingHandler`` (``opentelemetry-instrumentation-logging``'s where
installed, else the SDK's), fed with the bridge's logger provider. What differs from putting that handler on the
root logger, and why:

- it is not added to the root logger's handlers: a handler there would make ``logging.basicConfig()`` a no-op
  and silence logging's last-resort output to stderr, so an unconfigured script's warnings would vanish from the
  console. Instead ``Logger.callHandlers`` (the documented step that hands a record to the handlers) is wrapped:
  after the application's handlers ran, the record is captured -- also that of a logger that does not propagate
  to the root logger (``transformers`` and Lightning give their library logger a console handler of its own and
  stop propagation), which a root handler would never see; the console stays as without the bridge;
- a console handler's line is not exported a second time from the worker's output (``output.capture``): before
  the handlers run, each ``StreamHandler`` of the record's way that writes to fd 1 or 2 formats the record (as it
  is about to) and its text is announced to the output's record process, which then leaves those lines out
  (one non-blocking pipe write; none when the output is not captured). What a handler's filter turns down was
  announced all the same: the record process forgets it after a while (``output_lines.Logged``);
- the caller only copies the record with its message formatted (``logging.handlers.QueueHandler`` does the same)
  and the current context into a bounded buffer; the drainer thread makes the OpenTelemetry record, which in the
  caller's thread would cost a training loop many times more (docs/performance.md);
- the trace context is the caller's current span, else the agent's attempt span (``TRACEPARENT``): records of
  threads without a span of their own belong to the attempt too;
- records of the bridge's and OpenTelemetry's own loggers, of torch's event loggers (their events are exported as
  events already) and of the SDK's and bridge's threads are left out: no feedback loops; and a record that reaches
  an OpenTelemetry ``LoggingHandler`` (logging auto-instrumentation puts one on the root logger) is left to it
  -- a logger that does not propagate there is captured, that handler never sees its records.

``TORCHELASTIC_OTEL_WORKER_LOGGING=0`` turns it off. A buffer overflow is counted (``buffer_full``).
"""

from __future__ import annotations

import copy
import logging
import time
import warnings
from collections.abc import Callable
from typing import Any

from opentelemetry import context, trace

from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel import _settings, pipeline
from torchelastic_otel._export import drainer as _drainer
from torchelastic_otel._torch import tracebacks
from torchelastic_otel._torch.output import capture as output
from torchelastic_otel._torch.patches import Patches

__all__ = ["install", "ENABLE_ENV"]

ENABLE_ENV = _settings.WORKER_LOGGING.name
#: Records buffered before new ones are dropped (counted), as for events.
MAX_PENDING = 65536
#: Loggers whose records are never exported: the bridge's, OpenTelemetry's, torch's event transport.
EXCLUDED_LOGGERS = ("torchelastic_otel", "opentelemetry", "torchelastic-events-")
#: Threads whose records are never exported: the SDK's exporters, the bridge's own.
EXCLUDED_THREADS = ("Otel", "torchelastic-otel")

_logger = logging.getLogger("torchelastic_otel")


def enabled() -> bool:
    """Not turned off, and log records are exported at all."""
    return _settings.WORKER_LOGGING.get() and _settings.logs_exporters() != {"none"}


def install(patches: Patches, default_context: Callable[[], object]) -> None:
    """Capture logging records from now on; ``patches`` restores ``Logger.callHandlers`` (if still ours)."""
    if not enabled():
        return
    buffer = _RecordBuffer(default_context)
    original = logging.Logger.callHandlers

    def callHandlers(self: logging.Logger, record: logging.LogRecord) -> None:  # logging's name
        wanted = buffer.before(self, record)
        try:
            original(self, record)
        except BaseException as exc:  # a handler's filter raised, or an interrupt: without this frame (tracebacks)
            if wanted:
                buffer.capture(record)
            tracebacks.drop_own_frame(exc)
            raise
        if wanted:
            buffer.capture(record)

    callHandlers.__torchelastic_otel__ = True  # type: ignore[attr-defined]
    callHandlers.__wrapped__ = original  # type: ignore[attr-defined]
    logging.Logger.callHandlers = callHandlers  # type: ignore[method-assign]

    def restore() -> None:
        if logging.Logger.__dict__.get("callHandlers") is callHandlers:
            logging.Logger.callHandlers = original  # type: ignore[method-assign]
        buffer.close()

    patches.on_restore(restore)


#: Whether a handler class is OpenTelemetry's ``LoggingHandler``, by class (by name: no SDK import here).
_OTEL_HANDLER_TYPES: dict[type, bool] = {}
#: What a record's way through the handlers holds (:func:`_route`): an OpenTelemetry handler, one that takes it.
OTEL_SEEN, OTEL_TAKES = 1, 2


def _is_otel_handler(handler: logging.Handler) -> bool:
    cls = type(handler)
    known = _OTEL_HANDLER_TYPES.get(cls)
    if known is None:
        known = any(c.__name__ == "LoggingHandler" and c.__module__.startswith("opentelemetry.") for c in cls.__mro__)
        if len(_OTEL_HANDLER_TYPES) < 256:
            _OTEL_HANDLER_TYPES[cls] = known
    return known


def _route(logger: logging.Logger, level: int, consoles: bool) -> tuple[list[logging.StreamHandler[Any]], int]:
    """The handlers ``logging.Logger.callHandlers`` is about to hand a record of ``level`` to, as it walks them
    (logging's last resort where there is none): the ``StreamHandler``s among them (if ``consoles``), and whether
    an OpenTelemetry ``LoggingHandler`` is on the way (:data:`OTEL_SEEN`) and takes the record (:data:`OTEL_TAKES`)."""
    streams: list[logging.StreamHandler[Any]] = []
    otel = found = 0
    current: Any = logger
    while current is not None:
        for handler in current.handlers:
            found += 1
            if isinstance(handler, logging.StreamHandler):
                if consoles and level >= handler.level:
                    streams.append(handler)
            elif _is_otel_handler(handler):
                otel = max(otel, OTEL_TAKES if level >= handler.level else OTEL_SEEN)
        current = current.parent if current.propagate else None
    if not found and consoles:
        last = logging.lastResort
        if last is not None and level >= last.level and isinstance(last, logging.StreamHandler):
            streams.append(last)
    return streams, otel


def _handler_class() -> type:
    try:
        from opentelemetry.instrumentation.logging.handler import LoggingHandler

        return LoggingHandler
    except ImportError:
        from opentelemetry.sdk._logs import LoggingHandler

        return LoggingHandler


def _new_handler(logger_provider: object) -> logging.Handler:
    """OpenTelemetry's handler with code attributes (``code.file.path``, ``code.function.name``, ...)."""
    cls = _handler_class()
    with warnings.catch_warnings():  # the SDK's handler warns that it is deprecated in favour of the other one
        warnings.simplefilter("ignore", DeprecationWarning)
        if cls.__module__.startswith("opentelemetry.instrumentation"):
            return cls(logger_provider=logger_provider, log_code_attributes=True)
        return cls(logger_provider=logger_provider)


class _RecordBuffer(_drainer.Buffer):
    """Logging records on their way to OpenTelemetry's handler (converted by the drainer)."""

    signal = "logs"

    def __init__(self, default_context: Callable[[], object]) -> None:
        super().__init__(MAX_PENDING)
        self.default_context = default_context
        self._handler: logging.Handler | None = None
        self._generation = -1
        self._closed = False
        self._fds: dict[int, tuple[object, int]] = {}  # id(stream) -> (stream, its fd or -1)
        _drainer.register(self)

    def before(self, logger: logging.Logger, record: logging.LogRecord) -> bool:
        """Before the handlers: whether ``record`` is to be captured; the lines the console handlers are about to
        print of an exported record are announced to the output capture first. The hot path. Never raises."""
        try:
            if self._closed or record.name.startswith(EXCLUDED_LOGGERS):
                return False
            if (record.threadName or "").startswith(EXCLUDED_THREADS):
                return False
            consoles, otel = _route(logger, record.levelno, output.announcing())
            wanted = not otel  # an OpenTelemetry handler on the way exports it (or was set not to)
            if consoles and (otel == OTEL_TAKES or (wanted and len(self._pending) < self.max_pending)):
                self._announce(consoles, record)
            return wanted
        except Exception:
            selftelemetry.count(selftelemetry.DROPPED, "logs", "conversion_error")
            return False

    def _announce(self, handlers: list[logging.StreamHandler[Any]], record: logging.LogRecord) -> None:
        """The text each handler that prints to fd 1 or 2 is about to write, announced (``output.announce``).
        A handler whose formatting fails announces nothing: logging prints its error, which stays a line."""
        for handler in handlers:
            stream = handler.stream
            index = output.console_stream(self._fd(stream))
            if index < 0:
                continue
            try:
                text = handler.format(record) + handler.terminator
                data = text.encode(
                    getattr(stream, "encoding", None) or "utf-8", getattr(stream, "errors", None) or "strict"
                )
            except Exception:
                continue
            output.announce(index, data)

    def _fd(self, stream: Any) -> int:
        """The fd ``stream`` writes to, or -1 (cached by stream: ``fileno()`` of a stream that has none raises)."""
        known = self._fds.get(id(stream))
        if known is not None and known[0] is stream:
            return known[1]
        try:
            fd = stream.fileno()
        except Exception:
            fd = -1
        if len(self._fds) >= 64:
            self._fds.clear()
        self._fds[id(stream)] = (stream, fd if isinstance(fd, int) else -1)
        return self._fds[id(stream)][1]

    def capture(self, record: logging.LogRecord) -> None:
        """After the handlers: the record into the buffer (:meth:`before` said so). Never raises."""
        try:
            pending = self._pending
            if len(pending) >= self.max_pending:
                self._overflow += 1
                return
            pending.append((_frozen(record), context.get_current()))
        except Exception:
            selftelemetry.count(selftelemetry.DROPPED, "logs", "conversion_error")

    def drain(self, deadline: float | None = None) -> int:
        """Hand buffered records to OpenTelemetry's handler, each in the context it was logged in."""
        with self._lock:
            self._count_overflow()
            return self._emit_pending(deadline) if self._pending else 0

    def _emit_pending(self, deadline: float | None) -> int:
        handler, pending, emitted = self._current_handler(), self._pending, 0
        while pending and (deadline is None or time.monotonic() < deadline):
            for _ in range(min(64, len(pending))):  # the clock is read once per 64 records
                self._emit(handler, *pending.popleft())
                emitted += 1
        return emitted

    def _emit(self, handler: logging.Handler, record: logging.LogRecord, ctx: Any) -> None:
        if not trace.get_current_span(ctx).get_span_context().is_valid:
            ctx = self.default_context() or ctx
        token = context.attach(ctx)
        try:
            handler.emit(record)
        except Exception:
            selftelemetry.count(selftelemetry.DROPPED, "logs", "conversion_error")
        finally:
            context.detach(token)

    def _current_handler(self) -> logging.Handler:
        """The handler for the current pipeline (a new one after the pipeline was replaced, e.g. after a fork)."""
        if self._handler is None or self._generation != pipeline.state.generation[0]:
            self._handler = _new_handler(pipeline.get_pipeline().logger_provider)
            self._generation = pipeline.state.generation[0]
        return self._handler

    def hand_over(self, keep: Callable[[dict[str, object], object], object]) -> bool:
        """An exit before the pipeline was built: each buffered record, as its portable fields (:func:`portable`),
        to ``keep(fields, ctx)`` (``_export.drainer.hand_over_all``); ``True`` if every one was kept. The agent
        converts them with the same OpenTelemetry handler (``_torch.final_words``)."""
        return self._hand_over_items(keep, self._portable_item)

    def _portable_item(self, item: tuple[logging.LogRecord, Any]) -> tuple[dict[str, object], object]:
        record, ctx = item
        if not trace.get_current_span(ctx).get_span_context().is_valid:
            ctx = self.default_context() or ctx
        return {"logging": portable(record), "attributes": {}}, ctx

    def close(self) -> None:
        """Uninstalled: what is buffered still goes out (drained now), nothing more is captured."""
        self._closed = True
        _drainer.drain_all(time.monotonic() + 0.5, signal="logs")


def portable(record: logging.LogRecord) -> dict[str, object]:
    """A frozen record's fields as JSON holds them (``logging.makeLogRecord`` makes the record again): values
    that are not plain become their ``str``; an exception becomes the ``exception.*`` attributes OpenTelemetry's
    handler would derive from it."""
    fields: dict[str, object] = {}
    for key, value in vars(record).items():
        if key in ("args", "exc_info"):
            continue
        fields[key] = value if value is None or isinstance(value, (str, int, float, bool)) else str(value)
    exc_info = record.exc_info
    if isinstance(exc_info, tuple) and exc_info[0] is not None:
        import traceback

        exc_type, exc, tb = exc_info
        fields["exception.type"] = exc_type.__name__
        if exc is not None and exc.args:
            fields["exception.message"] = str(exc.args[0])
        fields["exception.stacktrace"] = "".join(traceback.format_exception(exc_type, exc, tb))
    return fields


def emit_portable(handler: logging.Handler, fields: dict[str, object], extra: dict[str, object]) -> None:
    """Emit the record :func:`portable` kept, with ``extra`` attributes, through ``handler`` (an agent's)."""
    record = logging.makeLogRecord({**fields, **extra})
    handler.emit(record)


def new_handler(logger_provider: object) -> logging.Handler:
    """OpenTelemetry's logging handler, writing to ``logger_provider``."""
    return _new_handler(logger_provider)


def _frozen(record: logging.LogRecord) -> logging.LogRecord:
    """A copy with its message formatted now: the arguments may change before the drainer converts it."""
    frozen = copy.copy(record)
    try:
        frozen.msg = record.getMessage()
    except Exception:  # arguments that do not fit the format: logging reports it; keep the raw message
        selftelemetry.count(selftelemetry.SANITIZED, "logs", "value_stringified")
        frozen.msg = str(record.msg)
    frozen.args = None
    return frozen
