"""Event data types, byte-compatible with ``torch.distributed.elastic.events.api``.

The classes mirror torch's field for field so that ``serialize()`` of an event built the torch way produces the
same JSON as torch's, and JSON written by either side deserializes on the other. On top of that, :class:`Event`
also accepts the legacy ``torchelastic.events`` constructor (``Event(name, type="...", metadata=..., timestamp=...)``)
so code written against either API works after a prefix change. The legacy API lives here as well, as it did in
``torchelastic.events.api``: the handler interface, ``configure``, ``record_event`` and ``record`` (the same function
as ``torchelastic_otel.events.record``, which also takes torch's signature).
"""

from __future__ import annotations

import abc
import contextlib
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

__all__ = [
    "EventSource",
    "Event",
    "NodeState",
    "RdzvEvent",
    "EventMetadataValue",
    "EventHandler",
    "ConsoleEventHandler",
    "NullEventHandler",
    "configure",
    "record",
    "record_event",
]

EventMetadataValue = str | int | float | bool | None

#: The legacy API's default event type, reserved for platform events.
DEFAULT_EVENT_TYPE = "torchelastic"


class EventSource(str, Enum):
    """Known identifiers of the event producers."""

    AGENT = "AGENT"
    WORKER = "WORKER"


class NodeState(str, Enum):
    """The states that a node can be in rendezvous."""

    INIT = "INIT"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


def _is_source(value: object) -> bool:
    """True for an ``EventSource`` or its string value, i.e. the torch-style second positional argument."""
    if isinstance(value, EventSource):
        return True
    try:
        return value in EventSource._value2member_map_
    except TypeError:  # unhashable: torch's dataclass accepts any source, so must this
        return False


def _type_name(value: object) -> str:
    """``str(value)``, or a placeholder if a user object's ``__str__`` raises: constructing an event never fails."""
    try:
        return str(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"


@dataclass(init=False)
class Event:
    """A generic event of a torchelastic job (same fields and JSON as torch's ``Event``).

    Args:
        name: event name.
        source: the event producer, e.g. agent or worker.
        timestamp: timestamp in milliseconds when the event occurred (0: "now" when exported).
        metadata: additional data associated with the event.
        type / event_type: the legacy ``torchelastic.events`` routing key (keyword only). The legacy positional
            form ``Event(name, "my_type", {...}, ts)`` is recognised too: a second positional argument that is not
            an ``EventSource`` is taken as the legacy type.

    Only the four torch fields are dataclass fields, so ``asdict``/``serialize`` stay byte-compatible with torch.
    A legacy event serializes with ``"source": null`` and an extra ``"type"`` key.
    """

    name: str
    source: EventSource
    timestamp: int = 0
    metadata: dict[str, EventMetadataValue] = field(default_factory=dict)

    def __init__(
        self,
        name: str,
        source: EventSource | str | None = None,
        timestamp: Any = 0,  # torch's form: ms; the legacy positional form: the metadata (swapped below)
        metadata: Any = None,  # torch's form: a dict; the legacy positional form: the timestamp
        *,
        type: str | None = None,  # the legacy API's keyword (shadows the builtin here)
        event_type: str | None = None,
    ) -> None:
        legacy_type = event_type if event_type is not None else type
        if source is not None and not _is_source(source):
            # Legacy positional order: Event(name, type, metadata, timestamp).
            legacy_type, source = _type_name(source), None
            if timestamp is None or isinstance(timestamp, dict):
                timestamp, metadata = (metadata if metadata is not None else 0), timestamp
        self.name = name
        self.source = source  # type: ignore[assignment]
        self.timestamp = timestamp
        self.metadata = metadata if metadata is not None else {}
        self._type = legacy_type

    @property
    def type(self) -> str:
        """The legacy event type (routing key of :func:`record_event`); ``torchelastic`` unless given."""
        return self._type if self._type is not None else DEFAULT_EVENT_TYPE

    event_type = type

    def __str__(self) -> str:
        return self.serialize()

    @staticmethod
    def deserialize(data: str | Event) -> Event:
        if isinstance(data, Event):
            return data
        data_dict = json.loads(data)
        legacy_type = data_dict.pop("type", None)
        src = data_dict.get("source")
        data_dict["source"] = EventSource[src] if src is not None else None
        return Event(**data_dict, type=legacy_type)

    def serialize(self) -> str:
        data = asdict(self)
        if self._type is not None and self.source is None:
            data["type"] = self._type
        return json.dumps(data)


def legacy_type(event: object) -> str | None:
    """The legacy type ``event`` was built with (``Event(name, type=...)``); ``None`` for torch's form (and for
    torch's own events)."""
    return getattr(event, "_type", None)


@dataclass
class RdzvEvent:
    """A rendezvous event (same fields and JSON as torch's ``RdzvEvent``).

    Args:
        name: Event name. (E.g. Current action being performed)
        run_id: The run id of the rendezvous
        message: The message describing the event
        hostname: Hostname of the node
        pid: The process id of the node
        node_state: The state of the node (INIT, RUNNING, SUCCEEDED, FAILED)
        master_endpoint: The master endpoint for the rendezvous store, if known
        rank: The rank of the node, if known
        local_id: The local_id of the node, if defined in dynamic_rendezvous.py
        error_trace: Error stack trace, if this is an error event.
    """

    name: str
    run_id: str
    message: str
    hostname: str
    pid: int
    node_state: NodeState
    master_endpoint: str = ""
    rank: int | None = None
    local_id: int | None = None
    error_trace: str = ""

    def __str__(self) -> str:
        return self.serialize()

    @staticmethod
    def deserialize(data: str | RdzvEvent) -> RdzvEvent:
        if isinstance(data, RdzvEvent):
            return data
        data_dict = json.loads(data)
        data_dict["node_state"] = NodeState[data_dict["node_state"]]
        return RdzvEvent(**data_dict)

    def serialize(self) -> str:
        return json.dumps(asdict(self))


class EventHandler(abc.ABC):
    """Legacy ``torchelastic.events`` handler interface: receives every event of the types it is configured for."""

    @abc.abstractmethod
    def record(self, event: Event) -> None:
        """Process one event."""


class ConsoleEventHandler(EventHandler):
    """Prints each event as ``[type]: <event JSON>``."""

    def record(self, event: Event) -> None:
        print(f"[{getattr(event, 'type', DEFAULT_EVENT_TYPE)}]: {event.serialize()}")


class NullEventHandler(EventHandler):
    """The default legacy handler: ignores events."""

    def record(self, event: Event) -> None:
        return None


# ---- legacy torchelastic.events API -------------------------------------------------------------------------

_legacy_handlers: dict[str, EventHandler] = {}
_legacy_default: list[EventHandler] = [NullEventHandler()]


def configure(handler: EventHandler, event_type: str = "") -> None:
    """Send events of ``event_type`` to ``handler``; an empty type sets the handler for every other type."""
    if event_type:
        _legacy_handlers[event_type] = handler
    else:
        _legacy_default[0] = handler


def record_event(event: Event) -> None:
    """Hand ``event`` to the handler configured for its type. A failing handler is counted, never raised."""
    handler = _legacy_handlers.get(getattr(event, "type", DEFAULT_EVENT_TYPE), _legacy_default[0])
    try:
        handler.record(event)
    except Exception as exc:
        from torchelastic_otel import _selftelemetry as selftelemetry

        selftelemetry.count(selftelemetry.DROPPED, "logs", "handler_error")
        logging.getLogger("torchelastic_otel").debug("event handler failed: %s", exc, exc_info=True)


@contextlib.contextmanager
def legacy_routing_restored() -> Iterator[None]:
    """Run a block (a test) and put the legacy API's routing back as it was: the handler ``configure`` set for each
    event type, and the default handler."""
    saved, saved_default = dict(_legacy_handlers), list(_legacy_default)
    try:
        yield
    finally:
        _legacy_handlers.clear()
        _legacy_handlers.update(saved)
        _legacy_default[:] = saved_default


#: ``record`` of the legacy ``torchelastic.events.api``: the package's function (torch's form and the legacy one; it
#: needs torch's destinations, defined above this module). ``torchelastic_otel.events``, which Python imports before
#: this module, sets it, so ``from torchelastic_otel.events.api import record`` gets that very function.
record: Callable[..., None]
