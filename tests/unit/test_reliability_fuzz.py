"""Bad input, fuzzed: whatever a job passes to the public API, nothing reaches the caller and nothing is lost silently.

Every generated input goes through the bridge's public API (``events.record`` in both signatures, the "otel"
logging handler, ``OtelLoggingHandler.export`` of rendezvous events, ``metrics.put_metric``) into in-memory SDK
pipelines. For each input the test asserts:

- no exception reaches the caller, except where torch's own API raises for the same call (an unknown or
  unhashable destination or metric group) -- then the same exception type as torch's;
- after a drain (what every flush does first), exported log records / metric points + counted drops == inputs
  (metric points are collected with DELTA temporality, so one accepted value is exactly one new point);
- every exported attribute value is a valid OpenTelemetry attribute value (str, bool, int64, float, or a
  homogeneous sequence of them), the SDK dropped no attribute, and every instrument name matches
  ``[a-zA-Z][-_./a-zA-Z0-9]{0,254}``.

The number of cases tried is printed (>= 10,000 in total) and the whole file runs in well under a minute; under
``make test-fast`` (the ``fast`` Hypothesis profile: see ``tests/conftest.py``) a tenth of them.
"""

from __future__ import annotations

import enum
import json
import logging
import math
import re
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider, UpDownCounter
from opentelemetry.sdk.metrics._internal.instrument import Gauge
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

import torchelastic_otel
from tests.conftest import examples
from tests.support.rel_common import report
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel import events, metrics
from torchelastic_otel._export import drainer
from torchelastic_otel.events import Event, EventSource, NodeState, RdzvEvent
from torchelastic_otel.events._otel import to_log_fields

torch_events = pytest.importorskip("torch.distributed.elastic.events")
import torch.distributed.elastic.metrics as torch_metrics  # noqa: E402

INSTRUMENT_NAME = re.compile(r"[a-zA-Z][-_./a-zA-Z0-9]{0,254}")
INT64 = (-(2**63), 2**63 - 1)
SELF_TELEMETRY = {"torchelastic_otel.dropped", "torchelastic_otel.sanitized", "torchelastic_otel.fallbacks"}
#: Drop reasons that do not drop a record: attribute_limit drops one attribute of a record that is exported;
#: not_serializable drops the copy for a non-OTel handler on the destination's logger (the record is exported).
NOT_RECORD_DROPS = {"attribute_limit", "not_serializable"}

EXAMPLES = {"event": examples(3000), "legacy": examples(1500), "logging": examples(1500), "rdzv": examples(1000),
            "metric": examples(3200)}  # fmt: skip
_settings = dict(deadline=None, suppress_health_check=list(HealthCheck), database=None)
_tried: dict[str, int] = dict.fromkeys(EXAMPLES, 0)
_KEEP_ALIVE: list[Any] = []  # self-telemetry registers per id(meter_provider): never let an id be reused


# ---- strategies ------------------------------------------------------------------------------------------------


class Color(enum.Enum):
    RED = "red"
    BIG = 2**70


class Unprintable:
    """A user object whose ``__str__``/``__repr__`` raise."""

    def __str__(self) -> str:
        raise RuntimeError("no str for you")

    __repr__ = __str__

    def __float__(self) -> float:
        raise RuntimeError("no float either")

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # how hypothesis prints a failing example
        printer.text("Unprintable()")


class StrSub(str):
    pass


def _deep(n: int) -> Any:
    value: Any = "bottom"
    for _ in range(n):
        value = [value]
    return value


def _cyclic(kind: str) -> Any:
    if kind == "dict":
        d: dict[str, Any] = {"a": 1}
        d["self"] = d
        return d
    if kind == "nested":
        outer: dict[str, Any] = {"inner": {}}
        outer["inner"]["back"] = outer
        return outer
    items: list[Any] = [1]
    items.append(items)
    return items


#: Made fresh for every case (and kept out of the strategies' reprs: some cannot be printed at all).
SPECIAL_VALUES = (
    lambda: float("nan"), lambda: float("inf"), lambda: -float("inf"), lambda: 2**63, lambda: -(2**63) - 1,
    lambda: 10**400, lambda: -(10**30), lambda: b"\xff\xfe raw", lambda: bytearray(b"ba"), lambda: memoryview(b"mv"),
    lambda: Color.RED, lambda: Color.BIG, lambda: Decimal("1.5"), lambda: Fraction(1, 3), lambda: 1 + 2j,
    lambda: StrSub("sub"), lambda: frozenset({1, 2}), lambda: {3, 4}, lambda: (1, 2.5), lambda: [True, 1],
    lambda: [None], lambda: [], lambda: [[1], [2]], lambda: ["a", 1], lambda: "x" * 20_000,
    lambda: "\x00\ud800 lone surrogate", Unprintable, lambda: [Unprintable()], lambda: {"u": Unprintable()},
    lambda: _deep(50), lambda: _deep(3000), lambda: _cyclic("dict"), lambda: _cyclic("nested"),
    lambda: _cyclic("list"), object, lambda: Ellipsis,
)  # fmt: skip
_special_values = st.integers(0, len(SPECIAL_VALUES) - 1).map(lambda i: SPECIAL_VALUES[i]())
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(),  # NaN and inf included
    st.text(max_size=30),
    st.binary(max_size=20),
)
_keys = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["", "service.name", "torchelastic.run_id", "resource.x", "raw_error", "metadata", "state"]),
    st.integers(),
    st.none(),
    st.booleans(),
    st.floats(),
    st.tuples(st.integers(), st.text(max_size=3)),
    st.binary(max_size=5),
    st.builds(Unprintable),
)


def _containers(children: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(
        st.lists(children, max_size=4), st.dictionaries(_keys, children, max_size=4), st.tuples(children, children)
    )


_values = st.recursive(st.one_of(_scalars, _special_values), _containers, max_leaves=12)
_metadata = st.one_of(
    st.dictionaries(_keys, _values, max_size=8),
    st.integers(90, 140).map(lambda n: {f"key{i}": i for i in range(n)}),  # around the attribute limit (96)
    st.builds(lambda: _cyclic("dict")),
    _scalars,
    st.lists(_scalars, max_size=3),
)
_names = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", "torchelastic.worker.status.FAILED", "a" * 10_000, "!!!...", "ünïcödé"]),
    st.none(),
    st.integers(),
    st.binary(max_size=10),
    st.builds(Unprintable),
)
_sources = st.one_of(
    st.sampled_from(list(EventSource)), st.sampled_from(["AGENT", "WORKER", "bogus"]), st.none(), st.integers(),
    st.lists(st.integers(), max_size=2),
)  # fmt: skip
_timestamps = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.none(),
    st.text(max_size=10),
    st.just([1]),
)
_destinations = st.one_of(
    st.sampled_from(["otel", "otel", "otel", "null", "dynamic_rendezvous", "nope", ""]),
    st.none(),
    st.integers(),
    st.just(["otel"]),  # unhashable
)
_types = st.one_of(st.text(max_size=15), st.none(), st.integers(), st.builds(Unprintable))

# Metric names, including ones the rule table maps to counters (*.count, *_total) and histograms (*.ms).
_metric_names = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["", "a" * 10_000, "!!!", "...", "ünïcödé", "1st", "x.ms", "x.count", "y_total", "f.success",
                     "workers.default.flakiness", "workers.r.run_success_no_retries", "F.duration.ms"]),
    st.builds(lambda s, suffix: s + suffix, st.text(max_size=12), st.sampled_from([".count", "_total", ".ms", ""])),
    st.none(),
    st.integers(),
    st.just(["unhashable"]),
)  # fmt: skip
_metric_values = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.booleans(),
    st.none(),
    st.sampled_from(
        [10**400, -(10**400), "1.5", "abc", "nan", "-3", Decimal("2.5"), Fraction(1, 4), 1j, [1], Color.RED]
    ),
    st.builds(Unprintable),
)
_groups = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["torchelastic", "", "x" * 5000]),
    st.none(),
    st.integers(),
    st.just(["unhashable"]),
)


# ---- the pipeline -------------------------------------------------------------------------------------------------


class FuzzPipeline:
    """In-memory providers (logs exported synchronously; metrics collected with DELTA temporality), rebuilt every
    few hundred cases so that collections stay fast however many instruments the fuzzed names created."""

    REBUILD_EVERY = 300

    def __init__(self) -> None:
        self.cases = 0
        self._build()

    def _build(self) -> None:
        delta = AggregationTemporality.DELTA
        self.logs = InMemoryLogRecordExporter()
        logger_provider = LoggerProvider()
        logger_provider.add_log_record_processor(SimpleLogRecordProcessor(self.logs))
        self.reader = InMemoryMetricReader(
            preferred_temporality={Counter: delta, UpDownCounter: delta, Histogram: delta, Gauge: delta}
        )
        meter_provider = MeterProvider(metric_readers=[self.reader])
        tracer_provider = TracerProvider()
        _KEEP_ALIVE.extend((logger_provider, meter_provider, tracer_provider))
        torchelastic_otel.setup(
            tracer_provider=tracer_provider, meter_provider=meter_provider, logger_provider=logger_provider
        )

    def next_case(self, metrics: bool = False) -> None:
        self.cases += 1
        if self.cases % self.REBUILD_EVERY == 0:
            self._build()
        self.drain()
        self.logs.clear()
        if metrics:
            self.reader.get_metrics_data()  # forget what earlier cases left (DELTA)

    @staticmethod
    def drain() -> None:
        drainer.drain_all()  # what every flush does first

    def new_log_records(self) -> list[Any]:
        self.drain()
        records = list(self.logs.get_finished_logs())
        self.logs.clear()
        return records

    def new_metric_points(self) -> list[tuple[str, dict, Any]]:
        self.drain()
        data = self.reader.get_metrics_data()
        found = []
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name in SELF_TELEMETRY:
                        continue
                    found.extend((metric.name, dict(p.attributes or {}), p) for p in metric.data.data_points)
        return found


@pytest.fixture(scope="module")
def fuzz() -> Any:
    """The bridge set up with in-memory providers and OTel handlers for every metric group and event type."""
    from torchelastic_otel import pipeline
    from torchelastic_otel.metrics import api as te_metrics_api

    # The destinations' loggers hold exactly their handler during the fuzz (other tests may have added some).
    destination_loggers = {
        d: logging.getLogger(f"torchelastic-otel-events-{d}") for d in ("otel", "null", "dynamic_rendezvous")
    }
    saved_loggers = {d: (list(lg.handlers), lg.propagate) for d, lg in destination_loggers.items()}
    for logger in destination_loggers.values():
        logger.handlers[:] = []
        logger.propagate = False
    # Only this test's drains move values (deterministic accounting).
    with events._state_restored(), te_metrics_api._state_restored(), drainer.paused():
        state = FuzzPipeline()
        handler = metrics.OtelMetricHandler()
        metrics.configure(handler)
        events.configure(events.OtelEventHandler())
        try:
            yield state
        finally:
            for d, (handlers, propagate) in saved_loggers.items():
                destination_loggers[d].handlers[:] = handlers
                destination_loggers[d].propagate = propagate
            pipeline._reset_for_tests()
    total = sum(_tried.values())
    report("fuzz: cases tried", [*sorted(_tried.items()), ("total", total)])
    if all(_tried.values()):  # the whole file ran
        assert total >= examples(10_000), _tried


# ---- checks -------------------------------------------------------------------------------------------------------


def valid_attribute_value(value: Any) -> bool:
    """An OTel attribute value: str/bool/int64/float, or a homogeneous sequence of one of those."""

    def scalar(v: Any) -> type | None:
        if isinstance(v, bool):
            return bool
        if isinstance(v, int):
            return int if INT64[0] <= v <= INT64[1] else None
        if isinstance(v, (float, str)):
            return type(v) if type(v) in (float, str) else None
        return None

    if isinstance(value, (list, tuple)):
        kinds = {scalar(v) for v in value}
        return None not in kinds and len(kinds) <= 1
    return scalar(value) is not None


def check_attributes(attributes: Any, where: str) -> None:
    for key, value in dict(attributes or {}).items():
        assert isinstance(key, str) and key, (where, key)
        assert valid_attribute_value(value), (where, key, type(value), value)
        if isinstance(value, str):
            assert len(value) <= 8192, (where, key, len(value))


def check_log_record(readable: Any) -> None:
    record = readable.log_record
    assert getattr(readable, "dropped_attributes", 0) == 0, "the SDK had to drop attributes"
    check_attributes(record.attributes, "log record")
    assert len(record.attributes or {}) <= 128
    assert isinstance(record.event_name, str) and record.event_name
    assert isinstance(record.body, str)
    assert record.timestamp is None or 0 < record.timestamp < 2**63


def drops(signal: str) -> int:
    return sum(
        v
        for (_kind, s, reason), v in selftelemetry.snapshot(selftelemetry.DROPPED).items()
        if s == signal and reason not in NOT_RECORD_DROPS
    )


def assert_accounted(fuzz: FuzzPipeline, before: int, expected: int) -> list[Any]:
    """``expected`` inputs: exported log records + counted drops == inputs; every record valid."""
    records = fuzz.new_log_records()
    counted = drops("logs") - before
    assert len(records) + counted == expected, (len(records), counted, expected)
    for readable in records:
        check_log_record(readable)
    return records


def same_error_as_torch(ours: BaseException | None, torch_call: Any) -> None:
    """An exception of ours is only allowed where torch's API raises the same exception type for the same call."""
    if ours is None:
        return
    try:
        torch_call()
    except Exception as theirs:
        assert type(ours) is type(theirs), (ours, theirs)
        return
    raise AssertionError(f"the bridge raised {ours!r} where torch does not")


# ---- events -----------------------------------------------------------------------------------------------------


def _make_event(name: Any, source: Any, timestamp: Any, metadata: Any) -> Any:
    # The constructor is public API too: it must accept what torch's dataclass accepts (anything).
    return Event(name, source, timestamp, metadata)


@settings(max_examples=EXAMPLES["event"], **_settings)
@given(name=_names, source=_sources, timestamp=_timestamps, metadata=_metadata, destination=_destinations)
def test_fuzz_record_event(
    fuzz: FuzzPipeline, name: Any, source: Any, timestamp: Any, metadata: Any, destination: Any
) -> None:
    _tried["event"] += 1
    fuzz.next_case()
    before = drops("logs")
    event = _make_event(name, source, timestamp, metadata)
    error = None
    try:
        events.record(event, destination)
    except Exception as exc:  # only allowed where torch raises too
        error = exc
    torch_event = torch_events.Event("fuzz", torch_events.EventSource.WORKER)
    same_error_as_torch(error, lambda: torch_events.record(torch_event, destination))
    exported = error is None and destination == "otel"
    records = assert_accounted(fuzz, before, 1 if exported else 0)
    # The mapping itself (also what a span event gets) is valid before the SDK sees it.
    try:
        fields = to_log_fields(event)
    except Exception:
        assert not records, "a record was exported although its conversion fails"
        return
    check_attributes(fields["attributes"], "to_log_fields")
    for key in fields["attributes"]:
        assert key.startswith(("torchelastic.", "exception.")), key  # metadata never poses as other attributes


@settings(max_examples=EXAMPLES["legacy"], **_settings)
@given(name=_names, event_type=_types, metadata=_metadata)
def test_fuzz_record_legacy(fuzz: FuzzPipeline, name: Any, event_type: Any, metadata: Any) -> None:
    _tried["legacy"] += 1
    fuzz.next_case()
    before = drops("logs")
    events.record(name, event_type, metadata)  # legacy signature: never raises
    assert_accounted(fuzz, before, 1)


def _json_containers(children: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(st.lists(children, max_size=3), st.dictionaries(st.text(max_size=8), children, max_size=4))


_json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)),
    _json_containers,
    max_leaves=10,
)
_json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20))
_event_like = st.fixed_dictionaries(
    {"name": _json_scalars, "source": st.sampled_from(["AGENT", "WORKER", "BAD", None]), "timestamp": _json_scalars},
    optional={"metadata": _json_values, "type": _json_scalars},
)
_rdzv_like = st.fixed_dictionaries(
    {"name": _json_scalars, "run_id": _json_scalars, "message": _json_scalars, "hostname": _json_scalars,
     "pid": _json_scalars, "node_state": st.sampled_from(["INIT", "FAILED", "nope", 3])},
    optional={"rank": _json_scalars, "error_trace": _json_scalars, "extra": _json_values},
)  # fmt: skip
_messages = st.one_of(
    st.text(max_size=60),
    st.builds(json.dumps, _json_values),
    st.builds(json.dumps, _event_like),
    st.builds(json.dumps, _rdzv_like),
    st.sampled_from(["{", "[]", "null", '{"name": null}', '{"node_state": "FAILED"}', "NaN"]),
)


@settings(max_examples=EXAMPLES["logging"], **_settings)
@given(message=_messages, level=st.sampled_from([logging.DEBUG, logging.INFO, logging.ERROR]), args=st.booleans())
def test_fuzz_otel_logging_handler(fuzz: FuzzPipeline, message: str, level: int, args: bool) -> None:
    """What torch's ``record(event, "otel")`` does once bridged: a JSON message logged to the "otel" handler."""
    _tried["logging"] += 1
    fuzz.next_case()
    before = drops("logs")
    handler = events.get_logging_handler("otel")
    # "%s" with no args is fine; with a mismatching args tuple getMessage() raises inside the handler
    record = logging.LogRecord("fuzz", level, __file__, 1, message, ("x",) if args else None, None)
    handler.handle(record)
    assert_accounted(fuzz, before, 1)


_rdzv_fields = st.one_of(_scalars, _special_values)


@settings(max_examples=EXAMPLES["rdzv"], **_settings)
@given(
    name=_names, run_id=_rdzv_fields, message=_rdzv_fields, hostname=_rdzv_fields, pid=_rdzv_fields,
    node_state=st.one_of(st.sampled_from(list(NodeState)), _scalars), rank=_rdzv_fields, error_trace=_rdzv_fields,
)  # fmt: skip
def test_fuzz_rendezvous_event(fuzz: FuzzPipeline, name: Any, run_id: Any, message: Any, hostname: Any, pid: Any,
                               node_state: Any, rank: Any, error_trace: Any) -> None:  # fmt: skip
    _tried["rdzv"] += 1
    fuzz.next_case()
    before = drops("logs")
    event = RdzvEvent(name, run_id, message, hostname, pid, node_state, rank=rank, error_trace=error_trace)
    events.get_logging_handler("otel").export(event)  # how the bridged agent exports rendezvous events
    assert_accounted(fuzz, before, 1)


# ---- metrics ----------------------------------------------------------------------------------------------------


@settings(max_examples=EXAMPLES["metric"], **_settings)
@given(name=_metric_names, value=_metric_values, group=_groups)
def test_fuzz_put_metric(fuzz: FuzzPipeline, name: Any, value: Any, group: Any) -> None:
    _tried["metric"] += 1
    fuzz.next_case(metrics=True)
    before = drops("metrics")
    error = None
    try:
        metrics.put_metric(name, value, group)
    except Exception as exc:
        error = exc
    same_error_as_torch(error, lambda: torch_metrics.put_metric(name, value, group))
    points = fuzz.new_metric_points()
    counted = drops("metrics") - before
    assert len(points) + counted == (0 if error else 1), (points, counted, error)
    for instrument, attributes, point in points:
        assert INSTRUMENT_NAME.fullmatch(instrument), instrument
        check_attributes(attributes, instrument)
        number = getattr(point, "value", getattr(point, "sum", None))
        assert isinstance(number, (int, float)) and math.isfinite(number), point
