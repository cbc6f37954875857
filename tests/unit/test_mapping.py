"""How torchelastic's metrics and events become OpenTelemetry data.

- metrics: the rule table for every metric torch 2.13's agent emits (see /work/shared/TORCH_TELEMETRY.md) and for
  user names; instrument names always valid; end to end through ``OtelMetricHandler`` into an in-memory reader;
- events: log record fields (name, body, severity, timestamp, exception, attributes) and span events, for torch's
  real agent event shape, rendezvous events and legacy events.
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
import time
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.metrics._internal.instrument import Instrument

import torchelastic_otel
from tests.conftest import examples
from tests.support.otel import KEEP_ALIVE, metric_of, points_of
from tests.support.releases import torch_events_have_exit_code
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel import events, metrics
from torchelastic_otel.events import _otel as events_otel
from torchelastic_otel.events.api import Event, EventSource, NodeState, RdzvEvent
from torchelastic_otel.metrics.rules import (
    DEFAULT_RULES,
    DURATION_BUCKETS_S,
    MetricRule,
    resolve,
    valid_instrument_name,
)

NAME_RE = re.compile(r"[a-zA-Z][-_./a-zA-Z0-9]{0,254}")
TELEMETRY_MD = "/work/shared/TORCH_TELEMETRY.md"

# ---- the metric rule table -------------------------------------------------------------------------------------

# Every (group, name) torch 2.13's elastic agent emitted in the observed runs (TORCH_TELEMETRY.md's metrics block).
TORCH_METRICS = [
    "LocalElasticAgent._monitor_workers.duration.ms",
    "LocalElasticAgent._monitor_workers.success",
    "LocalElasticAgent._start_workers.duration.ms",
    "LocalElasticAgent._start_workers.success",
    "LocalElasticAgent._stop_workers.duration.ms",
    "LocalElasticAgent._stop_workers.success",
    "SimpleElasticAgent._assign_worker_ranks.duration.ms",
    "SimpleElasticAgent._assign_worker_ranks.success",
    "SimpleElasticAgent._initialize_workers.duration.ms",
    "SimpleElasticAgent._initialize_workers.failure",
    "SimpleElasticAgent._initialize_workers.success",
    "SimpleElasticAgent._rendezvous.duration.ms",
    "SimpleElasticAgent._rendezvous.failure",
    "SimpleElasticAgent._rendezvous.success",
    "SimpleElasticAgent._restart_workers.duration.ms",
    "SimpleElasticAgent._restart_workers.success",
    "SimpleElasticAgent.run.duration.ms",
    "SimpleElasticAgent.run.failure",
    "SimpleElasticAgent.run.success",
    "workers.default.failed",
    "workers.default.flakiness",
    "workers.default.healthy",
    "workers.default.remaining_restarts",
    "workers.default.run_failed_no_retries",
    "workers.default.run_failed_with_retries",
    "workers.default.run_success_no_retries",
    "workers.default.run_success_with_retries",
    "workers.default.run_total",
    "workers.default.succeeded",
]

_G = {"metric_group": "torchelastic"}
# name -> (instrument, kind, unit, scale, attributes) for the workers.<role>.* metrics
WORKER_EXPECTED = {
    "workers.default.remaining_restarts": ("torchelastic.workers.remaining_restarts", "gauge", "{restart}", 1.0,
                                           {**_G, "role": "default"}),
    "workers.default.flakiness": ("torchelastic.workers.flakiness", "gauge", "%", 1.0, {**_G, "role": "default"}),
    "workers.default.run_total": ("torchelastic.workers.runs", "counter", "{run}", 1.0, {**_G, "role": "default"}),
}  # fmt: skip
for _state in ("healthy", "failed", "succeeded", "unhealthy", "init", "stopped", "unknown"):
    WORKER_EXPECTED[f"workers.default.{_state}"] = (
        "torchelastic.workers.state.observations", "counter", "{observation}", 1.0,
        {**_G, "role": "default", "state": _state})  # fmt: skip
for _outcome in ("success_with_retries", "success_no_retries", "failed_with_retries", "failed_no_retries"):
    WORKER_EXPECTED[f"workers.default.run_{_outcome}"] = (
        "torchelastic.workers.run_outcomes",
        "counter",
        "{run}",
        1.0,
        {**_G, "role": "default", "outcome": _outcome},
    )


def _expected(name: str) -> tuple:
    if name in WORKER_EXPECTED:
        return WORKER_EXPECTED[name]
    if name.endswith(".duration.ms"):
        function = name[: -len(".duration.ms")]
        return ("torchelastic.function.duration", "histogram", "s", 0.001, {**_G, "function": function})
    function, _, outcome = name.rpartition(".")
    assert outcome in ("success", "failure"), name
    return ("torchelastic.function.calls", "counter", "{call}", 1.0, {**_G, "function": function, "outcome": outcome})


def _resolved(group: str, name: str, rules=DEFAULT_RULES) -> tuple:
    b = resolve(rules, group, name)
    return (b.instrument, b.kind, b.unit, b.scale, b.attributes)


@pytest.mark.parametrize("name", TORCH_METRICS + sorted(set(WORKER_EXPECTED) - set(TORCH_METRICS)))
def test_every_torch_metric_resolves_as_documented(name):
    assert _resolved("torchelastic", name) == _expected(name)


def test_spot_checks_from_the_design():
    assert _resolved("torchelastic", "workers.default.remaining_restarts")[:2] == (
        "torchelastic.workers.remaining_restarts", "gauge")  # fmt: skip
    assert _resolved("torchelastic", "SimpleElasticAgent._rendezvous.duration.ms") == (
        "torchelastic.function.duration", "histogram", "s", 0.001,
        {"metric_group": "torchelastic", "function": "SimpleElasticAgent._rendezvous"})  # fmt: skip
    assert _resolved("torchelastic", "workers.trainer.healthy")[4] == {**_G, "role": "trainer", "state": "healthy"}
    # an unknown per-role metric keeps its name in the instrument and the role as an attribute
    assert _resolved("torchelastic", "workers.default.something_new") == (
        "torchelastic.workers.something_new", "gauge", "", 1.0, {**_G, "role": "default"})  # fmt: skip


def test_copied_names_cover_the_observed_telemetry_file():
    if not os.path.exists(TELEMETRY_MD):
        pytest.skip("TORCH_TELEMETRY.md not available")
    text = open(TELEMETRY_MD, encoding="utf-8").read()
    block = text.split("## Metrics", 1)[1].split("```", 2)[1]
    rows = [line.split("|") for line in block.splitlines() if line.count("|") >= 3]
    observed = [(group.strip(), name.strip()) for group, name, *_ in rows]
    assert len(observed) >= 20
    assert {g for g, _ in observed} == {"torchelastic"}
    assert sorted(n for _, n in observed) == sorted(TORCH_METRICS)


@pytest.mark.parametrize(
    ("group", "name", "expected"),
    [
        ("my_app", "loss", ("loss", "gauge", "", 1.0, {"metric_group": "my_app"})),
        ("torchelastic", "checkpoint.write_latency_ms",
         ("checkpoint.write_latency", "histogram", "s", 0.001, _G)),
        ("my_app", "step-millis", ("step", "histogram", "s", 0.001, {"metric_group": "my_app"})),
        ("my_app", "latency.ms", ("latency", "histogram", "s", 0.001, {"metric_group": "my_app"})),
        ("my_app", "num_items", ("num_items", "gauge", "", 1.0, {"metric_group": "my_app"})),
        ("my_app", "items", ("items", "gauge", "", 1.0, {"metric_group": "my_app"})),
        ("my_app", "forms", ("forms", "gauge", "", 1.0, {"metric_group": "my_app"})),
        ("my_app", "tokens_total", ("tokens_total", "counter", "", 1.0, {"metric_group": "my_app"})),
        ("my_app", "steps.count", ("steps.count", "counter", "", 1.0, {"metric_group": "my_app"})),
        ("my_app", "calculate_latency", ("calculate_latency", "gauge", "", 1.0, {"metric_group": "my_app"})),
        ("my_app", "my metric (v2)", ("my_metric_v2", "gauge", "", 1.0, {"metric_group": "my_app"})),
        ("my_app", "test_fn.<locals>.inner.duration.ms",
         ("torchelastic.function.duration", "histogram", "s", 0.001,
          {"metric_group": "my_app", "function": "test_fn.<locals>.inner"})),
    ],
)  # fmt: skip
def test_user_names_resolve(group, name, expected):
    assert _resolved(group, name) == expected


def test_user_rule_in_front_wins_and_group_restricted_rules():
    rules = [
        MetricRule(r"(?P<name>.+)\.bytes", "{name}", "counter", unit="By"),
        MetricRule(r"workers\.(?P<role>[^.]+)\.healthy", "my.healthy", "gauge", attributes=("role",)),
        MetricRule(r"(?P<name>.+)", "app.{name}", "updown_counter", group="my_app"),
        *DEFAULT_RULES,
    ]
    assert _resolved("torchelastic", "net.bytes", rules) == ("net", "counter", "By", 1.0, _G)
    assert _resolved("torchelastic", "workers.default.healthy", rules) == (
        "my.healthy", "gauge", "", 1.0, {**_G, "role": "default"})  # fmt: skip
    assert _resolved("my_app", "queue", rules) == ("app.queue", "updown_counter", "", 1.0, {"metric_group": "my_app"})
    assert _resolved("other", "queue", rules) == ("queue", "gauge", "", 1.0, {"metric_group": "other"})
    # without the user's rules the defaults apply
    assert _resolved("torchelastic", "workers.default.healthy")[0] == "torchelastic.workers.state.observations"


def test_rule_template_errors_and_unmatched_names_still_give_valid_instruments():
    rules = [MetricRule(r"only-this", "{missing}", "counter")]
    assert _resolved("g", "only-this", rules)[:2] == ("missing", "counter")
    assert _resolved("g", "anything else", rules) == ("anything_else", "gauge", "", 1.0, {"metric_group": "g"})
    assert _resolved("g", "", rules)[0] == "unnamed"


def test_default_rules_instruments_and_units_are_valid_for_the_sdk():
    for rule in DEFAULT_RULES:
        checked = Instrument._check_name_unit_description("x", rule.unit, rule.description)
        assert checked["unit"] == rule.unit, rule
    for name in TORCH_METRICS:
        assert Instrument._check_name_unit_description(_resolved("torchelastic", name)[0], "", "")["name"]


_NAME_EXAMPLES = [
    "", " ", "_", "__", "-", ".", "/", "1", "123abc", "loss", "a" * 255, "a" * 256, "x" * 10_000, "é", "ünïcødé",
    "😀", "ａｂｃ", "!!!", "<locals>", "@#$%^&*()", "_a", "-a", "/a", ".a", "a b", "9" * 300, "\x00\n\t",
    "名前", "Ω.metric",
]  # fmt: skip


@pytest.mark.parametrize("name", _NAME_EXAMPLES)
def test_valid_instrument_name_examples(name):
    result = valid_instrument_name(name)
    assert NAME_RE.fullmatch(result), result
    assert valid_instrument_name(name) == result
    if NAME_RE.fullmatch(name):
        assert result == name  # valid names are kept as they are


@settings(max_examples=examples(400), deadline=None)
@given(st.one_of(st.text(), st.text(max_size=10_000), st.text(alphabet=st.characters(categories=["P", "S", "Z"]))))
def test_valid_instrument_name_property(name):
    result = valid_instrument_name(name)
    assert NAME_RE.fullmatch(result)
    assert Instrument._check_name_unit_description(result, "", "")["name"] == result
    assert valid_instrument_name(name) == result  # deterministic
    assert valid_instrument_name(result) == result  # idempotent


# ---- metrics end to end ----------------------------------------------------------------------------------------


@pytest.fixture
def handler(otel, paused_drainer):
    h = metrics.OtelMetricHandler()
    metrics.configure(h)
    return h


def _point(data, name: str, **attributes):
    matching = [p for attrs, p in points_of(data, name) if attrs == attributes]
    assert len(matching) == 1, (name, attributes, points_of(data, name))
    return matching[0]


def test_torch_metrics_end_to_end_after_flush(otel, handler):
    put = metrics.put_metric
    put("SimpleElasticAgent._rendezvous.duration.ms", 1500)
    put("SimpleElasticAgent._rendezvous.duration.ms", 250)
    put("SimpleElasticAgent._rendezvous.success", 1)
    put("SimpleElasticAgent._rendezvous.success", 1)
    put("SimpleElasticAgent._rendezvous.failure", 1)
    for _ in range(3):
        put("workers.default.healthy", 1)
    put("workers.default.remaining_restarts", 3)
    put("workers.default.remaining_restarts", 1)
    put("workers.default.run_total", 1)
    put("workers.default.run_success_with_retries", 1)
    put("workers.default.run_failed_no_retries", 0)
    put("workers.default.flakiness", 50)

    assert len(handler._pending) > 0
    assert torchelastic_otel.flush() is True
    assert len(handler._pending) == 0  # the flush drained the buffer into the SDK
    data = otel.reader.get_metrics_data()

    fn = {"metric_group": "torchelastic", "function": "SimpleElasticAgent._rendezvous"}
    hist = _point(data, "torchelastic.function.duration", **fn)
    assert hist.count == 2 and math.isclose(hist.sum, 1.75) and math.isclose(hist.max, 1.5)
    assert tuple(hist.explicit_bounds) == DURATION_BUCKETS_S
    assert metric_of(data, "torchelastic.function.duration").unit == "s"
    assert _point(data, "torchelastic.function.calls", **fn, outcome="success").value == 2
    assert _point(data, "torchelastic.function.calls", **fn, outcome="failure").value == 1
    role = {"metric_group": "torchelastic", "role": "default"}
    assert _point(data, "torchelastic.workers.state.observations", **role, state="healthy").value == 3
    assert _point(data, "torchelastic.workers.remaining_restarts", **role).value == 1
    assert _point(data, "torchelastic.workers.runs", **role).value == 1
    assert _point(data, "torchelastic.workers.run_outcomes", **role, outcome="success_with_retries").value == 1
    assert _point(data, "torchelastic.workers.run_outcomes", **role, outcome="failed_no_retries").value == 0
    assert _point(data, "torchelastic.workers.flakiness", **role).value == 50
    assert metric_of(data, "torchelastic.workers.flakiness").unit == "%"
    assert metric_of(data, "torchelastic.workers.state.observations").data.is_monotonic


def test_collection_alone_drains_the_buffer(otel, handler):
    """No flush: a metric collection (a scrape, a periodic export) sees every value put before it."""
    metrics.put_metric("checkpoint.write_latency_ms", 1500, "my_app")
    metrics.put_metric("loss", 0.5, "my_app")
    metrics.put_metric("loss", 0.25, "my_app")
    metrics.put_metric("tokens_total", 10, "my_app")
    metrics.put_metric("tokens_total", 5, "my_app")
    metrics.put_metric("num_items", 1500, "my_app")
    data = otel.reader.get_metrics_data()
    app = {"metric_group": "my_app"}
    latency = _point(data, "checkpoint.write_latency", **app)
    assert latency.count == 1 and math.isclose(latency.sum, 1.5)
    assert metric_of(data, "checkpoint.write_latency").unit == "s"
    assert _point(data, "loss", **app).value == 0.25
    assert _point(data, "tokens_total", **app).value == 15
    assert _point(data, "num_items", **app).value == 1500  # not milliseconds
    assert len(handler._pending) == 0


def test_collection_drains_a_handler_created_before_setup(otel, paused_drainer):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    early = metrics.OtelMetricHandler()  # bound to the fixture's pipeline
    metrics.configure(early, "early")
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    KEEP_ALIVE.append(provider)
    torchelastic_otel.setup(otel.tracer_provider, provider, otel.logger_provider)
    metrics.put_metric("loss", 0.5, "early")
    assert _point(reader.get_metrics_data(), "loss", metric_group="early").value == 0.5


def test_invalid_values_are_dropped_and_counted(otel, handler):
    before = {r: selftelemetry.total("dropped", "metrics", r) for r in ("negative_value", "non_numeric_value")}
    put = metrics.put_metric
    put("tokens_total", 4)
    put("tokens_total", -1)  # a counter cannot go down
    put("x.duration.ms", -5)  # nor a histogram
    put("loss", -2.5)  # a gauge can
    put("tokens_total", float("nan"))
    put("loss", float("nan"))
    put("loss", float("inf"))
    put("tokens_total", None)
    put("tokens_total", "many")
    put("tokens_total", "6")  # a numeric string is a number
    put("flags_total", True)  # bool -> int
    put("enabled", True)
    data = otel.reader.get_metrics_data()
    assert _point(data, "tokens_total", **_G).value == 10
    assert _point(data, "loss", **_G).value == -2.5
    assert points_of(data, "torchelastic.function.duration") == []
    flags, enabled = _point(data, "flags_total", **_G).value, _point(data, "enabled", **_G).value
    assert (flags, enabled) == (1, 1) and type(flags) is int and type(enabled) is int

    negative = selftelemetry.total("dropped", "metrics", "negative_value")
    non_numeric = selftelemetry.total("dropped", "metrics", "non_numeric_value")
    assert negative - before["negative_value"] == 2
    assert non_numeric - before["non_numeric_value"] == 5
    exported = {(a["signal"], a["reason"]): p.value for a, p in points_of(data, "torchelastic_otel.dropped")}
    assert exported[("metrics", "negative_value")] == negative
    assert exported[("metrics", "non_numeric_value")] == non_numeric


def test_buffer_bound_drops_and_counts_the_overflow(otel, paused_drainer):
    bounded = metrics.OtelMetricHandler(max_pending=10)
    metrics.configure(bounded, group="bounded")
    before = selftelemetry.total("dropped", "metrics", "buffer_full")
    for _ in range(25):
        metrics.put_metric("events_total", 1, "bounded")
    assert len(bounded._pending) == 10
    torchelastic_otel.flush()
    data = otel.reader.get_metrics_data()
    assert _point(data, "events_total", metric_group="bounded").value == 10
    assert selftelemetry.total("dropped", "metrics", "buffer_full") - before == 15
    exported = {(a["signal"], a["reason"]): p.value for a, p in points_of(data, "torchelastic_otel.dropped")}
    assert exported[("metrics", "buffer_full")] == selftelemetry.total("dropped", "metrics", "buffer_full")
    # the buffer takes values again once drained
    metrics.put_metric("events_total", 1, "bounded")
    assert _point(otel.reader.get_metrics_data(), "events_total", metric_group="bounded").value == 11


def test_delegate_receives_every_value(otel, paused_drainer):
    seen = []

    class Delegate(metrics.MetricHandler):
        def emit(self, metric_data):
            seen.append(metric_data)

    h = metrics.OtelMetricHandler(delegate=Delegate(), max_pending=2)
    metrics.configure(h, "g")
    metrics.put_metric("a_total", 1, "g")
    metrics.put_metric("a_total", 2, "g")
    metrics.put_metric("a_total", 3, "g")  # beyond the buffer: dropped for OTel, still delegated
    assert [(d.group_name, d.name, d.value) for d in seen] == [("g", "a_total", 1), ("g", "a_total", 2),
                                                               ("g", "a_total", 3)]  # fmt: skip
    assert _point(otel.reader.get_metrics_data(), "a_total", metric_group="g").value == 3


def test_prof_end_to_end(otel, handler):
    @metrics.prof(group="my_app")
    def step():
        return 1

    @metrics.prof(group="my_app")
    def broken():
        raise RuntimeError("x")

    step()
    step()
    with pytest.raises(RuntimeError):
        broken()
    data = otel.reader.get_metrics_data()
    prefix = "test_prof_end_to_end.<locals>."
    calls = {(a["function"], a["outcome"]): p.value for a, p in points_of(data, "torchelastic.function.calls")}
    assert calls == {(prefix + "step", "success"): 2, (prefix + "broken", "failure"): 1}
    durations = {a["function"]: p.count for a, p in points_of(data, "torchelastic.function.duration")}
    assert durations == {prefix + "step": 2, prefix + "broken": 1}


def test_explicit_meter_provider_handler(clean_state, paused_drainer):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    KEEP_ALIVE.append(provider)
    metrics.configure(metrics.OtelMetricHandler(meter_provider=provider), "own")
    metrics.put_metric("SimpleElasticAgent.run.duration.ms", 2000, "own")
    point = _point(reader.get_metrics_data(), "torchelastic.function.duration",
                   metric_group="own", function="SimpleElasticAgent.run")  # fmt: skip
    assert math.isclose(point.sum, 2.0)


# ---- events: log record fields ---------------------------------------------------------------------------------

INFO, WARN, ERROR = 9, 13, 17


@pytest.mark.parametrize(
    ("event", "severity"),
    [
        (Event("x", EventSource.AGENT, metadata={"state": "FAILED"}), (ERROR, "ERROR")),
        (Event("x", EventSource.AGENT, metadata={"state": "failed"}), (ERROR, "ERROR")),
        (Event("x", EventSource.WORKER, metadata={"state": "TERMINATED"}), (WARN, "WARN")),
        (Event("x", EventSource.WORKER, metadata={"state": "UNHEALTHY"}), (WARN, "WARN")),
        (Event("x", EventSource.WORKER, metadata={"state": "SUCCEEDED"}), (INFO, "INFO")),
        (Event("x", EventSource.WORKER, metadata={"state": None}), (INFO, "INFO")),
        (Event("torchelastic.worker.status.FAILED", EventSource.AGENT), (ERROR, "ERROR")),
        (Event("torchelastic.worker.status.TERMINATED", EventSource.WORKER), (WARN, "WARN")),
        (Event("torchelastic.worker.status.UNHEALTHY", EventSource.WORKER), (WARN, "WARN")),
        (Event("torchelastic.worker.status.START", EventSource.WORKER), (INFO, "INFO")),
        (Event("torchelastic.worker.status.RENDEZVOUS", EventSource.AGENT), (INFO, "INFO")),
        (RdzvEvent("n", "r", "m", "h", 1, NodeState.FAILED), (ERROR, "ERROR")),
        (RdzvEvent("n", "r", "m", "h", 1, NodeState.RUNNING), (INFO, "INFO")),
        (RdzvEvent("n", "r", "m", "h", 1, NodeState.INIT), (INFO, "INFO")),
        (RdzvEvent("n", "r", "m", "h", 1, NodeState.SUCCEEDED), (INFO, "INFO")),
        (Event("legacy", type="foo", metadata={"state": "FAILED"}), (ERROR, "ERROR")),
        (Event("legacy", type="foo"), (INFO, "INFO")),
    ],
)
def test_severity(event, severity):
    fields = events_otel.to_log_fields(event)
    assert (fields["severity_number"].value, fields["severity_text"]) == severity


def test_name_and_body():
    ev = events_otel.to_log_fields(Event("my.event", EventSource.AGENT))
    assert (ev["event_name"], ev["body"]) == ("my.event", "my.event")
    rd = events_otel.to_log_fields(RdzvEvent("dynamic_rendezvous.py:run", "r", "joined round 3", "h", 1,
                                             NodeState.RUNNING))  # fmt: skip
    assert (rd["event_name"], rd["body"]) == ("dynamic_rendezvous.py:run", "joined round 3")
    unnamed = events_otel.to_log_fields(Event("", EventSource.AGENT))
    assert unnamed["event_name"] == "torchelastic.event" and unnamed["body"] == ""


def test_timestamp_is_the_events_or_now():
    fixed = events_otel.to_log_fields(Event("x", EventSource.AGENT, timestamp=1_700_000_000_123))
    assert fixed["timestamp"] == 1_700_000_000_123_000_000
    start = time.time_ns()
    zero = events_otel.to_log_fields(Event("x", EventSource.AGENT))  # torch's agent always sends 0
    rdzv = events_otel.to_log_fields(RdzvEvent("n", "r", "m", "h", 1, NodeState.INIT))
    end = time.time_ns()
    assert start <= zero["timestamp"] <= end and start <= rdzv["timestamp"] <= end
    assert start <= zero["observed_timestamp"] <= end


TORCH_ERROR_FILE = json.dumps(
    {
        "message": {
            "message": "ValueError: boom",
            "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  ...\nValueError: boom\n",
                          "timestamp": "123"},
        }
    }
)  # fmt: skip


def test_raw_error_in_torchs_error_file_format():
    attrs = events_otel.to_log_fields(Event("x", EventSource.WORKER, metadata={"raw_error": TORCH_ERROR_FILE}))[
        "attributes"
    ]
    assert attrs["exception.type"] == "ValueError"
    assert attrs["exception.message"] == "boom"
    assert attrs["exception.stacktrace"] == "Traceback (most recent call last):\n  ...\nValueError: boom\n"
    assert "torchelastic.raw_error" not in attrs


def test_raw_error_as_a_plain_traceback():
    try:
        raise KeyError("missing")
    except KeyError:
        import traceback

        trace = traceback.format_exc()
    attrs = events_otel.to_log_fields(Event("x", EventSource.AGENT, metadata={"raw_error": trace}))["attributes"]
    assert attrs["exception.type"] == "KeyError"
    assert attrs["exception.message"] == "'missing'"
    assert attrs["exception.stacktrace"] == trace


@pytest.mark.parametrize("raw_error", [None, "", "{}"])
def test_no_error_gives_no_exception_attributes(raw_error):
    attrs = events_otel.to_log_fields(Event("x", EventSource.AGENT, metadata={"raw_error": raw_error}))["attributes"]
    assert not any(k.startswith("exception.") for k in attrs)
    assert "torchelastic.raw_error" not in attrs


def test_rdzv_error_trace_and_fields():
    trace = 'Traceback (most recent call last):\n  File "x.py", line 1\nRuntimeError: store down\n'
    rd = RdzvEvent("n", "run-7", "m", "host-1", 42, NodeState.FAILED, master_endpoint="10.0.0.1:29400", rank=3,
                   local_id=0, error_trace=trace)  # fmt: skip
    attrs = events_otel.to_log_fields(rd)["attributes"]
    assert attrs == {
        "torchelastic.run_id": "run-7",
        "torchelastic.hostname": "host-1",
        "torchelastic.pid": 42,
        "torchelastic.node_state": "FAILED",
        "torchelastic.master_endpoint": "10.0.0.1:29400",
        "torchelastic.rank": 3,
        "torchelastic.local_id": 0,
        "exception.type": "RuntimeError",
        "exception.message": "store down",
        "exception.stacktrace": trace,
        "torchelastic.event.kind": "rdzv",
    }
    plain = events_otel.to_log_fields(RdzvEvent("n", "r", "m", "h", 1, NodeState.RUNNING))["attributes"]
    assert not any(k.startswith("exception.") for k in plain)
    assert "torchelastic.rank" not in plain and "torchelastic.master_endpoint" not in plain


def test_metadata_prefix_none_dropped_and_json_metadata_flattened():
    md = {
        "k": "v",
        "n": 1,
        "f": 0.5,
        "b": False,
        "gone": None,
        "metadata": '{"group_world_size": 1, "entry_point": "python", "local_rank": [0], "exit_code": [null]}',
    }
    attrs = events_otel.to_log_fields(Event("x", EventSource.AGENT, metadata=md))["attributes"]
    assert attrs == {
        "torchelastic.source": "AGENT",
        "torchelastic.k": "v",
        "torchelastic.n": 1,
        "torchelastic.f": 0.5,
        "torchelastic.b": False,
        "torchelastic.metadata.group_world_size": 1,
        "torchelastic.metadata.entry_point": "python",
        "torchelastic.metadata.local_rank": 0,
        "torchelastic.event.kind": "event",
    }


def _assert_valid_attribute(key, value):
    primitives = (str, bool, int, float)
    assert isinstance(key, str) and key, key
    if isinstance(value, (list, tuple)):
        assert len({type(v) for v in value}) <= 1, (key, value)
        assert all(isinstance(v, primitives) for v in value), (key, value)
        values = value
    else:
        assert isinstance(value, primitives), (key, value)
        values = [value]
    for v in values:
        if isinstance(v, int) and not isinstance(v, bool):
            assert -(2**63) <= v < 2**63, (key, v)


def test_nested_and_odd_metadata_made_valid(otel):
    cyclic: list = []
    cyclic.append(cyclic)
    self_dict: dict = {"k": 1}
    self_dict["me"] = {"again": self_dict}
    md = {
        "d": {"a": 1, "b": {"c": "x"}},
        "l": [1, 2],
        "t": (1.0, 2),
        "strs": ["a", "b"],
        "mixed": [1, "a"],
        "nested_list": [[1], [2]],
        "empty": [],
        "big": 2**70,
        "bytes": b"by\xfftes",
        "set": {3},
        "cyclic": cyclic,
        "self_dict": self_dict,
        "obj": object(),
        7: "int key",
    }
    attrs = events_otel.to_log_fields(Event("x", EventSource.AGENT, metadata=md))["attributes"]
    for key, value in attrs.items():
        _assert_valid_attribute(key, value)
    assert attrs["torchelastic.d.a"] == 1 and attrs["torchelastic.d.b.c"] == "x"
    assert attrs["torchelastic.l"] == [1, 2]
    assert attrs["torchelastic.t"] == [1.0, 2.0]
    assert attrs["torchelastic.strs"] == ["a", "b"]
    assert json.loads(attrs["torchelastic.mixed"]) == [1, "a"]
    assert json.loads(attrs["torchelastic.nested_list"]) == [[1], [2]]
    assert attrs["torchelastic.big"] == str(2**70)
    assert attrs["torchelastic.bytes"].startswith("by") and attrs["torchelastic.bytes"].endswith("tes")
    assert json.loads(attrs["torchelastic.set"]) == [3]
    assert isinstance(attrs["torchelastic.cyclic"], str)
    assert attrs["torchelastic.7"] == "int key"
    assert attrs["torchelastic.self_dict.k"] == 1

    # and the SDK keeps every one of them (the adapter itself: serializing this metadata to JSON would fail)
    events_otel.export_event(Event("x", EventSource.AGENT, metadata=md))
    (record,) = otel.log_records()
    exported = {k: (list(v) if isinstance(v, tuple) else v) for k, v in record.attributes.items()}
    assert exported == {k: (list(v) if isinstance(v, tuple) else v) for k, v in attrs.items()}


@settings(max_examples=examples(60), deadline=None)
@given(
    st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20), st.binary(max_size=8)),
        lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=4)),
        max_leaves=20,
    )
)
def test_any_metadata_value_becomes_valid_attributes(value):
    fields = events_otel.to_log_fields(Event("x", EventSource.WORKER, metadata={"v": value, "raw_error": value}))
    for key, attr in fields["attributes"].items():
        _assert_valid_attribute(key, attr)


# ---- events: torch's real agent event shape, end to end --------------------------------------------------------


def _torch_agent_event(state: str, source: str, **kwargs):
    """An event built by torch's own ``SimpleElasticAgent._construct_event`` (on a stand-in agent)."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent, Worker, WorkerSpec
    from torch.distributed.elastic.events import EventSource as TorchEventSource

    rdzv = types.SimpleNamespace(get_run_id=lambda: "job-1", get_backend=lambda: "c10d")
    spec = WorkerSpec(role="default", local_world_size=2, rdzv_handler=rdzv, entrypoint="python", max_restarts=3)
    group = types.SimpleNamespace(spec=spec, group_world_size=1, group_rank=0)
    agent = types.SimpleNamespace(_worker_group=group, _total_execution_time=12, _remaining_restarts=2)
    if kwargs.pop("with_worker", False):
        worker = Worker(local_rank=0, global_rank=1, role_rank=1, world_size=2, role_world_size=2)
        worker.id = 4242
        kwargs["worker"] = worker
    if not torch_events_have_exit_code():  # torch < 2.10 takes (and reports) neither
        kwargs.pop("exit_code", None), kwargs.pop("worker_pid", None)
    return SimpleElasticAgent._construct_event(agent, state=state, source=TorchEventSource[source], **kwargs)


def _expected_worker_failed_attributes(hostname: str) -> dict:
    expected = {
        "torchelastic.source": "WORKER",
        "torchelastic.run_id": "job-1",
        "torchelastic.global_rank": 1,
        "torchelastic.group_rank": 0,
        "torchelastic.worker_id": "4242",
        "torchelastic.role": "default",
        "torchelastic.hostname": hostname,
        "torchelastic.state": "FAILED",
        "torchelastic.total_run_time": 12,
        "torchelastic.rdzv_backend": "c10d",
        "torchelastic.agent_restarts": 1,
        "exception.type": "ValueError",
        "exception.message": "boom",
        "exception.stacktrace": "Traceback (most recent call last):\n  ...\nValueError: boom\n",
        "torchelastic.metadata.group_world_size": 1,
        "torchelastic.metadata.entry_point": "python",
        "torchelastic.metadata.local_rank": 0,
        "torchelastic.metadata.role_rank": 1,
        "torchelastic.metadata.role_world_size": 2,
        "torchelastic.metadata.exit_code": 1,
        "torchelastic.metadata.worker_pid": 4242,
        "torchelastic.event.kind": "event",
    }
    if not torch_events_have_exit_code():  # torch < 2.10 puts neither in the metadata
        del expected["torchelastic.metadata.exit_code"], expected["torchelastic.metadata.worker_pid"]
    return expected


def test_torch_agent_worker_failed_event_end_to_end(otel):
    torch_event = _torch_agent_event("FAILED", "WORKER", with_worker=True, raw_error=TORCH_ERROR_FILE,
                                     exit_code=1, worker_pid=4242)  # fmt: skip
    hostname = torch_event.metadata["hostname"]
    ours = Event.deserialize(torch_event.serialize())
    start = time.time_ns()
    with otel.tracer.start_as_current_span("agent.run") as span:
        events.record(ours, "otel")  # the bridge's own event object
        events.record(torch_event, "otel")  # torch's event object, as torch's agent would pass it
    end = time.time_ns()

    records = otel.log_records()
    assert len(records) == 2
    for record in records:
        assert record.event_name == "torchelastic.worker.status.FAILED"
        assert record.body == "torchelastic.worker.status.FAILED"
        assert (record.severity_number.value, record.severity_text) == (ERROR, "ERROR")
        assert start <= record.timestamp <= end
        assert dict(record.attributes) == _expected_worker_failed_attributes(hostname)
        assert record.trace_id == span.get_span_context().trace_id != 0
        assert record.span_id == span.get_span_context().span_id != 0

    (finished,) = otel.spans.get_finished_spans()
    assert [e.name for e in finished.events] == ["torchelastic.worker.status.FAILED"] * 2
    assert dict(finished.events[0].attributes) == dict(records[0].attributes)
    assert finished.events[0].timestamp == records[0].timestamp


def test_torch_agent_succeeded_event_attributes(otel):
    torch_event = _torch_agent_event("SUCCEEDED", "AGENT", duration_ms=12.5)
    events.record(Event.deserialize(torch_event.serialize()), "otel")
    (record,) = otel.log_records()
    assert record.severity_number.value == INFO
    attrs = dict(record.attributes)
    assert attrs["torchelastic.duration_ms"] == 12.5
    assert attrs["torchelastic.source"] == "AGENT"
    assert attrs["torchelastic.metadata.entry_point"] == "python"
    for absent in ("torchelastic.global_rank", "torchelastic.worker_id", "torchelastic.raw_error",
                   "torchelastic.metadata", "exception.type"):  # fmt: skip
        assert absent not in attrs


def test_no_current_span_gives_zero_ids_and_no_span_event(otel):
    events.record(RdzvEvent("n", "r", "hello", "h", 1, NodeState.RUNNING), "otel")
    (record,) = otel.log_records()
    assert not record.trace_id and not record.span_id
    assert otel.spans.get_finished_spans() == ()


def test_otel_destination_same_record_with_other_handlers_on_its_logger(otel):
    """Another handler on the destination's logger (a user's file handler, pytest's log capture) sends the event
    through torch's JSON path; the exported record must be the same as the direct path's."""
    import logging

    torch_event = _torch_agent_event("FAILED", "WORKER", with_worker=True, raw_error=TORCH_ERROR_FILE,
                                     exit_code=1, worker_pid=4242)  # fmt: skip
    rdzv = RdzvEvent("n", "r", "msg", "h", 1, NodeState.FAILED, rank=0, error_trace="Traceback\nValueError: x\n")
    logger = events._get_or_create_logger("otel")
    logger.handlers[:] = [h for h in logger.handlers if type(h) is events.OtelLoggingHandler]
    for ev in (Event.deserialize(torch_event.serialize()), rdzv, Event("legacy", type="t", metadata={"a": [1]})):
        events.record(ev, "otel")  # the direct path
        extra = logging.NullHandler()
        logger.addHandler(extra)
        try:
            events.record(ev, "otel")  # now via event.serialize() and OtelLoggingHandler.emit
        finally:
            logger.removeHandler(extra)
    records = otel.log_records()
    assert len(records) == 6
    for direct, via_json in zip(records[::2], records[1::2], strict=True):
        assert (direct.event_name, direct.body, direct.severity_number) == (
            via_json.event_name, via_json.body, via_json.severity_number)  # fmt: skip
        assert dict(direct.attributes) == dict(via_json.attributes)


def test_non_recording_span_gets_no_event(otel):
    from opentelemetry import trace

    with trace.use_span(trace.NonRecordingSpan(trace.INVALID_SPAN_CONTEXT)):
        events.record(Event("x", EventSource.AGENT), "otel")
    (record,) = otel.log_records()
    assert record.event_name == "x"


def test_legacy_event_through_otel_event_handler(otel):
    events.configure(events.OtelEventHandler(), event_type="train")
    with otel.tracer.start_as_current_span("step") as span:
        events.record("epoch_done", "train", {"epoch": 3, "loss": None})
    (record,) = otel.log_records()
    assert record.event_name == "epoch_done"
    assert dict(record.attributes) == {
        "torchelastic.event_type": "train",
        "torchelastic.epoch": 3,
        "torchelastic.event.kind": "legacy",
    }
    assert record.span_id == span.get_span_context().span_id


def test_a_drain_sums_counters_and_keeps_the_last_gauge_value_in_one_sdk_call_each(otel, handler):
    """A training loop puts values every step; an SDK call costs 10-15 us each, so a drain adds up a counter's
    values and sets only a gauge's last one -- one SDK call per instrument and chunk of 1,024 values -- while every
    histogram value is recorded. Exported results are those of one call per value."""
    from torchelastic_otel.metrics import _otel as metric_adapter

    steps = 3 * metric_adapter._CHUNK // 4 + 7  # 4 values a step: the drain crosses chunk boundaries
    metrics.put_metric("samples_total", 16, "trainer")
    metrics.put_metric("loss", 1.0, "trainer")
    metrics.put_metric("step_latency_ms", 1, "trainer")
    metrics.put_metric("tokens_total", 2**62, "trainer")
    torchelastic_otel.flush()  # binds the instruments
    calls: collections.Counter[str] = collections.Counter()
    for (_group, name), bound in handler._bound.items():
        original = bound.call
        bound.call = lambda value, attributes, _name=name, _original=original: (
            calls.update([_name]),
            _original(value, attributes),
        )

    for step in range(steps):
        metrics.put_metric("samples_total", 16, "trainer")
        metrics.put_metric("loss", 1.0 / (step + 2), "trainer")
        metrics.put_metric("step_latency_ms", step, "trainer")
        metrics.put_metric("tokens_total", 2**62, "trainer")  # the sum goes beyond int64: exported as a float
    assert torchelastic_otel.flush() is True
    data = otel.reader.get_metrics_data()
    app = {"metric_group": "trainer"}
    assert _point(data, "samples_total", **app).value == 16 * (steps + 1)
    assert _point(data, "loss", **app).value == 1.0 / (steps + 1)
    duration = _point(data, "step_latency", **app)
    assert duration.count == steps + 1 and math.isclose(duration.sum, sum(range(steps)) / 1000 + 0.001)
    assert math.isclose(_point(data, "tokens_total", **app).value, 2**62 * (steps + 1))
    chunks = -(-4 * steps // metric_adapter._CHUNK)
    assert calls["samples_total"] <= chunks and calls["loss"] <= chunks and calls["tokens_total"] <= chunks
    assert calls["step_latency_ms"] == steps
