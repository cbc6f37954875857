"""Prove the test OTLP receiver against the *real* OpenTelemetry OTLP exporters.

Why: every other integration test trusts ``tests/support/otlp_receiver.py`` to report
what an exporter put on the wire.  These tests pin that trust down with the
actual SDK + gRPC/HTTP exporters (no mocks) for every signal, with and without
compression, and check the fault-injection, TLS, lifecycle and script modes.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry import trace
from opentelemetry._logs import SeverityNumber
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult

from tests.support import otlp_receiver
from tests.support.env import clean_env
from tests.support.otlp_receiver import OtlpReceiver, self_signed_certificate

RECEIVER_SCRIPT = Path(otlp_receiver.__file__)
CUMULATIVE = 2  # AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
SPAN_KIND_INTERNAL = 1


@pytest.fixture(autouse=True)
def _no_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Exporters read OTEL_* (endpoint, headers, compression, timeout...); isolate every test."""
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)


@pytest.fixture
def rx() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver
    assert not receiver.running


def _exporters(rx: OtlpReceiver, transport: str, gzip_: bool = False, timeout: float = 5.0) -> tuple[Any, Any, Any]:
    """Real span/metric/log exporters pointed explicitly at ``rx``."""
    if transport == "grpc":
        kw: dict[str, Any] = {"endpoint": f"127.0.0.1:{rx.grpc_port}", "insecure": True, "timeout": timeout}
        if gzip_:
            kw["compression"] = grpc.Compression.Gzip
        return GrpcSpanExporter(**kw), GrpcMetricExporter(**kw), GrpcLogExporter(**kw)
    compression = HttpCompression.Gzip if gzip_ else HttpCompression.NoCompression
    base = rx.http_endpoint
    return (
        HttpSpanExporter(endpoint=f"{base}/v1/traces", timeout=timeout, compression=compression),
        HttpMetricExporter(endpoint=f"{base}/v1/metrics", timeout=timeout, compression=compression),
        HttpLogExporter(endpoint=f"{base}/v1/logs", timeout=timeout, compression=compression),
    )


@dataclass
class Pipeline:
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    logger_provider: LoggerProvider


@contextlib.contextmanager
def _pipeline(rx: OtlpReceiver, transport: str, gzip_: bool = False) -> Iterator[Pipeline]:
    """SDK providers (never installed globally) wired to real exporters; shut down on exit."""
    resource = Resource.create({"service.name": "otlp-receiver-test", "test.custom": f"custom-{transport}"})
    span_exp, metric_exp, log_exp = _exporters(rx, transport, gzip_)
    tp = TracerProvider(resource=resource)
    tp.add_span_processor(SimpleSpanProcessor(span_exp))
    # Huge interval: only our explicit force_flush() (and shutdown) export.
    reader = PeriodicExportingMetricReader(metric_exp, export_interval_millis=3_600_000)
    mp = MeterProvider(resource=resource, metric_readers=[reader])
    lp = LoggerProvider(resource=resource)
    lp.add_log_record_processor(SimpleLogRecordProcessor(log_exp))
    try:
        yield Pipeline(tp, mp, lp)
    finally:
        tp.shutdown()
        mp.shutdown(timeout_millis=5_000)
        lp.shutdown()


@pytest.mark.parametrize(
    ("transport", "gzip_"),
    [("grpc", False), ("grpc", True), ("http", False), ("http", True)],
    ids=["grpc", "grpc-gzip", "http", "http-gzip"],
)
def test_all_signals_roundtrip(rx: OtlpReceiver, transport: str, gzip_: bool) -> None:
    with _pipeline(rx, transport, gzip_) as p:
        tracer = p.tracer_provider.get_tracer("test.scope")
        meter = p.meter_provider.get_meter("test.scope")
        logger = p.logger_provider.get_logger("test.scope")
        counter = meter.create_counter("test.restarts", unit="1", description="worker restarts")
        histogram = meter.create_histogram("test.latency", unit="s", description="rendezvous latency")

        with tracer.start_as_current_span("rendezvous", attributes={"round": 2}) as span:
            span.add_event("worker.started", {"rank": 0, "hosts": ["a", "b"]})
            logger.emit(
                body="hello otlp",
                severity_number=SeverityNumber.WARN,
                severity_text="WARN",
                event_name="torchelastic.test.event",
                attributes={"rank": 0, "ok": True, "ratio": 0.5},
                context=trace.set_span_in_context(span),
            )
            span_ctx = span.get_span_context()
        counter.add(3, {"rank": 0})
        histogram.record(3.0, {"rank": 0})
        histogram.record(7.0, {"rank": 0})
        assert p.meter_provider.force_flush(timeout_millis=5_000)

        assert rx.wait_for(
            lambda r: (
                len(r.spans()) == 1
                and len(r.logs()) == 1
                and r.metric_points("test.restarts")
                and r.metric_points("test.latency")
            ),
            timeout=5.0,
        ), rx
    trace_id = format(span_ctx.trace_id, "032x")
    span_id = format(span_ctx.span_id, "016x")
    resource = {"service.name": "otlp-receiver-test", "test.custom": f"custom-{transport}"}

    (s,) = rx.spans()
    assert {k: s["resource"][k] for k in resource} == resource
    assert (s["scope"], s["name"], s["trace_id"], s["span_id"]) == ("test.scope", "rendezvous", trace_id, span_id)
    assert (s["parent_span_id"], s["kind"], s["status_code"], s["transport"]) == ("", SPAN_KIND_INTERNAL, 0, transport)
    assert s["attributes"] == {"round": 2}
    assert [(e["name"], e["attributes"]) for e in s["events"]] == [("worker.started", {"rank": 0, "hosts": ["a", "b"]})]
    assert s["start_time_unix_nano"] <= s["events"][0]["time_unix_nano"] <= s["end_time_unix_nano"]

    (log,) = rx.logs()
    assert {k: log["resource"][k] for k in resource} == resource
    assert log["event_name"] == "torchelastic.test.event"
    assert log["body"] == "hello otlp"
    assert (log["severity_number"], log["severity_text"]) == (SeverityNumber.WARN.value, "WARN")
    assert log["attributes"] == {"rank": 0, "ok": True, "ratio": 0.5}
    assert (log["trace_id"], log["span_id"], log["transport"]) == (trace_id, span_id, transport)
    assert rx.logs(event_name="nope") == []

    # mp.shutdown() re-exports cumulative points; all copies must carry the same values.
    counters = rx.metric_points("test.restarts")
    assert counters and all(
        (c["type"], c["is_monotonic"], c["temporality"], c["value"], c["attributes"], c["unit"])
        == ("sum", True, CUMULATIVE, 3, {"rank": 0}, "1")
        for c in counters
    )
    assert {k: counters[0]["resource"][k] for k in resource} == resource
    assert counters[0]["description"] == "worker restarts"
    for h in rx.metric_points("test.latency"):
        assert (h["type"], h["temporality"], h["attributes"], h["transport"]) == (
            "histogram",
            CUMULATIVE,
            {"rank": 0},
            transport,
        )
        assert (h["count"], h["sum"], h["min"], h["max"]) == (2, 10.0, 3.0, 7.0)
        assert sum(h["bucket_counts"]) == 2 and len(h["bucket_counts"]) == len(h["explicit_bounds"]) + 1

    assert rx.requests["traces"] == 1 and rx.requests["logs"] == 1 and rx.requests["metrics"] >= 1
    if transport == "http":
        encodings = {r.headers.get("content-encoding") for r in rx.raw_requests()}
        assert encodings == ({"gzip"} if gzip_ else {None})

    rx.clear()
    assert rx.spans() == [] and rx.requests == {"traces": 0, "metrics": 0, "logs": 0}


def _one_finished_span() -> Any:
    tracer = TracerProvider().get_tracer("test.scope")  # no processor: we export by hand
    span = tracer.start_span("probe")
    span.end()
    return span


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_set_failing_true_makes_exports_fail(rx: OtlpReceiver, transport: str) -> None:
    # timeout < the exporters' first backoff (~1 s), so they give up at once.
    exporter = _exporters(rx, transport, timeout=0.5)[0]
    try:
        rx.set_failing(True)
        assert exporter.export([_one_finished_span()]) == SpanExportResult.FAILURE
        assert rx.rejected["traces"] >= 1 and rx.spans() == [] and rx.requests["traces"] == 0

        rx.set_failing(False)
        assert exporter.export([_one_finished_span()]) == SpanExportResult.SUCCESS
        assert [s["name"] for s in rx.spans()] == ["probe"]
    finally:
        exporter.shutdown()


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_set_failing_n_then_exporter_retry_succeeds(rx: OtlpReceiver, transport: str) -> None:
    exporter = _exporters(rx, transport, timeout=5.0)[0]
    try:
        rx.set_failing(2, retry_after=0.01)  # Retry-After / RetryInfo keep the retries fast
        started = time.monotonic()
        assert exporter.export([_one_finished_span()]) == SpanExportResult.SUCCESS
        assert time.monotonic() - started < 2.0  # would be >= ~2.4 s with the default backoff
        assert rx.rejected["traces"] == 2 and rx.requests["traces"] == 1
        assert len(rx.spans()) == 1
    finally:
        exporter.shutdown()


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_http_json_with_hex_ids_and_gzip(rx: OtlpReceiver) -> None:
    trace_id, span_id = "5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174"
    payload = {
        "resourceLogs": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "json-client"}}]},
                "scopeLogs": [
                    {
                        "scope": {"name": "json.scope"},
                        "logRecords": [
                            {
                                "timeUnixNano": "1700000000000000000",
                                "severityNumber": 9,
                                "eventName": "json.event",
                                "body": {"kvlistValue": {"values": [{"key": "n", "value": {"intValue": "5"}}]}},
                                "attributes": [
                                    {"key": "xs", "value": {"arrayValue": {"values": [{"doubleValue": 1.5}]}}},
                                    {"key": "raw", "value": {"bytesValue": "AAE="}},
                                ],
                                "traceId": trace_id,
                                "spanId": span_id,
                            }
                        ],
                    }
                ],
            }
        ]
    }
    body = gzip.compress(json.dumps(payload).encode())
    status, reply = _post(
        f"{rx.http_endpoint}/v1/logs", body, {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    )
    assert status == 200 and json.loads(reply) == {}
    (log,) = rx.logs()
    assert log["resource"] == {"service.name": "json-client"}
    assert (log["scope"], log["event_name"], log["severity_number"]) == ("json.scope", "json.event", 9)
    assert log["body"] == {"n": 5}
    assert log["attributes"] == {"xs": [1.5], "raw": b"\x00\x01"}
    assert (log["trace_id"], log["span_id"], log["time_unix_nano"]) == (trace_id, span_id, 1_700_000_000_000_000_000)
    assert log["transport"] == "http"


def test_http_rejects_bad_requests(rx: OtlpReceiver) -> None:
    proto = {"Content-Type": "application/x-protobuf"}
    assert _post(f"{rx.http_endpoint}/v1/nope", b"", proto)[0] == 404
    assert _post(f"{rx.http_endpoint}/v1/traces", b"\xff\xff\xff", proto)[0] == 400
    assert _post(f"{rx.http_endpoint}/v1/traces", b"x", {**proto, "Content-Encoding": "gzip"})[0] == 400
    assert _post(f"{rx.http_endpoint}/v1/traces", b"", {"Content-Type": "text/plain"})[0] == 415
    assert rx.requests == {"traces": 0, "metrics": 0, "logs": 0}
    rx.set_failing(1, retry_after=3)
    status, _ = _post(f"{rx.http_endpoint}/v1/traces", b"", proto)
    assert status == 503 and rx.rejected["traces"] == 1
    assert _post(f"{rx.http_endpoint}/v1/traces", b"", proto)[0] == 200  # failure budget used up


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_binds_loopback_only_and_stop_is_prompt_idempotent_restartable() -> None:
    rx = OtlpReceiver()
    rx.start()
    try:
        assert rx.grpc_endpoint == f"http://127.0.0.1:{rx.grpc_port}"
        assert rx.http_endpoint == f"http://127.0.0.1:{rx.http_port}"
        assert rx.http_port > 0 and rx.grpc_port > 0
        assert rx._http_server is not None and rx._http_server.server_address[0] == "127.0.0.1"
        assert _port_open(rx.grpc_port) and _port_open(rx.http_port)
        ports = (rx.grpc_port, rx.http_port)

        started = time.monotonic()
        rx.stop()
        rx.stop()
        assert time.monotonic() - started < 2.0
        assert not rx.running and not _port_open(ports[0]) and not _port_open(ports[1])

        rx.start()  # comes back on the same ports: "collector restarted" tests rely on it
        assert (rx.grpc_port, rx.http_port) == ports and _port_open(ports[1])
        exporter = HttpSpanExporter(endpoint=f"{rx.http_endpoint}/v1/traces", timeout=5)
        try:
            assert exporter.export([_one_finished_span()]) == SpanExportResult.SUCCESS
        finally:
            exporter.shutdown()
        assert rx.requests["traces"] == 1
    finally:
        rx.stop()


def test_wait_for_is_bounded(rx: OtlpReceiver) -> None:
    started = time.monotonic()
    assert rx.wait_for(lambda r: False, timeout=0.2, interval=10.0) is False
    assert 0.2 <= time.monotonic() - started < 1.0  # never sleeps a whole interval past the deadline
    assert rx.wait_for(lambda r: True, timeout=0) is True
    assert rx.wait_for_spans(1, timeout=0.05) is False


def test_tls_grpc_and_https(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # requests lets these env vars override the session's `verify` (i.e. the
    # exporter's certificate_file), so they must not leak into this test.
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    cert, key = self_signed_certificate(tmp_path)
    with OtlpReceiver(tls_cert_file=str(cert), tls_key_file=str(key), tls_http=True) as rx:
        assert rx.grpc_endpoint.startswith("https://") and rx.http_endpoint.startswith("https://")
        grpc_exp = GrpcSpanExporter(
            endpoint=f"127.0.0.1:{rx.grpc_port}",
            credentials=grpc.ssl_channel_credentials(root_certificates=cert.read_bytes()),
            timeout=5,
        )
        http_exp = HttpSpanExporter(endpoint=f"{rx.http_endpoint}/v1/traces", certificate_file=str(cert), timeout=5)
        try:
            assert grpc_exp.export([_one_finished_span()]) == SpanExportResult.SUCCESS
            assert http_exp.export([_one_finished_span()]) == SpanExportResult.SUCCESS
        finally:
            grpc_exp.shutdown()
            http_exp.shutdown()
        assert sorted(s["transport"] for s in rx.spans()) == ["grpc", "http"]


def _lines(stream: Any, sink: queue.Queue[str]) -> None:
    for line in stream:
        sink.put(line)


@pytest.mark.jobs
def test_script_mode_prints_endpoints_and_json_lines() -> None:
    proc = subprocess.Popen(
        [sys.executable, str(RECEIVER_SCRIPT)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=clean_env(),
    )  # fmt: skip
    out: queue.Queue[str] = queue.Queue()
    err: queue.Queue[str] = queue.Queue()
    for stream, sink in ((proc.stdout, out), (proc.stderr, err)):
        threading.Thread(target=_lines, args=(stream, sink), daemon=True).start()
    try:
        banner = err.get(timeout=8)
        assert "OTLP gRPC: http://127.0.0.1:" in banner, banner
        http_endpoint = banner.split("OTLP HTTP: ")[1].split()[0]
        exporter = HttpSpanExporter(endpoint=f"{http_endpoint}/v1/traces", timeout=5)
        try:
            assert exporter.export([_one_finished_span()]) == SpanExportResult.SUCCESS
        finally:
            exporter.shutdown()
        item = json.loads(out.get(timeout=5))
        assert (item["signal"], item["name"], item["transport"]) == ("traces", "probe", "http")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            # A deadline, not a speed target: on Ctrl-C the receiver stops its gRPC server (up to 5 s) and its HTTP
            # server. The script must stop even if its launcher ignores SIGINT, as a shell's background job does.
            assert proc.wait(timeout=20) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=5)
