"""Tests written the way torch's and legacy torchelastic's own API tests are written work after a prefix change.

torch's ``test/distributed/elastic/metrics/api_test.py`` captures ``@prof`` values by patching
``metrics.api.getStream``; its ``events/lib_test.py`` patches ``events.get_logging_handler`` and
``events.record_rdzv_event``; legacy torchelastic 0.2.0 code imports ``configure``, ``record`` and ``record_event``
from ``torchelastic.events.api``. Each test here runs against torch's module and against the bridge's (the module
path is the only difference), so a behaviour that differs from torch's fails. ``unittest.mock.patch`` is the
boundary these tests are about: it is what the user's own tests do.
"""

from __future__ import annotations

import importlib
import logging
from unittest import mock

import pytest

PREFIXES = ["torch.distributed.elastic", "torchelastic_otel"]


class RecordingHandler:
    """A metric handler in torch's test style: keeps the last value of each name."""

    def __init__(self) -> None:
        self.metric_data: dict = {}

    def emit(self, metric_data) -> None:  # type: ignore[no-untyped-def]
        self.metric_data[metric_data.name] = metric_data


def _metrics_api(prefix: str):  # type: ignore[no-untyped-def]
    if prefix.startswith("torch."):
        pytest.importorskip("torch")
    return importlib.import_module(f"{prefix}.metrics.api")


def _trainer_class(api):  # type: ignore[no-untyped-def]
    """A class whose methods are ``@prof``-decorated by ``api`` (named ``Trainer.*`` as at a module's top level)."""

    class Trainer:
        @api.prof
        def step(self) -> None:
            pass

        @api.prof(group="torchelastic")
        def fail(self) -> None:
            raise RuntimeError("boom")

    Trainer.__qualname__ = "Trainer"
    Trainer.step.__wrapped__.__qualname__ = "Trainer.step"  # type: ignore[attr-defined]
    Trainer.fail.__wrapped__.__qualname__ = "Trainer.fail"  # type: ignore[attr-defined]
    return Trainer


@pytest.mark.parametrize("prefix", PREFIXES)
def test_prof_values_reach_a_patched_get_stream(prefix: str) -> None:
    api = _metrics_api(prefix)

    Trainer = _trainer_class(api)
    handler = RecordingHandler()
    stream = api.MetricStream("torchelastic", handler)
    with mock.patch(f"{prefix}.metrics.api.getStream", return_value=stream) as get_stream:
        Trainer().step()
        with pytest.raises(RuntimeError):
            Trainer().fail()
    assert handler.metric_data["Trainer.step.success"].value == 1
    assert "Trainer.step.duration.ms" in handler.metric_data
    assert "Trainer.step.failure" not in handler.metric_data
    assert handler.metric_data["Trainer.fail.failure"].value == 1
    assert handler.metric_data["Trainer.fail.duration.ms"].group_name == "torchelastic"
    assert get_stream.call_count == 4  # success + duration, failure + duration: once a value, as torch calls it


@pytest.mark.parametrize("prefix", PREFIXES)
def test_put_metric_goes_through_a_wrapped_get_stream_and_add_value(prefix: str) -> None:
    """A user's wrapper (not a mock) around getStream, then around MetricStream.add_value, sees every put_metric;
    once both are restored, the configured handler gets values directly again."""
    api = _metrics_api(prefix)
    handler = RecordingHandler()
    api.configure(handler, "wrapped-group")
    seen: list[tuple[str, str]] = []
    original = api.getStream

    def wrapper(group: str):  # type: ignore[no-untyped-def]
        seen.append(("getStream", group))
        return original(group)

    try:
        with mock.patch.object(api, "getStream", wrapper):
            api.put_metric("a", 1, "wrapped-group")
        original_add = api.MetricStream.add_value

        def add_value(self, name: str, value: int) -> None:  # type: ignore[no-untyped-def]
            seen.append(("add_value", name))
            original_add(self, name, value * 10)

        with mock.patch.object(api.MetricStream, "add_value", add_value):
            api.put_metric("b", 2, "wrapped-group")
        api.put_metric("c", 3, "wrapped-group")
    finally:
        api.configure(api.NullMetricHandler(), "wrapped-group")
    assert seen == [("getStream", "wrapped-group"), ("add_value", "b")]
    assert {name: data.value for name, data in handler.metric_data.items()} == {"a": 1, "b": 20, "c": 3}


def test_a_raising_get_stream_patch_is_counted_not_raised() -> None:
    """The bridge's promise on top of torch's: telemetry never raises into the job."""
    from torchelastic_otel import _selftelemetry as selftelemetry
    from torchelastic_otel.metrics import api

    before = selftelemetry.total(selftelemetry.DROPPED, reason="handler_error")
    with mock.patch.object(api, "getStream", side_effect=RuntimeError("broken wrapper")):
        api.put_metric("x", 1)
    assert selftelemetry.total(selftelemetry.DROPPED, reason="handler_error") == before + 1


def _events(prefix: str):  # type: ignore[no-untyped-def]
    if prefix.startswith("torch."):
        pytest.importorskip("torch")
    return importlib.import_module(f"{prefix}.events")


@pytest.mark.parametrize("prefix", PREFIXES)
def test_get_or_create_logger_uses_a_patched_get_logging_handler(prefix: str) -> None:
    events = _events(prefix)
    destination = f"test_destination_{prefix.replace('.', '_')}"
    with mock.patch(f"{prefix}.events.get_logging_handler") as get_handler:
        get_handler.return_value = logging.NullHandler()
        logger = events._get_or_create_logger(destination)
    assert len(logger.handlers) == 1
    assert isinstance(logger.handlers[0], logging.NullHandler)


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("handler, recorded", [(logging.StreamHandler(), True), (logging.NullHandler(), False)])
def test_construct_and_record_rdzv_event_uses_patched_functions(
    prefix: str, handler: logging.Handler, recorded: bool
) -> None:
    events = _events(prefix)
    with (
        mock.patch(f"{prefix}.events.record_rdzv_event") as record_mock,
        mock.patch(f"{prefix}.events.get_logging_handler", return_value=handler),
    ):
        events.construct_and_record_rdzv_event(
            run_id="test_run_id", message="test_message", node_state=events.NodeState.RUNNING
        )
    assert record_mock.call_count == (1 if recorded else 0)
    if recorded:
        event = record_mock.call_args.args[0]
        assert (event.run_id, event.message, event.node_state) == ("test_run_id", "test_message", "RUNNING")


def test_legacy_events_api_names_import_and_work(capsys: pytest.CaptureFixture[str]) -> None:
    """Legacy torchelastic 0.2.0 defined configure/record/record_event in ``torchelastic/events/api.py``."""
    from torchelastic_otel import events
    from torchelastic_otel.events.api import ConsoleEventHandler, Event, EventHandler, configure, record, record_event

    assert (configure, record, record_event) == (events.configure, events.record, events.record_event)
    got: list[str] = []

    class Collecting(EventHandler):
        def record(self, event) -> None:  # type: ignore[no-untyped-def]
            got.append(event.name)

    try:
        configure(Collecting(), event_type="legacy_api_type")
        configure(ConsoleEventHandler(), event_type="legacy_console")
        record_event(Event(name="test_event", type="legacy_api_type"))
        record(event_name="by_name", event_type="legacy_api_type", metadata={"key": "value"})
        record("positional", "legacy_console", {"k": 1})
    finally:
        events._legacy_handlers.pop("legacy_api_type", None)
        events._legacy_handlers.pop("legacy_console", None)
    assert got == ["test_event", "by_name"]
    assert '"name": "positional"' in capsys.readouterr().out


def test_legacy_events_api_star_import() -> None:
    namespace: dict = {}
    exec("from torchelastic_otel.events.api import *", namespace)
    assert {"configure", "record", "record_event", "Event", "EventHandler"} <= set(namespace)
