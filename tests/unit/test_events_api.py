"""The events API is a drop-in for ``torch.distributed.elastic.events`` and the legacy ``torchelastic.events``.

Every compatibility claim is checked against torch's real module: same JSON bytes, JSON readable by the other side,
same dataclass fields, same destinations and errors, same rendezvous event names.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import socket

import pytest
import torch.distributed.elastic.events as tev
import torch.distributed.elastic.events.api as tev_api
import torch.distributed.elastic.events.handlers as tev_handlers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import examples
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel import events
from torchelastic_otel.events import api as te_api
from torchelastic_otel.events import handlers as te_handlers

THIS_FILE = os.path.basename(__file__)

# ---- strategies ------------------------------------------------------------------------------------------------

_metadata_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
)
_metadata = st.dictionaries(st.text(max_size=15), _metadata_values, max_size=6)
_sources = st.sampled_from(["AGENT", "WORKER"])
_timestamps = st.one_of(st.just(0), st.integers(min_value=0, max_value=2**62))
_fast = settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


class Capture(logging.Handler):
    """A logging handler that keeps every formatted message."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _forget_loggers(loggers: dict) -> None:
    for logger in loggers.values():
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
    loggers.clear()


@pytest.fixture
def torch_events_state():
    """Restore torch's ``_log_handlers`` and forget its cached destination loggers around a test."""
    saved = dict(tev_handlers._log_handlers)
    _forget_loggers(tev._events_loggers)
    try:
        yield
    finally:
        _forget_loggers(tev._events_loggers)
        tev_handlers._log_handlers.clear()
        tev_handlers._log_handlers.update(saved)


@pytest.fixture
def both_captured(clean_state, torch_events_state):
    """Install a capturing handler for "dynamic_rendezvous" in torch's and in the bridge's ``_log_handlers``."""
    ours, theirs = Capture(), Capture()
    te_handlers._log_handlers["dynamic_rendezvous"] = ours
    tev_handlers._log_handlers["dynamic_rendezvous"] = theirs
    return ours, theirs


@pytest.fixture
def console_streams(clean_state, torch_events_state):
    """Point both modules' "console" StreamHandlers at fresh StringIO streams (restored afterwards)."""
    ours_handler = te_handlers.get_logging_handler("console")
    torch_handler = tev_handlers.get_logging_handler("console")
    ours, theirs = io.StringIO(), io.StringIO()
    old_ours, old_theirs = ours_handler.setStream(ours), torch_handler.setStream(theirs)
    try:
        yield ours, theirs
    finally:
        ours_handler.setStream(old_ours)
        torch_handler.setStream(old_theirs)


# ---- torch API: data types -------------------------------------------------------------------------------------

EXAMPLE_EVENTS = [
    dict(name="test_event", source="WORKER"),
    dict(name="test_event", source="AGENT", metadata={}),
    dict(name="torchelastic.worker.status.SUCCEEDED", source="AGENT", timestamp=0, metadata={"state": "SUCCEEDED"}),
    dict(name="n", source="WORKER", timestamp=1_700_000_000_123, metadata={"a": 1, "b": 2.5, "c": True, "d": None}),
    dict(name="ünïcødé ✓", source="AGENT", timestamp=5, metadata={'k"ey': "va\nlue", "": "", "x": -(2**64)}),
    dict(name="", source="WORKER", metadata={"nested": '{"local_rank": [0]}'}),
]


def _pair(kwargs: dict, source_as: str = "enum") -> tuple[te_api.Event, tev_api.Event]:
    """The same event built with the bridge's class and with torch's."""
    kw = dict(kwargs)
    src = kw.pop("source")
    ours_src = te_api.EventSource[src] if source_as == "enum" else src
    torch_src = tev_api.EventSource[src] if source_as == "enum" else src
    return te_api.Event(source=ours_src, **kw), tev_api.Event(source=torch_src, **kw)


@pytest.mark.parametrize("kwargs", EXAMPLE_EVENTS)
@pytest.mark.parametrize("source_as", ["enum", "string"])
def test_event_serialize_is_byte_identical_to_torch(kwargs, source_as):
    ours, theirs = _pair(kwargs, source_as)
    assert ours.serialize() == theirs.serialize()
    assert str(ours) == ours.serialize() == str(theirs)


def test_event_positional_torch_form_matches_torch():
    ours = te_api.Event("n", te_api.EventSource.AGENT, 42, {"k": 1})
    theirs = tev_api.Event("n", tev_api.EventSource.AGENT, 42, {"k": 1})
    assert ours.serialize() == theirs.serialize()
    assert ours.source is te_api.EventSource.AGENT and ours.timestamp == 42 and ours.metadata == {"k": 1}


@_fast
@given(name=st.text(max_size=30), source=_sources, timestamp=_timestamps, metadata=st.one_of(st.none(), _metadata))
def test_event_serialize_and_cross_deserialize_property(name, source, timestamp, metadata):
    kwargs = dict(name=name, source=source, timestamp=timestamp)
    if metadata is not None:
        kwargs["metadata"] = metadata
    ours, theirs = _pair(kwargs)
    ours_json, torch_json = ours.serialize(), theirs.serialize()
    assert ours_json == torch_json
    assert str(ours) == torch_json

    # our JSON -> torch's deserialize
    back_in_torch = tev_api.Event.deserialize(ours_json)
    assert back_in_torch == theirs
    assert back_in_torch.source is tev_api.EventSource[source]
    # torch's JSON -> ours
    back_in_ours = te_api.Event.deserialize(torch_json)
    assert isinstance(back_in_ours, te_api.Event)
    assert back_in_ours == ours
    assert back_in_ours.source is te_api.EventSource[source]
    assert back_in_ours.serialize() == torch_json


_rdzv_events = st.fixed_dictionaries(
    {
        "name": st.text(max_size=30),
        "run_id": st.text(max_size=10),
        "message": st.text(max_size=30),
        "hostname": st.text(max_size=10),
        "pid": st.integers(min_value=0, max_value=2**31),
        "node_state": st.sampled_from(["INIT", "RUNNING", "SUCCEEDED", "FAILED"]),
    },
    optional={
        "master_endpoint": st.text(max_size=10),
        "rank": st.one_of(st.none(), st.integers(min_value=0, max_value=1024)),
        "local_id": st.one_of(st.none(), st.integers(min_value=0, max_value=1024)),
        "error_trace": st.text(max_size=60),
    },
)


@_fast
@given(kwargs=_rdzv_events)
def test_rdzv_event_serialize_and_cross_deserialize_property(kwargs):
    state = kwargs.pop("node_state")
    ours = te_api.RdzvEvent(node_state=te_api.NodeState[state], **kwargs)
    theirs = tev_api.RdzvEvent(node_state=tev_api.NodeState[state], **kwargs)
    assert ours.serialize() == theirs.serialize()
    assert str(ours) == str(theirs) == ours.serialize()

    back_in_torch = tev_api.RdzvEvent.deserialize(ours.serialize())
    assert back_in_torch == theirs and back_in_torch.node_state is tev_api.NodeState[state]
    back_in_ours = te_api.RdzvEvent.deserialize(theirs.serialize())
    assert back_in_ours == ours and back_in_ours.node_state is te_api.NodeState[state]


def test_deserialize_returns_event_objects_unchanged():
    ev = te_api.Event("n", te_api.EventSource.AGENT)
    rd = te_api.RdzvEvent("n", "r", "m", "h", 1, te_api.NodeState.INIT)
    assert te_api.Event.deserialize(ev) is ev
    assert te_api.RdzvEvent.deserialize(rd) is rd


def _field_spec(cls) -> list[tuple]:
    return [(f.name, f.default, f.default_factory) for f in dataclasses.fields(cls)]


@pytest.mark.parametrize("name", ["Event", "RdzvEvent"])
def test_dataclass_fields_and_defaults_equal_torchs(name):
    ours, theirs = getattr(te_api, name), getattr(tev_api, name)
    assert dataclasses.is_dataclass(ours)
    assert _field_spec(ours) == _field_spec(theirs)


@pytest.mark.parametrize("name", ["EventSource", "NodeState"])
def test_enums_equal_torchs(name):
    ours, theirs = getattr(te_api, name), getattr(tev_api, name)
    assert [(m.name, m.value) for m in ours] == [(m.name, m.value) for m in theirs]
    for member in ours:
        assert isinstance(member, str) and member == theirs[member.name]


def test_public_names_of_torchs_module_exist():
    for name in ["Event", "EventMetadataValue", "EventSource", "NodeState", "RdzvEvent", "record",
                 "record_rdzv_event", "construct_and_record_rdzv_event", "get_logging_handler"]:  # fmt: skip
        assert hasattr(tev, name), name  # the list is torch's
        assert hasattr(events, name), name
    assert set(tev_api.__all__) <= set(te_api.__all__)


# ---- torch API: record and destinations ------------------------------------------------------------------------


@pytest.mark.usefixtures("clean_state")
@pytest.mark.parametrize("destination", ["null", "dynamic_rendezvous"])
def test_record_to_discarding_destinations(destination):
    events.record(te_api.Event("n", te_api.EventSource.AGENT), destination)
    events.record(te_api.RdzvEvent("n", "r", "m", "h", 1, te_api.NodeState.INIT), destination=destination)
    logger = events._events_loggers[destination]
    assert te_handlers.get_logging_handler(destination) in logger.handlers
    assert logger.propagate is False


@pytest.mark.usefixtures("clean_state")
def test_record_default_destination_is_null():
    events.record(te_api.Event("n", te_api.EventSource.AGENT))
    assert list(events._events_loggers) == ["null"]


@pytest.mark.usefixtures("clean_state", "torch_events_state")
def test_unknown_destination_raises_same_exception_type_as_torch():
    with pytest.raises(Exception) as theirs:
        tev.record(tev_api.Event("n", tev_api.EventSource.AGENT), "no_such_destination")
    with pytest.raises(Exception) as ours:
        events.record(te_api.Event("n", te_api.EventSource.AGENT), "no_such_destination")
    assert theirs.type is KeyError
    assert ours.type is theirs.type
    with pytest.raises(KeyError):
        events.get_logging_handler("no_such_destination")
    assert "no_such_destination" not in events._events_loggers


@pytest.mark.parametrize("kwargs", EXAMPLE_EVENTS)
def test_console_destination_prints_the_same_json_as_torch(console_streams, kwargs):
    ours_stream, torch_stream = console_streams
    ours, theirs = _pair(kwargs)
    events.record(ours, "console")
    tev.record(theirs, "console")
    assert ours_stream.getvalue() == ours.serialize() + "\n"
    assert ours_stream.getvalue() == torch_stream.getvalue()


def test_console_destination_prints_rdzv_events_and_torchs_event_objects(console_streams):
    ours_stream, _ = console_streams
    rdzv = te_api.RdzvEvent("n", "run", "msg", "host", 7, te_api.NodeState.RUNNING, rank=3)
    torch_event = tev_api.Event("t", tev_api.EventSource.WORKER, metadata={"k": "v"})
    events.record(rdzv, "console")
    events.record_rdzv_event(rdzv)  # "dynamic_rendezvous" is a NullHandler: nothing printed
    events.record(torch_event, "console")  # duck-typed: torch's own event objects take the torch path too
    assert ours_stream.getvalue().splitlines() == [rdzv.serialize(), torch_event.serialize()]


def test_destination_handlers_are_torchs_kinds():
    handler = te_handlers.get_logging_handler("console")
    assert type(handler) is logging.StreamHandler
    assert type(tev_handlers.get_logging_handler("console")) is logging.StreamHandler
    assert isinstance(te_handlers.get_logging_handler(), logging.NullHandler)
    assert isinstance(te_handlers.get_logging_handler("dynamic_rendezvous"), logging.NullHandler)


# ---- construct_and_record_rdzv_event ---------------------------------------------------------------------------


@pytest.mark.usefixtures("clean_state", "torch_events_state")
def test_construct_and_record_rdzv_event_skips_while_null_handler(monkeypatch):
    def no_lookups():
        raise AssertionError("hostname resolved although the destination discards")

    monkeypatch.setattr(socket, "getfqdn", no_lookups)
    assert isinstance(events.get_logging_handler("dynamic_rendezvous"), logging.NullHandler)
    events.construct_and_record_rdzv_event("run", "msg", te_api.NodeState.RUNNING)
    tev.construct_and_record_rdzv_event("run", "msg", tev_api.NodeState.RUNNING)  # torch skips the same way
    assert "dynamic_rendezvous" not in events._events_loggers
    assert "dynamic_rendezvous" not in tev._events_loggers


def _both(state: str, **common) -> None:
    """Call the bridge's and torch's ``construct_and_record_rdzv_event`` with the same arguments."""
    events.construct_and_record_rdzv_event(node_state=te_api.NodeState[state], **common)
    tev.construct_and_record_rdzv_event(node_state=tev_api.NodeState[state], **common)


def _captured_pair(both_captured) -> tuple[dict, dict]:
    ours, theirs = both_captured
    assert len(ours.messages) == 1 and len(theirs.messages) == 1, (ours.messages, theirs.messages)
    ours_event = te_api.RdzvEvent.deserialize(ours.messages.pop())
    theirs_event = tev_api.RdzvEvent.deserialize(theirs.messages.pop())
    return dataclasses.asdict(ours_event), dataclasses.asdict(theirs_event)


def test_construct_and_record_rdzv_event_names_the_caller_like_torch(both_captured):
    events.construct_and_record_rdzv_event("run-1", "joining", te_api.NodeState.RUNNING, rank=2, local_id=0)
    tev.construct_and_record_rdzv_event("run-1", "joining", tev_api.NodeState.RUNNING, rank=2, local_id=0)
    ours, theirs = _captured_pair(both_captured)
    assert ours["name"] == f"{THIS_FILE}:test_construct_and_record_rdzv_event_names_the_caller_like_torch"
    assert ours == theirs  # hostname (getfqdn) and pid (getpid) default the same way
    assert ours["hostname"] == socket.getfqdn() and ours["pid"] == os.getpid()
    assert ours["error_trace"] == "" and ours["node_state"] == "RUNNING"


def test_construct_and_record_rdzv_event_explicit_fields_like_torch(both_captured):
    common = dict(run_id="r", message="m", name="Handler.next_rendezvous", hostname="h0", pid=99,
                  master_endpoint="127.0.0.1:29500", local_id=3, rank=1)  # fmt: skip
    _both("SUCCEEDED", **common)
    ours, theirs = _captured_pair(both_captured)
    assert ours == theirs
    assert ours["name"] == f"{THIS_FILE}:Handler.next_rendezvous"
    assert (ours["hostname"], ours["pid"], ours["master_endpoint"]) == ("h0", 99, "127.0.0.1:29500")


def _helper_that_records(run_id: str) -> None:
    events.construct_and_record_rdzv_event(run_id, "from helper", te_api.NodeState.INIT)
    tev.construct_and_record_rdzv_event(run_id, "from helper", tev_api.NodeState.INIT)


def test_construct_and_record_rdzv_event_names_the_immediate_caller(both_captured):
    _helper_that_records("r")
    ours, theirs = _captured_pair(both_captured)
    assert ours["name"] == theirs["name"] == f"{THIS_FILE}:_helper_that_records"


def test_construct_and_record_rdzv_event_failed_records_current_exception(both_captured):
    try:
        raise ValueError("rendezvous broke")
    except ValueError:
        _both("FAILED", run_id="r", message="failed", hostname="h", pid=1)
    ours, theirs = _captured_pair(both_captured)
    assert ours == theirs
    assert ours["node_state"] == "FAILED"
    assert ours["error_trace"].startswith("Traceback (most recent call last):")
    assert "ValueError: rendezvous broke" in ours["error_trace"]


def test_construct_and_record_rdzv_event_pid_zero_defaults_like_torch(both_captured):
    _both("INIT", run_id="r", message="m", hostname="h", pid=0)
    ours, theirs = _captured_pair(both_captured)
    assert ours == theirs and ours["pid"] == os.getpid()


# ---- the "otel" destination ------------------------------------------------------------------------------------


def test_get_logging_handler_otel_is_otel_logging_handler(otel):
    handler = events.get_logging_handler("otel")
    assert isinstance(handler, events.OtelLoggingHandler)
    assert isinstance(handler, logging.Handler)
    assert events.get_logging_handler("otel") is handler
    assert "otel" in te_handlers._log_handlers


def test_record_to_otel_exports_a_log_record(otel):
    events.record(te_api.Event("my.event", te_api.EventSource.WORKER, metadata={"k": 1}), destination="otel")
    events.record(te_api.RdzvEvent("rd", "run", "hello", "h", 1, te_api.NodeState.FAILED), "otel")
    records = otel.log_records()
    assert [r.event_name for r in records] == ["my.event", "rd"]
    assert records[0].body == "my.event"
    assert records[0].attributes["torchelastic.k"] == 1
    assert records[0].attributes["torchelastic.source"] == "WORKER"
    assert records[1].body == "hello" and records[1].severity_number.value == 17


def test_torch_record_through_otel_logging_handler_exports(otel, torch_events_state):
    """Installed in torch's own ``_log_handlers``, the handler turns torch's serialized JSON back into an event."""
    tev_handlers._log_handlers["otel"] = events.OtelLoggingHandler()
    tev.record(tev_api.Event("torch.side", tev_api.EventSource.AGENT, metadata={"state": "FAILED"}), "otel")
    tev_handlers._log_handlers["dynamic_rendezvous"] = tev_handlers._log_handlers["otel"]
    tev.record_rdzv_event(tev_api.RdzvEvent("rd", "run", "msg", "h", 1, tev_api.NodeState.RUNNING))
    records = otel.log_records()
    assert [(r.event_name, r.body, r.severity_number.value) for r in records] == [
        ("torch.side", "torch.side", 17),
        ("rd", "msg", 9),
    ]
    assert records[1].attributes["torchelastic.run_id"] == "run"


def test_torchs_event_objects_recorded_to_otel_directly(otel):
    """torch's own Event/RdzvEvent objects given to the bridge's ``record`` are exported, not dropped."""
    before = selftelemetry.total(selftelemetry.DROPPED, "logs")
    events.record(tev_api.Event("t.ev", tev_api.EventSource.AGENT, metadata={"state": "TERMINATED"}), "otel")
    events.record(tev_api.RdzvEvent("t.rd", "run", "msg", "h", 1, tev_api.NodeState.FAILED), "otel")
    records = otel.log_records()
    assert [(r.event_name, r.body, r.severity_number.value) for r in records] == [
        ("t.ev", "t.ev", 13),
        ("t.rd", "msg", 17),
    ]
    assert records[1].attributes["torchelastic.node_state"] == "FAILED"
    assert selftelemetry.total(selftelemetry.DROPPED, "logs") == before


def test_otel_logging_handler_exports_non_event_messages(otel):
    logger = logging.getLogger("tests.plain-messages")
    handler = events.OtelLoggingHandler()
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("not json %s", "at all")
        logger.warning("[1, 2]")
    finally:
        logger.removeHandler(handler)
    records = otel.log_records()
    assert len(records) == 2
    assert records[0].event_name == "tests.plain-messages"
    assert records[0].attributes["torchelastic.message"] == "not json at all"
    assert records[0].attributes["torchelastic.level"] == "WARNING"


# ---- legacy torchelastic.events API ----------------------------------------------------------------------------


class Collecting(te_api.EventHandler):
    def __init__(self) -> None:
        self.events: list[te_api.Event] = []

    def record(self, event):
        self.events.append(event)


def test_legacy_event_constructors():
    e1 = te_api.Event(name="test_event", event_type="foo")
    assert (e1.name, e1.type, e1.event_type, e1.source, e1.timestamp, e1.metadata) == (
        "test_event", "foo", "foo", None, 0, {})  # fmt: skip
    e2 = te_api.Event("n", type="bar", metadata={"k": "v"}, timestamp=12)
    assert (e2.type, e2.metadata, e2.timestamp, e2.source) == ("bar", {"k": "v"}, 12, None)
    e3 = te_api.Event("n", "foo", {"k": 1}, 5)  # legacy positional: name, type, metadata, timestamp
    assert (e3.type, e3.metadata, e3.timestamp, e3.source) == ("foo", {"k": 1}, 5, None)
    e4 = te_api.Event("n", "foo", {"k": 1})
    assert (e4.type, e4.metadata, e4.timestamp) == ("foo", {"k": 1}, 0)
    e5 = te_api.Event("n", "foo")
    assert (e5.type, e5.metadata, e5.timestamp) == ("foo", {}, 0)
    e6 = te_api.Event("n")
    assert (e6.type, e6.source, e6.metadata) == ("torchelastic", None, {})
    e7 = te_api.Event("n", te_api.EventSource.AGENT)
    assert e7.type == "torchelastic" and e7.source is te_api.EventSource.AGENT
    # each event gets its own metadata dict
    assert te_api.Event("a").metadata is not te_api.Event("b").metadata


@pytest.mark.parametrize(
    "event",
    [
        te_api.Event(name="test_event", event_type="foo"),
        te_api.Event("n", type="bar", metadata={"k": "v", "x": None}, timestamp=12),
        te_api.Event("n", "foo", {"k": 1}, 5),
        te_api.Event("n"),
    ],
)
def test_legacy_event_serialize_and_round_trip(event):
    data = json.loads(event.serialize())
    assert data["source"] is None
    assert (data["name"], data["timestamp"], data["metadata"]) == (event.name, event.timestamp, event.metadata)
    if event._type is not None:
        assert data["type"] == event.type
    else:
        assert "type" not in data
    back = te_api.Event.deserialize(event.serialize())
    assert (back.name, back.type, back.source, back.timestamp, back.metadata) == (
        event.name, event.type, None, event.timestamp, event.metadata)  # fmt: skip
    assert back.serialize() == event.serialize()
    assert str(event) == event.serialize()


def test_torch_events_never_carry_a_type_key():
    ev = te_api.Event("n", te_api.EventSource.AGENT, type="ignored-for-json")
    assert "type" not in json.loads(ev.serialize())


@pytest.mark.usefixtures("clean_state")
def test_legacy_configure_default_and_typed_console_handler(capsys):
    default = Collecting()
    events.configure(default)  # event_type="" sets the handler for every other type
    events.configure(te_api.ConsoleEventHandler(), event_type="foo")
    foo = te_api.Event(name="test_event", event_type="foo")
    other = te_api.Event(name="other", event_type="bar")
    plain = te_api.Event("plain")
    events.record_event(foo)
    events.record_event(other)
    events.record_event(plain)
    assert capsys.readouterr().out == f"[foo]: {foo.serialize()}\n"
    assert default.events == [other, plain]
    assert [e.type for e in default.events] == ["bar", "torchelastic"]


@pytest.mark.usefixtures("clean_state")
def test_legacy_custom_handler_receives_only_its_type(capsys):
    class StdoutEventHandler(te_api.EventHandler):  # the seed docs' example, verbatim in spirit
        def record(self, event):
            print(f"[{event.event_type}]: event_name: {event.name}")

    mine, others = Collecting(), Collecting()
    events.configure(mine, event_type="mine")
    events.configure(others)
    events.configure(StdoutEventHandler(), event_type="stdout_events")
    events.record_event(te_api.Event("a", event_type="mine"))
    events.record_event(te_api.Event("b", event_type="yours"))
    events.record_event(te_api.Event("c", type="mine"))
    events.record_event(te_api.Event("d", event_type="stdout_events"))
    assert [e.name for e in mine.events] == ["a", "c"]
    assert [e.name for e in others.events] == ["b"]
    assert capsys.readouterr().out == "[stdout_events]: event_name: d\n"


@pytest.mark.usefixtures("clean_state")
def test_legacy_record_forms():
    console, foo, default = Collecting(), Collecting(), Collecting()
    events.configure(console, event_type="console")
    events.configure(foo, event_type="foo")
    events.configure(default)
    metadata = {"key": "value"}
    events.record(event_name="test", event_type="console", metadata=metadata)
    events.record("test2", "foo", {"a": 1})
    events.record("test3")
    events.record("test4", metadata={"b": 2})
    assert [(e.name, e.type, e.metadata, e.source) for e in console.events] == [("test", "console", metadata, None)]
    assert [(e.name, e.type, e.metadata) for e in foo.events] == [("test2", "foo", {"a": 1})]
    assert [(e.name, e.type, e.metadata) for e in default.events] == [
        ("test3", "torchelastic", {}),
        ("test4", "torchelastic", {"b": 2}),
    ]


@pytest.mark.usefixtures("clean_state")
def test_record_dispatches_on_first_argument(console_streams, capsys):
    ours_stream, _ = console_streams
    legacy = Collecting()
    events.configure(legacy, event_type="console")
    torch_form = te_api.Event("torch.form", te_api.EventSource.AGENT)
    events.record(torch_form, "console")  # Event -> torch path: the "console" destination
    events.record("legacy.form", "console")  # str -> legacy path: the handler of type "console"
    assert ours_stream.getvalue() == torch_form.serialize() + "\n"
    assert [e.name for e in legacy.events] == ["legacy.form"]
    assert capsys.readouterr().out == ""


@pytest.mark.usefixtures("clean_state")
def test_legacy_default_handler_is_null_and_failing_handlers_do_not_raise():
    assert isinstance(events._legacy_default[0], te_api.NullEventHandler)
    events.record_event(te_api.Event("nobody listens"))

    class Broken(te_api.EventHandler):
        def record(self, event):
            raise RuntimeError("handler bug")

    events.configure(Broken(), event_type="broken")
    before = selftelemetry.total(selftelemetry.DROPPED, "logs", "handler_error")
    events.record_event(te_api.Event("x", event_type="broken"))
    events.record("y", "broken")
    assert selftelemetry.total(selftelemetry.DROPPED, "logs", "handler_error") == before + 2


def test_event_handler_is_abstract():
    with pytest.raises(TypeError):
        te_api.EventHandler()  # type: ignore[abstract]


def test_legacy_otel_event_handler_exports_and_delegates(otel, capsys):
    handler = events.OtelEventHandler(delegate=te_api.ConsoleEventHandler())
    events.configure(handler, event_type="foo")
    ev = te_api.Event("legacy.ev", type="foo", metadata={"k": "v"})
    events.record_event(ev)
    assert capsys.readouterr().out == f"[foo]: {ev.serialize()}\n"
    (record,) = otel.log_records()
    assert record.event_name == "legacy.ev"
    assert record.attributes["torchelastic.event_type"] == "foo"
    assert record.attributes["torchelastic.k"] == "v"
    assert record.attributes["torchelastic.event.kind"] == "legacy"
    assert "torchelastic.source" not in record.attributes
