"""Self-telemetry: every kind of drop is forced once and must be exported as ``torchelastic_otel.dropped``
``{signal, reason}`` (and what the bridge alters as ``torchelastic_otel.sanitized``).

In-process drops (buffers, values, handlers, attributes) are checked on in-memory providers; exporter-level
drops (an export rejected by the collector, a flush that cannot finish, a full SDK queue, an exporter that does
not exist) run in a child process exporting to a real OTLP receiver, and are checked at the receiver.

The reasons, by signal (what docs/reliability.md documents):

======= ======================================= ==========================================================
signal  reason                                  when
======= ======================================= ==========================================================
metrics buffer_full                             more than ``max_pending`` (65536) values between two drains
metrics non_numeric_value                       the value is not a finite number (None, NaN, "abc", ...)
metrics negative_value                          a negative value for a counter or histogram
metrics handler_error                           a configured ``MetricHandler`` raised
metrics record_error                            the SDK instrument call failed (e.g. one name, two kinds)
logs    buffer_full                             more than 65536 events between two drains
logs    attribute_limit                         an event had more than 96 metadata attributes (per attribute)
logs    conversion_error                        an event could not be turned into a log record
logs    handler_error / delegate_error          a legacy ``EventHandler`` / an ``OtelEventHandler`` delegate raised
<any>   queue_full / after_shutdown             the SDK batch processor's queue (2048) was full / shut down
<any>   export_failed                           the exporter returned FAILURE (or raised): counts the batch
<any>   exporter_unavailable:<name>             an ``OTEL_*_EXPORTER`` name that cannot be loaded or started
all     flush_timeout                           a flush gave up (timeout, or an export stuck > 500 ms)
all     drain_error                             a buffer's drain raised
======= ======================================= ==========================================================
"""

from __future__ import annotations

from typing import Any

import pytest

import torchelastic_otel
from tests.support.env import BATCHES, otlp_env
from tests.support.rel_common import OtlpReceiver, dropped, live_child, report
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel import events, metrics
from torchelastic_otel._export import drainer as _drainer
from torchelastic_otel.events import _otel as event_adapter


def exported(otel: Any, kind: str = "dropped") -> dict[tuple[str, str], int]:
    """``torchelastic_otel.<kind>`` as exported by one collection: {(signal, reason): value}."""
    torchelastic_otel.flush()
    return {
        (attrs["signal"], attrs["reason"]): point.value
        for attrs, point in otel.metric_points(f"torchelastic_otel.{kind}")
    }


def total(signal: str, reason: str, kind: str = selftelemetry.DROPPED) -> int:
    return selftelemetry.total(kind, signal, reason)


def assert_exported(otel: Any, signal: str, reason: str, at_least: int, before: int) -> int:
    """After a flush, the counter grew by ``at_least`` and the exported value is the counter's value."""
    value = exported(otel).get((signal, reason))
    now = total(signal, reason)
    assert now - before >= at_least, (signal, reason, before, now)
    assert value == now, (signal, reason, value, now)
    return now - before


def test_buffer_full_metrics_at_the_default_bound(otel: Any, paused_drainer: Any) -> None:
    """65536 values are buffered between two drains; the rest are dropped and counted, nothing blocks."""
    handler = metrics.OtelMetricHandler()
    metrics.configure(handler, "rel.full")
    before = total("metrics", "buffer_full")
    for _ in range(metrics.DEFAULT_MAX_PENDING + 100):
        metrics.put_metric("rel.full.count", 1, "rel.full")
    grew = assert_exported(otel, "metrics", "buffer_full", 100, before)
    assert grew == 100
    calls = [p for attrs, p in otel.metric_points("rel.full.count")]
    assert [p.value for p in calls] == [metrics.DEFAULT_MAX_PENDING]


def test_buffer_full_logs(otel: Any, paused_drainer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(event_adapter._buffer, "max_pending", 50)
    events.configure(events.OtelEventHandler(), "rel")
    before = total("logs", "buffer_full")
    for i in range(80):
        events.record("rel.full", "rel", {"i": i})
    grew = assert_exported(otel, "logs", "buffer_full", 30, before)
    assert grew == 30
    assert sorted(r.attributes["torchelastic.i"] for r in otel.log_records()) == list(range(50))  # the oldest kept


@pytest.mark.parametrize(
    "name, value, reason",
    [
        ("rel.value", None, "non_numeric_value"),
        ("rel.value", "abc", "non_numeric_value"),
        ("rel.value", float("nan"), "non_numeric_value"),
        ("rel.value", 10**400, "non_numeric_value"),
        ("rel.value.count", -1, "negative_value"),
        ("rel.value.ms", -5, "negative_value"),
    ],
)
def test_bad_metric_values(otel: Any, name: str, value: Any, reason: str) -> None:
    metrics.configure(metrics.OtelMetricHandler(), "rel")
    before = total("metrics", reason)
    metrics.put_metric(name, value, "rel")
    assert assert_exported(otel, "metrics", reason, 1, before) == 1


def test_record_error_one_name_two_kinds(otel: Any) -> None:
    """``x.ms`` makes histogram ``x``; a later plain ``x`` (a gauge) cannot use it: counted, not raised."""
    metrics.configure(metrics.OtelMetricHandler(), "rel")
    before = total("metrics", "record_error")
    metrics.put_metric("rel.kind.ms", 5, "rel")
    metrics.put_metric("rel.kind", 5, "rel")
    assert assert_exported(otel, "metrics", "record_error", 1, before) == 1


def test_attribute_limit(otel: Any) -> None:
    events.configure(events.OtelEventHandler(), "rel")
    before = total("logs", "attribute_limit")
    events.record("rel.wide", "rel", {f"k{i:03d}": i for i in range(200)})
    (record,) = [r for r in otel.log_records() if r.event_name == "rel.wide"]
    kept = [k for k in record.attributes if k.startswith("torchelastic.k")]
    assert len(kept) == 96 - 1  # 96 attributes from a mapping: torchelastic.event_type first, then metadata
    assert assert_exported(otel, "logs", "attribute_limit", 200 - len(kept), before) == 200 - len(kept)


class Boom(Exception):
    pass


class BadMetricHandler(metrics.MetricHandler):
    def emit(self, metric_data: Any) -> None:
        raise Boom("metric handler")


class BadEventHandler(events.EventHandler):
    def record(self, event: Any) -> None:
        raise Boom("event handler")


class ExplodingDict(dict):
    """Metadata whose items() raises when the drainer converts the event."""

    def items(self) -> Any:
        raise Boom("conversion")


def test_handler_and_conversion_errors(otel: Any) -> None:
    metrics.configure(BadMetricHandler(), "rel.bad")
    events.configure(BadEventHandler(), "rel.bad")
    events.configure(events.OtelEventHandler(delegate=BadEventHandler()), "rel.delegate")
    before = {key: total(*key) for key in [("metrics", "handler_error"), ("logs", "handler_error"),
                                           ("logs", "delegate_error"), ("logs", "conversion_error")]}  # fmt: skip
    metrics.put_metric("rel.bad", 1, "rel.bad")  # never raises into the caller
    events.record("rel.bad", "rel.bad", {})
    events.record("rel.delegate", "rel.delegate", {})  # exported, and the delegate's failure counted
    events.record(events.Event("rel.conversion", events.EventSource.WORKER, metadata=ExplodingDict(a=1)), "otel")
    for (signal, reason), value in before.items():
        assert assert_exported(otel, signal, reason, 1, value) == 1
    names = [r.event_name for r in otel.log_records()]
    assert "rel.delegate" in names and "rel.conversion" not in names


def test_drain_error(otel: Any) -> None:
    class BadBuffer:
        signal = "logs"

        def drain(self, deadline: float | None = None) -> int:
            raise Boom("drain")

        def discard(self, reason: str) -> int:
            return 0

        def after_fork_in_child(self) -> None:
            pass

    bad = BadBuffer()
    _drainer.register(bad)
    before = total("all", "drain_error")
    try:
        assert assert_exported(otel, "all", "drain_error", 1, before) >= 1
    finally:
        _drainer.state.buffers.discard(bad)


def test_sanitized_is_exported(otel: Any) -> None:
    events.configure(events.OtelEventHandler(), "rel")
    before = total("logs", "bytes_decoded", selftelemetry.SANITIZED)
    events.record("rel.bytes", "rel", {"blob": b"\xff"})
    torchelastic_otel.flush()
    assert total("logs", "bytes_decoded", selftelemetry.SANITIZED) == before + 1
    assert exported(otel, "sanitized")[("logs", "bytes_decoded")] == before + 1


# ---- exporter level, through a real receiver --------------------------------------------------------------------


@pytest.mark.jobs
def test_exporter_failures_are_counted_and_exported() -> None:
    """A collector rejecting every export (gRPC UNAVAILABLE): the exporters give up after
    OTEL_EXPORTER_OTLP_TIMEOUT, each failed batch is counted (export_failed), the small SDK log queue overflows
    (queue_full), the first flush gives up (flush_timeout); an unknown exporter is counted too. Once the collector
    accepts again, the counters arrive with the metrics."""
    with OtlpReceiver() as rx:
        rx.set_failing(True, retry_after=0.2)
        env = otlp_env(
            rx,
            pace=BATCHES,
            OTEL_EXPORTER_OTLP_TIMEOUT="1",
            OTEL_TRACES_EXPORTER="otlp,doesnotexist",
            OTEL_BLRP_MAX_QUEUE_SIZE="16",
            OTEL_BLRP_MAX_EXPORT_BATCH_SIZE="8",
            OTEL_METRIC_EXPORT_INTERVAL="600000",
        )
        with live_child("export_faults", env) as child:
            child.read_until(lambda line: line.startswith("REL_STAGE failed"), timeout=60)
            assert rx.rejected["logs"] >= 1 and rx.rejected["metrics"] >= 1, rx.rejected
            rx.set_failing(False)
            done = child.finish(timeout=60)
        assert done.returncode == 0, done.stderr[-3000:]
        result = done.result
        assert result["healed"] is True
        assert rx.wait_for(lambda r: ("logs", "export_failed") in dropped(r), timeout=10), rx.requests
        got = dropped(rx, **{"process.pid": result["pid"]})
        counts = result["counts"]
        for key in [
            ("logs", "export_failed"),
            ("metrics", "export_failed"),
            ("traces", "export_failed"),
            ("logs", "queue_full"),
            ("all", "flush_timeout"),
            ("traces", "exporter_unavailable:doesnotexist"),
        ]:
            assert got.get(key, 0) >= 1, (key, got)
            assert got[key] == counts[f"dropped/{key[0]}/{key[1]}"], (key, got, counts)
        # Every event is accounted for: delivered after the collector healed, or counted as dropped.
        delivered = len(rx.logs("rel.fault"))
        lost = got[("logs", "export_failed")] + got[("logs", "queue_full")]
        assert delivered + lost == result["events"], (delivered, lost)
        assert result["flushed"] is False and result["flush_seconds"] < 2.0, result
        report(
            "exporter failures (collector rejecting every export, then healed)",
            [("dropped counters received", dict(sorted((f"{s}/{r}", v) for (s, r), v in got.items()))),
             ("events delivered + counted", f"{delivered} + {lost} = {result['events']}"),
             ("first flush gave up after", f"{result['flush_seconds']:.2f} s")],
        )  # fmt: skip
