"""Drop-in for ``torch.distributed.elastic.events`` (and the legacy ``torchelastic.events``) over OpenTelemetry.

Code written against torch's module works after a prefix change::

    from torchelastic_otel import events

    events.record(events.Event("my.event", events.EventSource.WORKER, metadata={"k": 1}), destination="otel")

The "otel" destination exports each event as an OpenTelemetry log record (and a span event on the current span);
torch's destinations ("null", "console", "dynamic_rendezvous") behave as in torch. The legacy API --
``configure(handler, event_type)``, ``record_event(event)``, ``record(event_name, event_type, metadata)`` -- is here
too; ``record`` tells the two signatures apart by its first argument.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import socket
import traceback
from collections.abc import Iterator
from types import FrameType

from torchelastic_otel import _compat
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._export.attributes import safe_str
from torchelastic_otel.events import api, handlers
from torchelastic_otel.events._otel import OtelEventHandler, OtelLoggingHandler
from torchelastic_otel.events.api import (  # noqa: F401
    DEFAULT_EVENT_TYPE,
    ConsoleEventHandler,
    Event,
    EventHandler,
    EventMetadataValue,
    EventSource,
    NodeState,
    NullEventHandler,
    RdzvEvent,
    _legacy_default,  # the legacy API's routing, for code that reads it here
    _legacy_handlers,
    configure,
    record_event,
)
from torchelastic_otel.events.handlers import get_logging_handler

__all__ = [
    "Event",
    "EventMetadataValue",
    "EventSource",
    "NodeState",
    "RdzvEvent",
    "record",
    "record_rdzv_event",
    "construct_and_record_rdzv_event",
    "get_logging_handler",
    "EventHandler",
    "ConsoleEventHandler",
    "NullEventHandler",
    "OtelEventHandler",
    "OtelLoggingHandler",
    "configure",
    "record_event",
]

_events_loggers: dict[str, logging.Logger] = {}


def _get_or_create_logger(destination: str = "null") -> logging.Logger:
    """The non-propagating logger of ``destination``, as torch builds it (level from ``LOGLEVEL``).

    The logger names differ from torch's so that torch's and the bridge's loggers never share handlers.
    """
    logger = _events_loggers.get(destination)
    if logger is None:
        handler = get_logging_handler(destination)  # unknown destination: KeyError, as in torch
        logger = logging.getLogger(f"torchelastic-otel-events-{destination}")
        logger.setLevel(os.environ.get("LOGLEVEL", "INFO"))
        logger.propagate = False
        if handler not in logger.handlers:
            logger.addHandler(handler)
        _events_loggers[destination] = logger
    return logger


def _record_to(event: Event | RdzvEvent, destination: str) -> None:
    """torch's ``record``: log ``event.serialize()`` to the destination's logger, without needless work.

    NullHandlers are skipped without serializing; an "otel" handler receives the event object itself instead of
    its JSON; only the remaining handlers get torch's serialized message. An event that cannot be serialized
    still reaches OpenTelemetry and is counted as dropped for the other handlers, instead of raising.
    """
    logger = _get_or_create_logger(destination)
    if not logger.isEnabledFor(logging.INFO):
        return
    handlers = logger.handlers
    if len(handlers) == 1:
        handler = handlers[0]
        if type(handler) is logging.NullHandler:
            return
        if type(handler) is OtelLoggingHandler:
            handler.export(event)
            return
    others = []
    for handler in handlers:
        if type(handler) is OtelLoggingHandler:
            handler.export(event)
        elif type(handler) is not logging.NullHandler:
            others.append(handler)
    if not others:
        return
    try:
        message = event.serialize()
    except Exception:  # unserializable metadata, or a user's container raising: never into the caller
        selftelemetry.count(selftelemetry.DROPPED, "logs", "not_serializable")
        return
    record = logger.makeRecord(logger.name, logging.INFO, "(unknown file)", 0, message, (), None)
    if logger.filter(record):
        for handler in others:
            if record.levelno >= handler.level:
                handler.handle(record)


class _Unset(enum.Enum):
    """No ``destination`` given: ``"null"`` in torch's form, the default event type in the legacy one."""

    UNSET = enum.auto()


def record(
    event: Event | RdzvEvent | str | None = None,
    destination: str | _Unset = _Unset.UNSET,
    metadata: dict[str, EventMetadataValue] | None = None,
    *,
    event_name: str | None = None,
    event_type: str | None = None,
) -> None:
    """Record an event: torch's ``record(event, destination="null")`` or legacy ``record(event_name, event_type,
    metadata)``.

    An ``Event``/``RdzvEvent`` first argument selects torch's form (``destination`` names a handler of
    ``get_logging_handler``; an unknown one raises ``KeyError`` as in torch). A string (or ``event_name=``) selects
    the legacy form: the event goes to the handler configured for ``event_type`` (default ``torchelastic``).
    """
    if isinstance(event, (Event, RdzvEvent)) or (not isinstance(event, str) and hasattr(event, "serialize")):
        _record_to(event, "null" if destination is _Unset.UNSET else destination)  # type: ignore[arg-type]
        return
    name = event_name if event_name is not None else event
    if event_type is None:
        event_type = DEFAULT_EVENT_TYPE if destination is _Unset.UNSET else destination
    if not isinstance(name, str):
        selftelemetry.count(selftelemetry.SANITIZED, "logs", "event_name_not_str")
        name = "" if name is None else safe_str(name)
    record_event(Event(name, type=safe_str(event_type), metadata=metadata))


api.record = record  # the legacy API's ``events.api.record`` (declared there)


def record_rdzv_event(event: RdzvEvent) -> None:
    """Record a rendezvous event to the "dynamic_rendezvous" destination."""
    _record_to(event, "dynamic_rendezvous")


def construct_and_record_rdzv_event(
    run_id: str,
    message: str,
    node_state: NodeState,
    name: str = "",
    hostname: str = "",
    pid: int | None = None,
    master_endpoint: str = "",
    local_id: int | None = None,
    rank: int | None = None,
) -> None:
    """Build and record a rendezvous event, exactly as torch's function does.

    Skipped while the "dynamic_rendezvous" handler is a ``logging.NullHandler`` (as in torch). The caller's file and
    function come from its frame (``_compat.caller_frame``), not from ``inspect.stack()``, which reads every frame's
    source lines.
    """
    if isinstance(get_logging_handler("dynamic_rendezvous"), logging.NullHandler):
        return
    caller = _compat.caller_frame(1)
    event = make_rdzv_event(caller, run_id, message, node_state, name, hostname, pid, master_endpoint, local_id, rank)
    del caller
    record_rdzv_event(event)


def make_rdzv_event(  # torch's parameters, after the caller's frame
    caller: FrameType | None,
    run_id: str,
    message: str,
    node_state: NodeState,
    name: str = "",
    hostname: str = "",
    pid: int | None = None,
    master_endpoint: str = "",
    local_id: int | None = None,
    rank: int | None = None,
) -> RdzvEvent:
    """torch's event construction: defaults for host and pid, ``"<caller file>:<name or caller function>"``,
    the current exception's traceback for FAILED."""
    if not hostname:
        hostname = _fqdn()
    if not pid:
        pid = os.getpid()
    filename = "no_file"
    if caller is not None:
        filename = os.path.basename(caller.f_code.co_filename)
        if not name:
            name = caller.f_code.co_name
    error_trace = traceback.format_exc() if node_state == NodeState.FAILED else ""
    return RdzvEvent(
        name=f"{filename}:{name}",
        run_id=run_id,
        message=message,
        hostname=hostname,
        pid=pid,
        node_state=node_state,
        master_endpoint=master_endpoint,
        rank=rank,
        local_id=local_id,
        error_trace=error_trace,
    )


_fqdn_cache: list[str] = []


def _fqdn() -> str:
    """``socket.getfqdn()`` once per process: it can take a DNS round trip, and the host does not change."""
    if not _fqdn_cache:
        _fqdn_cache.append(socket.getfqdn())
    return _fqdn_cache[0]


@contextlib.contextmanager
def _state_restored() -> Iterator[None]:
    """Run a block (a test) and put the API's process-wide routing back as it was: the legacy API's handlers, the
    destinations' logging handlers, and the per-destination loggers (forgotten before and after, with their
    handlers detached, so the next record builds them afresh). The module keeps torch's names for this state
    (``_log_handlers``, ``_events_loggers``)."""
    with api.legacy_routing_restored(), handlers.destinations_restored():
        _forget_loggers()
        try:
            yield
        finally:
            _forget_loggers()


def _forget_loggers() -> None:
    for logger in _events_loggers.values():
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
    _events_loggers.clear()
