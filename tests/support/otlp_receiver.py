"""A real, in-process OTLP receiver for tests (gRPC + HTTP, 127.0.0.1 only).

Why this exists: asserting on in-memory SDK exporters only proves that our code
talks to the SDK.  What ``torchelastic_otel`` actually promises is that
telemetry reaches a collector over the wire, so the tests run the *real*
OpenTelemetry OTLP exporters against this receiver and assert on what was
decoded from the wire.  It implements just enough of the OTLP collector
protocol to be useful:

* gRPC: ``opentelemetry.proto.collector.{trace,metrics,logs}.v1`` ``Export``.
* HTTP: ``POST /v1/traces``, ``/v1/metrics``, ``/v1/logs`` with
  ``application/x-protobuf`` or ``application/json`` bodies, optionally
  ``Content-Encoding: gzip`` / ``deflate``.

Everything received is stored (thread-safe) and exposed as flattened plain
dicts (:meth:`OtlpReceiver.logs`, :meth:`OtlpReceiver.spans`,
:meth:`OtlpReceiver.metric_points`) so tests can assert with ``==`` instead of
walking protobuf trees.  :meth:`OtlpReceiver.set_failing` injects
``UNAVAILABLE`` / ``503`` responses so exporter retry paths can be tested.

Servers bind only to 127.0.0.1 (never a wildcard address) so running the test
suite never exposes a port to the network.

Manual use::

    python tests/support/otlp_receiver.py [--grpc-port 4317] [--http-port 4318]

prints the endpoints, then one JSON line per received log/span/metric point.
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
import http.server
import json
import logging
import shutil
import subprocess
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from concurrent import futures
from pathlib import Path
from typing import Any, Literal

import grpc
from google.protobuf import json_format
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import DecodeError, Message
from google.rpc.error_details_pb2 import RetryInfo
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

__all__ = ["OtlpReceiver", "ReceivedRequest", "SIGNALS", "any_value_to_python", "flatten_request"]

_log = logging.getLogger(__name__)

Signal = Literal["traces", "metrics", "logs"]
Transport = Literal["grpc", "http"]

SIGNALS: tuple[Signal, ...] = ("traces", "metrics", "logs")

#: The only interface we ever bind: tests must not expose ports to the network.
HOST = "127.0.0.1"

_REQUEST_TYPES: dict[Signal, type[Message]] = {
    "traces": trace_service_pb2.ExportTraceServiceRequest,
    "metrics": metrics_service_pb2.ExportMetricsServiceRequest,
    "logs": logs_service_pb2.ExportLogsServiceRequest,
}
_RESPONSE_TYPES: dict[Signal, type[Message]] = {
    "traces": trace_service_pb2.ExportTraceServiceResponse,
    "metrics": metrics_service_pb2.ExportMetricsServiceResponse,
    "logs": logs_service_pb2.ExportLogsServiceResponse,
}
_HTTP_PATHS: dict[str, Signal] = {"/v1/traces": "traces", "/v1/metrics": "metrics", "/v1/logs": "logs"}

# OTLP/JSON encodes these ids as hex, while protobuf's canonical JSON mapping
# expects base64 for ``bytes`` fields; we translate before json_format.Parse.
_HEX_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"})


@dataclasses.dataclass(frozen=True)
class ReceivedRequest:
    """One successfully decoded export request, exactly as it came off the wire.

    ``headers`` are lower-cased HTTP headers or gRPC invocation metadata, kept so
    tests can check e.g. ``OTEL_EXPORTER_OTLP_HEADERS`` propagation or that
    ``content-encoding: gzip`` was really used.
    """

    signal: Signal
    transport: Transport
    request: Message
    headers: Mapping[str, str]
    received_at: float


# --------------------------------------------------------------------------- #
# Flattening: protobuf -> plain Python, so tests can assert with ``==``.
# --------------------------------------------------------------------------- #


def any_value_to_python(value: AnyValue) -> Any:
    """Convert an OTLP ``AnyValue`` to the natural Python value (None if unset)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value_to_python(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _attrs(value.kvlist_value.values)
    return getattr(value, kind)  # string/bool/int/double/bytes


def _attrs(kvs: Iterable[KeyValue]) -> dict[str, Any]:
    return {kv.key: any_value_to_python(kv.value) for kv in kvs}


def _hex_id(raw: bytes) -> str:
    """Hex id, or "" for an absent / all-zero (i.e. invalid) id."""
    return raw.hex() if raw and any(raw) else ""


def _opt(msg: Message, field: str) -> Any:
    """Value of a proto3 ``optional`` field, or None when it was not sent."""
    return getattr(msg, field) if msg.HasField(field) else None


def _flatten_logs(req: Any, transport: str) -> list[dict[str, Any]]:
    out = []
    for rl in req.resource_logs:
        resource = _attrs(rl.resource.attributes)
        for sl in rl.scope_logs:
            for rec in sl.log_records:
                out.append(
                    {
                        "resource": resource,
                        "scope": sl.scope.name,
                        "scope_version": sl.scope.version,
                        "event_name": rec.event_name,
                        "body": any_value_to_python(rec.body),
                        "severity_number": int(rec.severity_number),
                        "severity_text": rec.severity_text,
                        "attributes": _attrs(rec.attributes),
                        "trace_id": _hex_id(rec.trace_id),
                        "span_id": _hex_id(rec.span_id),
                        "flags": rec.flags,
                        "time_unix_nano": rec.time_unix_nano,
                        "observed_time_unix_nano": rec.observed_time_unix_nano,
                        "transport": transport,
                    }
                )
    return out


def _flatten_spans(req: Any, transport: str) -> list[dict[str, Any]]:
    out = []
    for rs in req.resource_spans:
        resource = _attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            for span in ss.spans:
                out.append(
                    {
                        "resource": resource,
                        "scope": ss.scope.name,
                        "scope_version": ss.scope.version,
                        "name": span.name,
                        "trace_id": _hex_id(span.trace_id),
                        "span_id": _hex_id(span.span_id),
                        "parent_span_id": _hex_id(span.parent_span_id),
                        "kind": int(span.kind),
                        "start_time_unix_nano": span.start_time_unix_nano,
                        "end_time_unix_nano": span.end_time_unix_nano,
                        "attributes": _attrs(span.attributes),
                        "events": [
                            {"name": e.name, "time_unix_nano": e.time_unix_nano, "attributes": _attrs(e.attributes)}
                            for e in span.events
                        ],
                        "links": [
                            {
                                "trace_id": _hex_id(link.trace_id),
                                "span_id": _hex_id(link.span_id),
                                "attributes": _attrs(link.attributes),
                            }
                            for link in span.links
                        ],
                        "status_code": int(span.status.code),
                        "status_message": span.status.message,
                        "transport": transport,
                    }
                )
    return out


def _flatten_metrics(req: Any, transport: str) -> list[dict[str, Any]]:
    out = []
    for rm in req.resource_metrics:
        resource = _attrs(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                if kind is None:
                    continue
                data = getattr(metric, kind)
                temporality = int(data.aggregation_temporality) if hasattr(data, "aggregation_temporality") else None
                for dp in data.data_points:
                    point: dict[str, Any] = {
                        "resource": resource,
                        "scope": sm.scope.name,
                        "name": metric.name,
                        "description": metric.description,
                        "unit": metric.unit,
                        "type": kind,
                        "is_monotonic": data.is_monotonic if kind == "sum" else None,
                        "temporality": temporality,
                        "attributes": _attrs(dp.attributes),
                        "start_time_unix_nano": dp.start_time_unix_nano,
                        "time_unix_nano": dp.time_unix_nano,
                        "transport": transport,
                    }
                    if kind in ("sum", "gauge"):
                        which = dp.WhichOneof("value")
                        point["value"] = getattr(dp, which) if which else None
                    elif kind == "histogram":
                        point.update(
                            count=dp.count,
                            sum=_opt(dp, "sum"),
                            bucket_counts=list(dp.bucket_counts),
                            explicit_bounds=list(dp.explicit_bounds),
                            min=_opt(dp, "min"),
                            max=_opt(dp, "max"),
                        )
                    elif kind == "exponential_histogram":
                        point.update(
                            count=dp.count,
                            sum=_opt(dp, "sum"),
                            scale=dp.scale,
                            zero_count=dp.zero_count,
                            positive={"offset": dp.positive.offset, "bucket_counts": list(dp.positive.bucket_counts)},
                            negative={"offset": dp.negative.offset, "bucket_counts": list(dp.negative.bucket_counts)},
                            min=_opt(dp, "min"),
                            max=_opt(dp, "max"),
                        )
                    elif kind == "summary":
                        point.update(
                            count=dp.count,
                            sum=dp.sum,
                            quantile_values=[{"quantile": q.quantile, "value": q.value} for q in dp.quantile_values],
                        )
                    out.append(point)
    return out


_FLATTENERS: dict[Signal, Callable[[Any, str], list[dict[str, Any]]]] = {
    "traces": _flatten_spans,
    "metrics": _flatten_metrics,
    "logs": _flatten_logs,
}


def flatten_request(received: ReceivedRequest) -> list[dict[str, Any]]:
    """Flatten one stored request into the same dicts the views return."""
    return _FLATTENERS[received.signal](received.request, received.transport)


def _hex_ids_to_base64(node: Any) -> Any:
    """Rewrite OTLP/JSON hex trace/span ids into protobuf-JSON base64, in place."""
    if isinstance(node, dict):
        for key, val in node.items():
            if key in _HEX_ID_KEYS and isinstance(val, str):
                node[key] = base64.b64encode(bytes.fromhex(val)).decode("ascii")
            else:
                _hex_ids_to_base64(val)
    elif isinstance(node, list):
        for item in node:
            _hex_ids_to_base64(item)
    return node


# --------------------------------------------------------------------------- #
# HTTP transport
# --------------------------------------------------------------------------- #


class _HttpServer(http.server.ThreadingHTTPServer):
    daemon_threads = True  # a stuck client must never block stop()
    allow_reuse_address = True
    receiver: OtlpReceiver

    def handle_error(self, request: Any, client_address: Any) -> None:
        # e.g. a client rejecting our self-signed cert: expected in tests, not stderr noise.
        _log.debug("OTLP HTTP receiver: error handling request from %s", client_address, exc_info=True)


class _HttpHandler(http.server.BaseHTTPRequestHandler):
    """OTLP/HTTP: one request per connection (HTTP/1.0) keeps shutdown simple."""

    server: _HttpServer
    server_version = "otlp-test-receiver/1"

    def log_message(self, format: str, *args: Any) -> None:
        _log.debug("http %s - " + format, self.address_string(), *args)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()  # trailing CRLF (trailers are not supported)
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _reply(self, status: int, body: bytes = b"", content_type: str = "text/plain", **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, val in headers.items():
            self.send_header(key.replace("_", "-"), val)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        receiver = self.server.receiver
        signal = _HTTP_PATHS.get(self.path.split("?", 1)[0].rstrip("/"))
        body = self._read_body()  # always drain, even when rejecting
        if signal is None:
            self._reply(404, b"unknown OTLP path\n")
            return
        fail, retry_after = receiver._take_failure(signal)
        if fail:
            extra = {"Retry_After": f"{retry_after:g}"} if retry_after is not None else {}
            self._reply(503, b"injected failure\n", **extra)
            return

        encoding = self.headers.get("Content-Encoding", "identity").strip().lower()
        content_type = self.headers.get("Content-Type", "application/x-protobuf").split(";")[0].strip().lower()
        try:
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            elif encoding not in ("identity", "none", ""):
                self._reply(415, f"unsupported Content-Encoding {encoding}\n".encode())
                return
            request_cls = _REQUEST_TYPES[signal]
            if content_type == "application/json":
                request = json_format.Parse(
                    json.dumps(_hex_ids_to_base64(json.loads(body or b"{}"))), request_cls(), ignore_unknown_fields=True
                )
            elif content_type in ("application/x-protobuf", "application/protobuf"):
                request = request_cls.FromString(body)
            else:
                self._reply(415, f"unsupported Content-Type {content_type}\n".encode())
                return
        except (OSError, zlib.error, DecodeError, json_format.ParseError, ValueError) as exc:
            self._reply(400, f"cannot decode request: {exc}\n".encode())
            return

        receiver._store(signal, "http", request, {k.lower(): v for k, v in self.headers.items()})
        response = _RESPONSE_TYPES[signal]()
        if content_type == "application/json":
            self._reply(200, json_format.MessageToJson(response).encode(), "application/json")
        else:
            self._reply(200, response.SerializeToString(), "application/x-protobuf")


# --------------------------------------------------------------------------- #
# The receiver
# --------------------------------------------------------------------------- #


class OtlpReceiver:
    """In-process OTLP collector stand-in serving gRPC and HTTP on 127.0.0.1.

    Use as a context manager so the servers are always stopped::

        with OtlpReceiver() as rx:
            exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{rx.grpc_port}", insecure=True)
            ...
            assert rx.wait_for(lambda r: len(r.spans()) == 1)

    Ports default to 0 (ephemeral).  After the first :meth:`start`, the bound
    ports are remembered, so ``stop()`` + ``start()`` brings the receiver back on
    the *same* ports -- handy for "collector went away and came back" tests.
    Stored data survives a restart; use :meth:`clear` to drop it.

    TLS (``tls_cert_file`` + ``tls_key_file``, PEM) applies to gRPC; pass
    ``tls_http=True`` to serve HTTPS with the same certificate as well.  The
    endpoint properties switch to ``https://`` accordingly.
    """

    def __init__(
        self,
        grpc_port: int = 0,
        http_port: int = 0,
        *,
        tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
        tls_http: bool = False,
        on_request: Callable[[ReceivedRequest], None] | None = None,
    ) -> None:
        if (tls_cert_file is None) != (tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file must be given together")
        if tls_http and tls_cert_file is None:
            raise ValueError("tls_http=True needs tls_cert_file/tls_key_file")
        self._grpc_port = grpc_port
        self._http_port = http_port
        self._tls_cert_file = tls_cert_file
        self._tls_key_file = tls_key_file
        self._tls_http = tls_http
        self._on_request = on_request

        # One Condition guards all mutable state; notify() wakes wait_for early.
        self._cond = threading.Condition(threading.Lock())
        self._received: list[ReceivedRequest] = []
        self._requests: dict[Signal, int] = dict.fromkeys(SIGNALS, 0)
        self._rejected: dict[Signal, int] = dict.fromkeys(SIGNALS, 0)
        self._fail_remaining: int | None = 0  # None = fail forever
        self._retry_after: float | None = None

        self._lifecycle = threading.Lock()
        self._grpc_server: grpc.Server | None = None
        self._http_server: _HttpServer | None = None
        self._http_thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> OtlpReceiver:
        """Bind and start both servers (no-op if already running)."""
        with self._lifecycle:
            if self._grpc_server is not None:
                return self
            try:
                self._start_grpc()
                self._start_http()
            except BaseException:
                self._stop_locked()
                raise
            return self

    def _start_grpc(self) -> None:
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="otlp-rx-grpc"),
            # SO_REUSEPORT would let two servers silently share a fixed port.
            options=[("grpc.so_reuseport", 0)],
        )
        self._grpc_server = server  # assigned first so a failed bind is still cleaned up
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(_servicer(self, "logs"), server)
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_servicer(self, "traces"), server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_servicer(self, "metrics"), server)
        address = f"{HOST}:{self._grpc_port}"
        try:
            if self._tls_cert_file is not None:
                assert self._tls_key_file is not None
                with open(self._tls_key_file, "rb") as kf, open(self._tls_cert_file, "rb") as cf:
                    creds = grpc.ssl_server_credentials([(kf.read(), cf.read())])
                port = server.add_secure_port(address, creds)
            else:
                port = server.add_insecure_port(address)
        except RuntimeError as exc:  # newer grpcio raises instead of returning 0
            raise OSError(f"cannot bind gRPC OTLP receiver to {address}: {exc}") from exc
        if not port:
            raise OSError(f"cannot bind gRPC OTLP receiver to {address}")
        self._grpc_port = port
        server.start()

    def _start_http(self) -> None:
        server = _HttpServer((HOST, self._http_port), _HttpHandler)
        server.receiver = self
        self._http_server = server
        if self._tls_http:
            import ssl

            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(self._tls_cert_file, self._tls_key_file)  # type: ignore[arg-type]
            # Handshake lazily in the handler thread, so a stalled client cannot block accept().
            server.socket = ctx.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        self._http_port = server.server_address[1]
        # A short poll interval is what makes shutdown() (and so stop()) prompt.
        self._http_thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="otlp-rx-http", daemon=True
        )
        self._http_thread.start()

    def stop(self) -> None:
        """Stop both servers and wait for them; safe to call repeatedly."""
        with self._lifecycle:
            self._stop_locked()

    def _stop_locked(self) -> None:
        grpc_server, self._grpc_server = self._grpc_server, None
        http_server, self._http_server = self._http_server, None
        http_thread, self._http_thread = self._http_thread, None
        if grpc_server is not None:
            grpc_server.stop(grace=0).wait(timeout=5.0)
        if http_server is not None:
            if http_thread is not None:
                http_server.shutdown()  # only valid while serve_forever runs
                http_thread.join(timeout=5.0)
            http_server.server_close()

    @property
    def running(self) -> bool:
        return self._grpc_server is not None

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- endpoints ----------------------------------------------------------

    @property
    def grpc_port(self) -> int:
        """Bound gRPC port (the constructor value until :meth:`start`)."""
        return self._grpc_port

    @property
    def http_port(self) -> int:
        """Bound HTTP port (the constructor value until :meth:`start`)."""
        return self._http_port

    @property
    def grpc_endpoint(self) -> str:
        """``http(s)://127.0.0.1:PORT`` -- what OTEL_EXPORTER_OTLP_ENDPOINT wants for grpc."""
        scheme = "https" if self._tls_cert_file else "http"
        return f"{scheme}://{HOST}:{self._grpc_port}"

    @property
    def http_endpoint(self) -> str:
        """Base URL (no ``/v1/...``): the http/protobuf exporters append the signal path."""
        scheme = "https" if self._tls_http else "http"
        return f"{scheme}://{HOST}:{self._http_port}"

    # -- fault injection ----------------------------------------------------

    def set_failing(self, failing: bool | int = True, *, retry_after: float | None = None) -> None:
        """Make exports fail with gRPC ``UNAVAILABLE`` / HTTP ``503``.

        ``True`` fails every request until ``set_failing(False)``; an int ``n``
        fails the next ``n`` requests (of any signal) and then recovers;
        ``False``/``0`` stops failing.  With ``retry_after`` (seconds) the
        rejection carries a ``Retry-After`` header / ``google.rpc.RetryInfo``
        trailer, which the exporters honour instead of their 1 s+ exponential
        backoff -- that keeps retry tests fast.  Rejected requests are counted
        in :attr:`rejected` and not stored.
        """
        with self._cond:
            if failing is True:
                self._fail_remaining = None
            elif failing is False:
                self._fail_remaining = 0
            else:
                self._fail_remaining = max(int(failing), 0)
            self._retry_after = retry_after

    def _take_failure(self, signal: Signal) -> tuple[bool, float | None]:
        with self._cond:
            if self._fail_remaining == 0:
                return False, None
            if self._fail_remaining is not None:
                self._fail_remaining -= 1
            self._rejected[signal] += 1
            self._cond.notify_all()
            return True, self._retry_after

    # -- storage ------------------------------------------------------------

    def _store(self, signal: Signal, transport: Transport, request: Message, headers: Mapping[str, str]) -> None:
        item = ReceivedRequest(signal, transport, request, dict(headers), time.time())
        with self._cond:
            self._received.append(item)
            self._requests[signal] += 1
            self._cond.notify_all()
        if self._on_request is not None:
            try:
                self._on_request(item)
            except Exception:  # a broken callback must not fail the export
                _log.exception("on_request callback failed")

    def clear(self) -> None:
        """Forget everything received and reset the counters (not the failure mode)."""
        with self._cond:
            self._received.clear()
            self._requests = dict.fromkeys(SIGNALS, 0)
            self._rejected = dict.fromkeys(SIGNALS, 0)

    @property
    def requests(self) -> dict[Signal, int]:
        """Accepted export requests per signal (a snapshot copy)."""
        with self._cond:
            return dict(self._requests)

    @property
    def rejected(self) -> dict[Signal, int]:
        """Requests rejected by :meth:`set_failing`, per signal (a snapshot copy)."""
        with self._cond:
            return dict(self._rejected)

    def raw_requests(self, signal: Signal | None = None) -> list[ReceivedRequest]:
        """Stored requests (protobuf + headers), optionally of one signal, oldest first."""
        with self._cond:
            items = list(self._received)
        return [r for r in items if signal is None or r.signal == signal]

    def _flat(self, signal: Signal) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for received in self.raw_requests(signal):
            out.extend(flatten_request(received))
        return out

    # -- flattened views ----------------------------------------------------

    def logs(self, event_name: str | None = None) -> list[dict[str, Any]]:
        """All received log records, flattened; optionally only one ``event_name``."""
        return [r for r in self._flat("logs") if event_name is None or r["event_name"] == event_name]

    def spans(self, name: str | None = None) -> list[dict[str, Any]]:
        """All received spans, flattened; optionally only those called ``name``."""
        return [s for s in self._flat("traces") if name is None or s["name"] == name]

    def metric_points(self, name: str | None = None) -> list[dict[str, Any]]:
        """One dict per received data point; optionally only metric ``name``."""
        return [p for p in self._flat("metrics") if name is None or p["name"] == name]

    # -- waiting ------------------------------------------------------------

    def wait_for(
        self, predicate: Callable[[OtlpReceiver], bool], timeout: float = 10.0, interval: float = 0.05
    ) -> bool:
        """Poll ``predicate(self)`` until it is true (-> True) or ``timeout`` passes (-> False).

        Wakes early whenever a request arrives, and never sleeps past the deadline.
        """
        deadline = time.monotonic() + timeout
        while True:
            if predicate(self):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with self._cond:
                self._cond.wait(min(interval, remaining))

    def wait_for_logs(self, n: int = 1, timeout: float = 10.0, event_name: str | None = None) -> bool:
        return self.wait_for(lambda rx: len(rx.logs(event_name)) >= n, timeout)

    def wait_for_spans(self, n: int = 1, timeout: float = 10.0, name: str | None = None) -> bool:
        return self.wait_for(lambda rx: len(rx.spans(name)) >= n, timeout)

    def wait_for_metric_points(self, n: int = 1, timeout: float = 10.0, name: str | None = None) -> bool:
        return self.wait_for(lambda rx: len(rx.metric_points(name)) >= n, timeout)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<OtlpReceiver {state} grpc={self.grpc_endpoint} http={self.http_endpoint} requests={self.requests}>"


def _servicer(receiver: OtlpReceiver, signal: Signal) -> Any:
    """Build the generated gRPC servicer for ``signal`` that feeds ``receiver``."""
    base = {
        "traces": trace_service_pb2_grpc.TraceServiceServicer,
        "metrics": metrics_service_pb2_grpc.MetricsServiceServicer,
        "logs": logs_service_pb2_grpc.LogsServiceServicer,
    }[signal]

    class _Servicer(base):  # type: ignore[misc, valid-type]
        def Export(self, request: Message, context: grpc.ServicerContext) -> Message:
            fail, retry_after = receiver._take_failure(signal)
            if fail:
                if retry_after is not None:
                    delay = Duration()
                    delay.FromNanoseconds(int(retry_after * 1e9))
                    info = RetryInfo(retry_delay=delay).SerializeToString()
                    context.set_trailing_metadata((("google.rpc.retryinfo-bin", info),))
                context.abort(grpc.StatusCode.UNAVAILABLE, "injected failure")
            metadata = {k.lower(): v for k, v in context.invocation_metadata() if isinstance(v, str)}
            receiver._store(signal, "grpc", request, metadata)
            return _RESPONSE_TYPES[signal]()

    return _Servicer()


def _main(argv: list[str] | None = None) -> int:
    """Manual mode: print endpoints, then one JSON line per received item."""
    import argparse
    import signal
    import sys

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grpc-port", type=int, default=0)
    parser.add_argument("--http-port", type=int, default=0)
    args = parser.parse_args(argv)
    # Ctrl-C stops it even when started with SIGINT ignored, which a non-interactive shell does to every command
    # it runs in the background (and Python then installs no KeyboardInterrupt handler): a CI script run with `&`.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    print_lock = threading.Lock()

    def emit(received: ReceivedRequest) -> None:
        with print_lock:
            for item in flatten_request(received):
                line = {"signal": received.signal, **item}
                print(json.dumps(line, default=lambda o: o.hex() if isinstance(o, bytes) else repr(o)), flush=True)

    with OtlpReceiver(args.grpc_port, args.http_port, on_request=emit) as rx:
        print(
            f"OTLP gRPC: {rx.grpc_endpoint}  OTLP HTTP: {rx.http_endpoint}  (Ctrl-C to stop)",
            file=sys.stderr,
            flush=True,
        )
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())


def self_signed_certificate(directory: Path, name: str = "cert") -> tuple[Path, Path]:
    """A self-signed certificate (its own CA) for 127.0.0.1 and its key, for a TLS receiver; skips the calling
    test where the ``openssl`` command is missing."""
    openssl = shutil.which("openssl")
    if openssl is None:
        import pytest

        pytest.skip("openssl CLI not available to make a test certificate")
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-addext", "basicConstraints=critical,CA:TRUE"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return cert, key
