"""Security: secrets stay secret, endpoints stay local, TLS works (and fails cleanly), metadata cannot spoof.

- ``OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer <token>`` reaches the collector, but the token never appears in
  the program's output (with DEBUG logging of everything, including the exporters' errors when the collector is
  down) nor in anything exported;
- the Prometheus endpoint listens on 127.0.0.1 unless ``OTEL_EXPORTER_PROMETHEUS_HOST`` says otherwise (the
  exporter's own default, ``localhost``, is resolved by name and is not guaranteed to be loopback);
- OTLP over TLS with a self-signed certificate (``OTEL_EXPORTER_OTLP_CERTIFICATE``), gRPC and HTTP: delivered; with
  the wrong certificate: the program still exits 0, in bounded time, and the loss is counted;
- event metadata cannot add resource attributes or pose as another run: every metadata key stays under
  ``torchelastic.`` on the record, and the resource keeps the real run id, host and pid.
"""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.env import BATCHES, clean_env, closed_endpoint, otlp_env
from tests.support.otlp_receiver import self_signed_certificate
from tests.support.ports import free_port
from tests.support.rel_common import OtlpReceiver, live_child, report, run_child
from tests.support.workers._rel_child import SECRET

RUN_ID = "real-run-3c1f"
HEADERS = {"OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer {SECRET}"}


def everything_received(rx: OtlpReceiver) -> str:
    """Every decoded item (records, spans, points with their resources) as text, to search for the token."""
    return repr([*rx.logs(), *rx.spans(), *rx.metric_points()])


@pytest.mark.parametrize("collector", ["grpc", "http", "down"])
def test_exporter_headers_never_leak(collector: str) -> None:
    with OtlpReceiver() as rx:
        target = closed_endpoint() if collector == "down" else rx
        protocol = "http/protobuf" if collector == "http" else "grpc"
        env = otlp_env(target, protocol, pace=BATCHES, TORCHELASTIC_RUN_ID=RUN_ID, RANK="0",
                       OTEL_EXPORTER_OTLP_TIMEOUT="2", **HEADERS)  # fmt: skip
        child = run_child("secrets", env, timeout=60)
        assert "DEBUG" in child.stderr  # DEBUG logging was on
        assert SECRET not in child.stdout and SECRET not in child.stderr
        if collector == "down":
            assert child.result["flushed"] is False
            assert "Bearer" not in child.stderr
            return
        assert child.result["flushed"] is True
        assert rx.wait_for(lambda r: r.logs("rel.spoof") and r.metric_points("rel.secrets.count"), timeout=10)
        # the header was sent (so it was really configured) ...
        assert {r.headers.get("authorization") for r in rx.raw_requests()} == {f"Bearer {SECRET}"}
        # ... and exported nowhere
        assert SECRET not in everything_received(rx)
        if collector == "grpc":
            _assert_no_spoofing(rx, child.result["pid"])


def _assert_no_spoofing(rx: OtlpReceiver, pid: int) -> None:
    (spoof,) = rx.logs("rel.spoof")
    (legacy,) = rx.logs("rel.spoof.legacy")
    (span,) = rx.spans("rel.secrets")
    for attributes in (spoof["attributes"], legacy["attributes"], *(e["attributes"] for e in span["events"])):
        for key in attributes:
            assert key.startswith("torchelastic."), key  # nothing poses as a resource or semantic attribute
    attrs = spoof["attributes"]
    assert attrs["torchelastic.service.name"] == "evil-service"
    assert attrs["torchelastic.torchelastic.run_id"] == "other-run"
    assert attrs["torchelastic.resource.x"] == "injected"
    assert attrs["torchelastic.exception.message"] == "fake" and "exception.message" not in attrs
    assert attrs["torchelastic.nested.service.name"] == "evil-nested"
    assert legacy["attributes"]["torchelastic.torchelastic.rank"] == 99
    for item in [*rx.logs(), *rx.spans(), *rx.metric_points()]:
        resource = item["resource"]
        assert resource["service.name"] == "torchelastic"
        assert resource["torchelastic.run_id"] == RUN_ID
        assert resource["torchelastic.rank"] == 0
        assert resource["process.pid"] == pid
        assert resource["host.name"] != "evil-host"
        assert "resource.x" not in resource and "torchelastic.resource.x" not in resource


def _listening(port: int) -> list[str]:
    """Local addresses of the sockets listening on ``port`` (from /proc/net/tcp and tcp6)."""
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            address, state = fields[1], fields[3]
            host, hex_port = address.split(":")
            if state != "0A" or int(hex_port, 16) != port:  # 0A: LISTEN
                continue
            if width == 8:
                found.append(".".join(str(int(host[i : i + 2], 16)) for i in (6, 4, 2, 0)))
            else:
                found.append("::1" if host == "0" * 24 + "01000000" else host)
    return found


def test_prometheus_listens_on_loopback_by_default() -> None:
    port = free_port()
    env = clean_env(
        OTEL_METRICS_EXPORTER="prometheus",
        OTEL_TRACES_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        OTEL_EXPORTER_PROMETHEUS_PORT=str(port),
    )  # fmt: skip  (OTEL_EXPORTER_PROMETHEUS_HOST unset)
    with live_child("prometheus", env) as child:
        child.read_until(lambda line: line.startswith("REL_RESULT"), timeout=30)
        addresses = _listening(port)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
        done = child.finish(timeout=30)
    report("prometheus endpoint, OTEL_EXPORTER_PROMETHEUS_HOST unset", [("listening on", addresses)])
    assert addresses == ["127.0.0.1"], addresses
    from prometheus_client.parser import text_string_to_metric_families

    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples["rel_prom_count_total"] == 3
    assert done.returncode == 0


def test_prometheus_host_defaults_to_127_0_0_1_while_the_reader_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The exporter reads OTEL_EXPORTER_PROMETHEUS_HOST (default "localhost", resolved by name) when it starts:
    the bridge makes the unset default 127.0.0.1 for that moment, and leaves an explicit value alone."""
    from torchelastic_otel._export import providers

    var = "OTEL_EXPORTER_PROMETHEUS_HOST"
    seen: list[str | None] = []

    class Reader:  # stands in for opentelemetry.exporter.prometheus._AutoPrometheusMetricReader
        def __init__(self) -> None:
            seen.append(os.environ.get(var))

    Reader.__module__ = "opentelemetry.exporter.prometheus"
    monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert isinstance(providers.construct("metrics", "prometheus", Reader), Reader)
    assert seen == ["127.0.0.1"] and var not in os.environ
    monkeypatch.setenv(var, "0.0.0.0")  # configured otherwise: used as is (nothing is bound here)
    providers.construct("metrics", "prometheus", Reader)
    assert seen == ["127.0.0.1", "0.0.0.0"] and os.environ[var] == "0.0.0.0"


# ---- TLS ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    directory = tmp_path_factory.mktemp("tls")
    return {name: self_signed_certificate(directory, name) for name in ("server", "other")}


def _tls_env(rx: OtlpReceiver, protocol: str, certificate: Path, **extra: str) -> dict[str, Any]:
    assert (rx.grpc_endpoint if protocol == "grpc" else rx.http_endpoint).startswith("https://")
    env = otlp_env(rx, protocol, pace=BATCHES, OTEL_EXPORTER_OTLP_CERTIFICATE=str(certificate), **extra)
    for var in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"):
        env.pop(var, None)  # requests lets these override the exporter's certificate
    return env


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_otlp_over_tls(certificates: dict[str, tuple[Path, Path]], protocol: str) -> None:
    cert, key = certificates["server"]
    with OtlpReceiver(tls_cert_file=str(cert), tls_key_file=str(key), tls_http=True) as rx:
        child = run_child("tls", _tls_env(rx, protocol, cert), timeout=60)
        assert child.result["flushed"] is True, child.stderr[-3000:]
        assert len(rx.logs("rel.tls")) == 5
        assert rx.wait_for(lambda r: bool(r.metric_points("rel.tls.count")), timeout=10)
        assert {r.transport for r in rx.raw_requests()} == {"grpc" if protocol == "grpc" else "http"}


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_otlp_over_tls_with_the_wrong_certificate_fails_cleanly(
    certificates: dict[str, tuple[Path, Path]], protocol: str
) -> None:
    cert, key = certificates["server"]
    wrong, _ = certificates["other"]
    with OtlpReceiver(tls_cert_file=str(cert), tls_key_file=str(key), tls_http=True) as rx:
        child = run_child("tls", _tls_env(rx, protocol, wrong, OTEL_EXPORTER_OTLP_TIMEOUT="3"), timeout=60)
        result = child.result
        counted = {k: v for k, v in result["counts"].items() if k.startswith("dropped/")}
        report(f"OTLP/{protocol} over TLS with the wrong certificate",
               [("exit code", child.returncode), ("flush", f"{result['flush_seconds']:.2f} s -> {result['flushed']}"),
                ("child wall time", f"{child.seconds:.2f} s"), ("counted drops", counted)])  # fmt: skip
        assert child.returncode == 0 and "Traceback" not in child.stderr
        assert result["flushed"] is False and result["flush_seconds"] < 2.0
        assert counted.get("dropped/all/flush_timeout", 0) + counted.get("dropped/logs/export_failed", 0) >= 1
        assert not rx.logs() and not rx.metric_points()  # nothing went through an unverified connection
