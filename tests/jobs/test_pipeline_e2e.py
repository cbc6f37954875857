"""End to end: with only ``OTEL_*`` set, the bridge exports through the real exporters to a real receiver.

The pipeline is process-global (OpenTelemetry's global providers can be set once per process), so every scenario
runs ``tests/support/workers/_e2e_child.py`` -- a user program using only the public APIs -- in a fresh subprocess with
a controlled environment (every inherited ``OTEL_*`` and torchrun variable removed), and asserts what arrived: decoded
OTLP log records, spans with their span events, metric points and resources at :class:`OtlpReceiver` (gRPC and HTTP on
127.0.0.1), the console exporters' output, or a Prometheus scrape.

Unless a test says otherwise the export intervals are left at their defaults (60 s metrics, 1-5 s batches), so
what arrives was delivered by the bridge's flush at exit, not by a timer.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import WORKERS
from tests.support.env import otlp_env, prometheus_env
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.ports import free_port, free_port_block
from tests.support.procs import run_script, start_script, stop_script
from torchelastic_otel.metrics.rules import DURATION_BUCKETS_S

CHILD = WORKERS / "_e2e_child.py"
CHILD_TIMEOUT = 30.0
#: How long to keep waiting for something that must NOT arrive, after the child exited (having flushed).
ABSENCE_WAIT = 0.5
DELIVERY_WAIT = 10.0

SPAN_NAME = "e2e.run"
EVENT_NAMES = ("e2e.started", "torchelastic.worker.status.FAILED", "e2e.legacy")
PROF_FUNCTION = "Trainer.train_step"
METRIC_NAMES = (
    "torchelastic.function.calls",
    "torchelastic.function.duration",
    "torchelastic.workers.remaining_restarts",
    "loss",
)
SEVERITY_INFO, SEVERITY_ERROR = 9, 17
SECRET = "secret-token"


# --------------------------------------------------------------------------------------------------------------
# Running the child
# --------------------------------------------------------------------------------------------------------------


@dataclass
class Child:
    returncode: int
    stdout: str
    stderr: str
    result: dict[str, Any]


def exporting_to(rx: OtlpReceiver, transport: str, **overrides: str) -> dict[str, str]:
    """``OTEL_*`` pointing every signal at ``rx`` over ``transport`` (``grpc`` or ``http``), at the SDK's own
    intervals."""
    return otlp_env(rx, "grpc" if transport == "grpc" else "http/protobuf", pace={}, **overrides)


def parse_result(stdout: str) -> dict[str, Any]:
    lines = [line for line in stdout.splitlines() if line.startswith("E2E_RESULT ")]
    return json.loads(lines[-1][len("E2E_RESULT ") :]) if lines else {}


def run_child(scenario: str, env: dict[str, str], timeout: float = CHILD_TIMEOUT) -> Child:
    """Run one scenario to completion (killed by ``subprocess.run`` if it outlives ``timeout``)."""
    proc = run_script(CHILD, scenario, env=env, timeout=timeout)
    child = Child(proc.returncode, proc.stdout, proc.stderr, parse_result(proc.stdout))
    assert child.returncode == 0, f"child failed ({child.returncode}):\n{child.stdout}\n{child.stderr}"
    assert child.result, f"child printed no result:\n{child.stdout}\n{child.stderr}"
    return child


@contextlib.contextmanager
def popen_child(scenario: str, env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """A long-running child (stdin kept open); always killed and reaped on the way out."""
    proc = start_script(CHILD, scenario, env=env)
    try:
        yield proc
    finally:
        stop_script(proc)


def read_result(proc: subprocess.Popen[str], timeout: float = CHILD_TIMEOUT) -> dict[str, Any]:
    """Read the child's stdout up to its ``E2E_RESULT`` line, never past ``timeout``."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError("child did not report ready in time")
        ready, _, _ = select.select([proc.stdout], [], [], remaining)
        if not ready:
            continue
        line = proc.stdout.readline()
        if not line:
            stderr = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"child exited early ({proc.wait(timeout=5)}): {stderr}")
        if line.startswith("E2E_RESULT "):
            return json.loads(line[len("E2E_RESULT ") :])


def finish(proc: subprocess.Popen[str], timeout: float = CHILD_TIMEOUT) -> tuple[str, str]:
    """Release a waiting child and wait (bounded) for its normal exit."""
    out, err = proc.communicate("\n", timeout=timeout)
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{out}\n{err}"
    return out, err


# --------------------------------------------------------------------------------------------------------------
# Receiver helpers
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture
def rx() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver
    assert not receiver.running


def latest_points(rx: OtlpReceiver, name: str) -> dict[frozenset, dict[str, Any]]:
    """The last received point of ``name`` per attribute set (cumulative metrics may be exported repeatedly)."""
    out: dict[frozenset, dict[str, Any]] = {}
    for point in rx.metric_points(name):
        out[frozenset(point["attributes"].items())] = point
    return out


def point(rx: OtlpReceiver, name: str, **attributes: Any) -> dict[str, Any]:
    points = latest_points(rx, name)
    key = frozenset(attributes.items())
    assert key in points, f"no {name} point with {attributes}; got {[dict(k) for k in points]}"
    return points[key]


def everything_arrived(rx: OtlpReceiver) -> bool:
    names = {r["event_name"] for r in rx.logs()}
    metric_names = {p["name"] for p in rx.metric_points()}
    return (
        set(EVENT_NAMES) <= names
        and bool(rx.spans(SPAN_NAME))
        and set(METRIC_NAMES) <= metric_names
        # both @prof outcomes and both durations are in the same collection
        and len(latest_points(rx, "torchelastic.function.calls")) >= 2
    )


def signal_arrived(rx: OtlpReceiver, signal: str) -> bool:
    if signal == "logs":
        return set(EVENT_NAMES) <= {r["event_name"] for r in rx.logs()}
    if signal == "traces":
        return bool(rx.spans(SPAN_NAME))
    return set(METRIC_NAMES) <= {p["name"] for p in rx.metric_points()}


def all_resources(rx: OtlpReceiver) -> list[dict[str, Any]]:
    return [item["resource"] for item in (*rx.logs(), *rx.spans(), *rx.metric_points())]


def assert_logs(rx: OtlpReceiver, result: dict[str, Any], transport: str) -> None:
    logs = {r["event_name"]: r for r in rx.logs()}
    assert set(EVENT_NAMES) <= set(logs)
    for name in EVENT_NAMES:
        record = logs[name]
        assert record["transport"] == transport
        assert record["scope"] == "torchelastic_otel"
        assert record["trace_id"] == result["trace_id"], name
        assert record["span_id"] == result["span_id"], name
        assert record["time_unix_nano"] > 0

    started = logs["e2e.started"]
    assert (started["severity_number"], started["severity_text"]) == (SEVERITY_INFO, "INFO")
    assert started["body"] == "e2e.started"
    assert started["attributes"] == {
        "torchelastic.source": "AGENT",
        "torchelastic.step": 7,
        "torchelastic.ok": True,
        "torchelastic.role": "trainer",
        "torchelastic.event.kind": "event",
    }

    failed = logs["torchelastic.worker.status.FAILED"]
    assert (failed["severity_number"], failed["severity_text"]) == (SEVERITY_ERROR, "ERROR")
    attrs = failed["attributes"]
    assert attrs["exception.type"] == "ValueError"
    assert attrs["exception.message"] == "boom at step 7"
    assert attrs["exception.stacktrace"].startswith("Traceback (most recent call last):")
    assert "ValueError: boom at step 7" in attrs["exception.stacktrace"]
    expected = {
        "torchelastic.source": "WORKER",
        "torchelastic.state": "FAILED",
        "torchelastic.run_id": "e2e-run",
        "torchelastic.role": "trainer",
        "torchelastic.global_rank": 1,
        "torchelastic.group_rank": 0,
        "torchelastic.worker_id": "4242",
        "torchelastic.hostname": "node-0.example",
        "torchelastic.rdzv_backend": "c10d",
        "torchelastic.agent_restarts": 1,
        "torchelastic.duration_ms": 34,
        "torchelastic.metadata.group_world_size": 2,
        "torchelastic.metadata.entry_point": "train.py",
    }
    assert {k: attrs.get(k) for k in expected} == expected
    assert not any("raw_error" in key for key in attrs), attrs

    legacy = logs["e2e.legacy"]
    assert (legacy["severity_number"], legacy["severity_text"]) == (SEVERITY_INFO, "INFO")
    assert legacy["attributes"] == {
        "torchelastic.event_type": "e2e_type",
        "torchelastic.k": 1,
        "torchelastic.event.kind": "legacy",
    }


def assert_span(rx: OtlpReceiver, result: dict[str, Any], transport: str) -> None:
    spans = rx.spans(SPAN_NAME)
    assert len(spans) == 1, spans
    span = spans[0]
    assert span["transport"] == transport
    assert (span["trace_id"], span["span_id"]) == (result["trace_id"], result["span_id"])
    assert span["scope"] == "e2e.child"
    assert [e["name"] for e in span["events"]] == list(EVENT_NAMES)
    failed = span["events"][1]["attributes"]
    assert failed["exception.type"] == "ValueError"
    assert failed["torchelastic.state"] == "FAILED"
    assert span["events"][2]["attributes"]["torchelastic.event_type"] == "e2e_type"


def assert_metrics(rx: OtlpReceiver, transport: str) -> None:
    assert {p["transport"] for p in rx.metric_points()} == {transport}
    for outcome in ("success", "failure"):
        calls = point(rx, "torchelastic.function.calls", metric_group="app", function=PROF_FUNCTION, outcome=outcome)
        assert (calls["type"], calls["is_monotonic"], calls["unit"], calls["value"]) == ("sum", True, "{call}", 1)

    duration = point(rx, "torchelastic.function.duration", metric_group="app", function=PROF_FUNCTION)
    assert (duration["type"], duration["unit"], duration["count"]) == ("histogram", "s", 2)
    assert duration["explicit_bounds"] == list(DURATION_BUCKETS_S)
    assert 0 <= duration["sum"] < 1.0

    rendezvous = point(
        rx, "torchelastic.function.duration", metric_group="torchelastic", function="SimpleElasticAgent._rendezvous"
    )
    # 1500 ms -> 1.5 s, in the (1.0, 2.5] bucket
    assert (rendezvous["count"], rendezvous["sum"], rendezvous["min"], rendezvous["max"]) == (1, 1.5, 1.5, 1.5)
    assert rendezvous["bucket_counts"][DURATION_BUCKETS_S.index(2.5)] == 1

    restarts = point(rx, "torchelastic.workers.remaining_restarts", metric_group="torchelastic", role="default")
    assert (restarts["type"], restarts["unit"], restarts["value"]) == ("gauge", "{restart}", 3)

    loss = point(rx, "loss", metric_group="app")
    assert (loss["type"], loss["value"]) == ("gauge", 0.25)


def assert_resources(rx: OtlpReceiver, result: dict[str, Any], *, bridge_built: bool = True, **expected: Any) -> None:
    """Every received item carries ``expected``; the bridge's resource also names the child's pid."""
    resources = all_resources(rx)
    assert resources
    for resource in resources:
        if bridge_built:
            assert resource.get("process.pid") == result["pid"], resource  # it came from the child
        else:
            assert "process.pid" not in resource, resource  # the application's resource has none
        assert {k: resource.get(k) for k in expected} == expected, resource


# --------------------------------------------------------------------------------------------------------------
# OTLP from the environment
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_otel_env_alone_exports_every_signal_at_exit(rx: OtlpReceiver, transport: str) -> None:
    child = run_child("default", exporting_to(rx, transport))

    assert rx.wait_for(everything_arrived, timeout=DELIVERY_WAIT), rx.requests
    assert_logs(rx, child.result, transport)
    assert_span(rx, child.result, transport)
    assert_metrics(rx, transport)
    assert_resources(rx, child.result, **{"service.name": "torchelastic", "telemetry.sdk.language": "python"})
    assert "torchelastic_otel" not in child.stderr  # no warning, nothing dropped


def test_flush_then_os_exit_delivers_everything(rx: OtlpReceiver) -> None:
    """``os._exit`` runs no atexit handler: an explicit ``torchelastic_otel.flush()`` must deliver it all."""
    child = run_child("flush_exit", exporting_to(rx, "grpc"))
    assert child.result["flushed"] is True
    # The child is gone, so whatever is here was delivered by flush() itself.
    assert everything_arrived(rx), rx.requests
    assert_logs(rx, child.result, "grpc")
    assert_span(rx, child.result, "grpc")
    assert_metrics(rx, "grpc")


@pytest.mark.parametrize(
    "otel, expected",
    [
        pytest.param(
            {
                "OTEL_SERVICE_NAME": "myjob",
                "OTEL_RESOURCE_ATTRIBUTES": "team=ml,deployment.environment=dev,service.name=ignored",
                "TORCHELASTIC_RUN_ID": "job-42",
                "ROLE_NAME": "trainer",
                "RANK": "3",
                "LOCAL_RANK": "1",
                "WORLD_SIZE": "4",
            },
            {
                "service.name": "myjob",
                "team": "ml",
                "deployment.environment": "dev",
                "torchelastic.run_id": "job-42",
                "torchelastic.role": "trainer",
                "torchelastic.rank": 3,
                "torchelastic.local_rank": 1,
                "torchelastic.world_size": 4,
                "torchelastic.process.kind": "worker",
            },
            id="service_name+resource_attributes+torchrun",
        ),
        pytest.param(
            {"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attributes,team=ml"},
            {"service.name": "from-attributes", "team": "ml"},
            id="service_name_in_resource_attributes",
        ),
        pytest.param(
            # torchrun's environment never overrides what OTEL_RESOURCE_ATTRIBUTES says explicitly
            {"OTEL_RESOURCE_ATTRIBUTES": "torchelastic.role=explicit", "ROLE_NAME": "trainer"},
            {"service.name": "torchelastic", "torchelastic.role": "explicit"},
            id="resource_attributes_win_over_torchrun",
        ),
    ],
)
def test_resource_from_environment(rx: OtlpReceiver, otel: dict[str, str], expected: dict[str, Any]) -> None:
    child = run_child(
        "default",
        exporting_to(
            rx,
            "http",
            OTEL_METRIC_EXPORT_INTERVAL="500",
            OTEL_BLRP_SCHEDULE_DELAY="200",
            OTEL_BSP_SCHEDULE_DELAY="200",
            **otel,
        ),
    )
    assert rx.wait_for(everything_arrived, timeout=DELIVERY_WAIT), rx.requests
    assert_resources(rx, child.result, **expected)


def test_per_signal_variables() -> None:
    """``OTEL_EXPORTER_OTLP_{LOGS,METRICS}_*`` override the general protocol and endpoint for their signal only."""
    with OtlpReceiver() as rx, OtlpReceiver() as metrics_rx:
        env = exporting_to(
            rx,
            "grpc",
            OTEL_EXPORTER_OTLP_LOGS_PROTOCOL="http/protobuf",
            OTEL_EXPORTER_OTLP_LOGS_ENDPOINT=f"{rx.http_endpoint}/v1/logs",  # per-signal URLs are used as is
            OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=metrics_rx.grpc_endpoint,
        )
        child = run_child("default", env)

        assert rx.wait_for(lambda r: signal_arrived(r, "logs") and signal_arrived(r, "traces"), DELIVERY_WAIT)
        assert metrics_rx.wait_for(lambda r: signal_arrived(r, "metrics"), DELIVERY_WAIT), metrics_rx.requests
        assert {r["transport"] for r in rx.logs()} == {"http"}
        assert {s["transport"] for s in rx.spans()} == {"grpc"}
        assert_logs(rx, child.result, "http")
        assert_metrics(metrics_rx, "grpc")
        assert rx.requests["metrics"] == 0
        assert metrics_rx.requests["logs"] == metrics_rx.requests["traces"] == 0


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_headers_reach_the_receiver_and_are_not_printed(rx: OtlpReceiver, transport: str) -> None:
    child = run_child(
        "default", exporting_to(rx, transport, OTEL_EXPORTER_OTLP_HEADERS=f"authorization=Bearer {SECRET}")
    )

    assert rx.wait_for(everything_arrived, timeout=DELIVERY_WAIT), rx.requests
    requests = rx.raw_requests()
    assert {r.signal for r in requests} == {"logs", "traces", "metrics"}
    for request in requests:
        assert request.headers.get("authorization") == f"Bearer {SECRET}", (request.signal, request.transport)
    assert SECRET not in child.stdout
    assert SECRET not in child.stderr


def _json_documents(text: str) -> list[Any]:
    """Every top-level JSON object in ``text`` (the console exporters print indented JSON, one after another)."""
    decoder = json.JSONDecoder()
    docs, index = [], 0
    while True:
        start = text.find("{", index)
        if start < 0:
            return docs
        try:
            doc, end = decoder.raw_decode(text, start)
        except ValueError:
            index = start + 1
            continue
        docs.append(doc)
        index = end


def test_console_exporters(rx: OtlpReceiver) -> None:
    # The OTLP endpoint is set too, to show the console exporters replace OTLP rather than add to it.
    env = exporting_to(
        rx, "grpc", OTEL_TRACES_EXPORTER="console", OTEL_METRICS_EXPORTER="console", OTEL_LOGS_EXPORTER="console"
    )
    child = run_child("default", env)

    docs = _json_documents(child.stdout)
    logs = {d["event_name"]: d for d in docs if "event_name" in d}
    assert set(EVENT_NAMES) <= set(logs), child.stdout[:2000]
    failed = logs["torchelastic.worker.status.FAILED"]
    assert failed["severity_text"] == "ERROR"
    assert failed["attributes"]["exception.type"] == "ValueError"
    assert failed["trace_id"] == "0x" + child.result["trace_id"]
    assert failed["resource"]["attributes"]["service.name"] == "torchelastic"

    spans = [d for d in docs if d.get("name") == SPAN_NAME and "events" in d]
    assert len(spans) == 1
    assert [e["name"] for e in spans[0]["events"]] == list(EVENT_NAMES)

    metric_names = {
        m["name"]
        for d in docs
        for rm in d.get("resource_metrics", [])
        for sm in rm["scope_metrics"]
        for m in sm["metrics"]
    }
    assert set(METRIC_NAMES) <= metric_names, metric_names
    assert not rx.wait_for(lambda r: any(r.requests.values()), timeout=ABSENCE_WAIT), rx.requests


@pytest.mark.parametrize("disabled", ["traces", "metrics", "logs"])
def test_none_exporter_disables_only_its_signal(rx: OtlpReceiver, disabled: str) -> None:
    env_var = {"traces": "OTEL_TRACES_EXPORTER", "metrics": "OTEL_METRICS_EXPORTER", "logs": "OTEL_LOGS_EXPORTER"}
    run_child("default", exporting_to(rx, "grpc", **{env_var[disabled]: "none"}))

    others = [s for s in ("traces", "metrics", "logs") if s != disabled]
    assert rx.wait_for(lambda r: all(signal_arrived(r, s) for s in others), timeout=DELIVERY_WAIT), rx.requests
    assert not rx.wait_for(lambda r: r.requests[disabled] > 0, timeout=ABSENCE_WAIT), rx.requests
    if disabled == "traces":
        # Spans are still recorded (only not exported), so logs keep their trace context.
        assert all(r["trace_id"] for r in rx.logs())


@pytest.mark.parametrize("value", ["true", "TRUE"])
def test_sdk_disabled_exports_nothing(rx: OtlpReceiver, value: str) -> None:
    child = run_child("default", exporting_to(rx, "grpc", OTEL_SDK_DISABLED=value))
    # The child exited (and would have flushed at exit): anything it sent is already here, or on its way.
    assert not rx.wait_for(lambda r: any(r.requests.values()), timeout=ABSENCE_WAIT), rx.requests
    assert child.result["trace_id"] == "0" * 32  # no-op providers: the application's span is not recorded either
    assert "Traceback" not in child.stderr


# --------------------------------------------------------------------------------------------------------------
# Providers the application set, and setup()
# --------------------------------------------------------------------------------------------------------------


def test_existing_providers_are_reused(rx: OtlpReceiver) -> None:
    child = run_child("existing", exporting_to(rx, "grpc"))
    result = child.result
    assert result["same_tracer_provider"] is True  # get_pipeline().tracer_provider is trace.get_tracer_provider()
    assert result["app_meter_provider"] is True
    assert result["app_logger_provider"] is True
    assert result["owned"] == {}  # the bridge built (and will shut down) nothing

    assert rx.wait_for(everything_arrived, timeout=DELIVERY_WAIT), rx.requests
    assert_logs(rx, result, "grpc")
    assert_span(rx, result, "grpc")
    assert_metrics(rx, "grpc")
    # Only the application's resource: the bridge built no provider of its own.
    assert_resources(rx, result, bridge_built=False, **{"app.owner": "me", "service.name": "my-app"})


def test_existing_tracer_provider_reused_others_built(rx: OtlpReceiver) -> None:
    child = run_child("existing_tracer", exporting_to(rx, "grpc"))
    result = child.result
    assert result["same_tracer_provider"] is True
    assert result["same_meter_provider"] is True and result["same_logger_provider"] is True  # set globally
    assert result["owned"] == {"traces": False, "metrics": True, "logs": True}

    assert rx.wait_for(everything_arrived, timeout=DELIVERY_WAIT), rx.requests
    assert_logs(rx, result, "grpc")  # the log records carry the application's span context
    assert_span(rx, result, "grpc")
    assert_metrics(rx, "grpc")
    span = rx.spans(SPAN_NAME)[0]
    assert (span["resource"]["app.owner"], span["resource"]["service.name"]) == ("me", "my-app")
    for item in (*rx.logs(), *rx.metric_points()):
        assert item["resource"]["service.name"] == "torchelastic"
        assert "app.owner" not in item["resource"]


def test_setup_with_explicit_providers(rx: OtlpReceiver) -> None:
    # OTEL_* points at the receiver: with explicit providers the bridge must not build (or export to) its own.
    child = run_child("setup", exporting_to(rx, "grpc"))
    result = child.result
    assert result["flushed"] is True
    assert result["pipeline_is_explicit"] is True and result["same_as_get_pipeline"] is True
    assert result["spans"] == [SPAN_NAME]
    assert result["span_events"] == list(EVENT_NAMES)
    assert result["log_event_names"] == list(EVENT_NAMES)
    assert set(METRIC_NAMES) <= set(result["metric_names"])
    # setup() leaves the global providers alone
    assert result["global_tracer_provider"] == "ProxyTracerProvider"
    assert result["global_meter_provider"] == "_ProxyMeterProvider"
    assert result["global_logger_provider"] == "ProxyLoggerProvider"
    assert not rx.wait_for(lambda r: any(r.requests.values()), timeout=ABSENCE_WAIT), rx.requests


# --------------------------------------------------------------------------------------------------------------
# Prometheus
# --------------------------------------------------------------------------------------------------------------


def scrape(port: int, timeout: float = 10.0) -> dict[str, list[Any]]:
    """``/metrics`` of 127.0.0.1:port as {sample name: [samples]}; retries connection errors until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                text = response.read().decode()
            break
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            if time.monotonic() >= deadline:
                raise AssertionError(f"nothing serves 127.0.0.1:{port}: {exc}") from exc
            time.sleep(0.05)  # poll interval while the port is not yet listening; bounded by the deadline
    samples: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def sample(samples: dict[str, list[Any]], name: str, **labels: str) -> Any:
    matching = [s for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(matching) == 1, f"{name}{labels}: {matching or sorted(samples)}"
    return matching[0]


#: Prometheus name of each default instrument, as this exporter version writes it (docs/metrics.md documents these).
PROMETHEUS_NAMES = {
    "torchelastic.function.calls": "torchelastic_function_calls_total",
    "torchelastic.function.duration": "torchelastic_function_duration_seconds",  # _bucket/_count/_sum
    "torchelastic.workers.remaining_restarts": "torchelastic_workers_remaining_restarts",
    "torchelastic.workers.flakiness": "torchelastic_workers_flakiness_percent",
    "torchelastic.workers.state.observations": "torchelastic_workers_state_observations_total",
    "torchelastic.workers.runs": "torchelastic_workers_runs_total",
    "torchelastic.workers.run_outcomes": "torchelastic_workers_run_outcomes_total",
    "torchelastic.workers.{metric}": "torchelastic_workers_restart_count",  # e.g. workers.default.restart_count
    "{name} of a *.ms metric": "data_load_seconds",  # data_load.ms -> histogram
    "{name} of a *.count metric": "tokens_count_total",
    "{name} (any other metric)": "queue_depth",
    "torchelastic_otel.dropped": "torchelastic_otel_dropped_total",
    "torchelastic_otel.sanitized": "torchelastic_otel_sanitized_total",
}


def test_prometheus_exporter_serves_every_default_instrument() -> None:
    port = free_port()
    with popen_child("prometheus", prometheus_env(port)) as proc:
        result = read_result(proc)
        # The first scrape already sees every value put before it (a collection drains the bridge's buffer).
        samples = scrape(port)

        role = {"metric_group": "torchelastic", "role": "default"}
        for outcome in ("success", "failure"):
            calls = sample(samples, "torchelastic_function_calls_total", function=PROF_FUNCTION, outcome=outcome)
            assert calls.value == 1
        prof = {"function": PROF_FUNCTION, "metric_group": "app"}
        assert sample(samples, "torchelastic_function_duration_seconds_count", **prof).value == 2
        rdzv = {"function": "SimpleElasticAgent._rendezvous", "metric_group": "torchelastic"}
        assert sample(samples, "torchelastic_function_duration_seconds_sum", **rdzv).value == 1.5
        assert sample(samples, "torchelastic_function_duration_seconds_count", **rdzv).value == 1
        assert sample(samples, "torchelastic_function_duration_seconds_bucket", le="2.5", **rdzv).value == 1
        assert sample(samples, "torchelastic_function_duration_seconds_bucket", le="1.0", **rdzv).value == 0
        assert sample(samples, "torchelastic_workers_remaining_restarts", **role).value == 3
        assert sample(samples, "torchelastic_workers_flakiness_percent", **role).value == 25
        assert sample(samples, "torchelastic_workers_state_observations_total", state="healthy", **role).value == 1
        assert sample(samples, "torchelastic_workers_runs_total", **role).value == 1
        outcome = sample(samples, "torchelastic_workers_run_outcomes_total", outcome="success_no_retries", **role)
        assert outcome.value == 1
        assert sample(samples, "torchelastic_workers_restart_count", **role).value == 2
        assert sample(samples, "data_load_seconds_sum", metric_group="torchelastic").value == 0.25
        assert sample(samples, "tokens_count_total", metric_group="torchelastic").value == 4096
        assert sample(samples, "queue_depth", metric_group="torchelastic").value == 5
        assert sample(samples, "loss", metric_group="app").value == 0.25
        dropped = sample(samples, "torchelastic_otel_dropped_total", signal="metrics", reason="non_numeric_value")
        assert dropped.value == 1
        sanitized = sample(samples, "torchelastic_otel_sanitized_total", signal="logs", reason="bytes_decoded")
        assert sanitized.value == 1
        target = sample(samples, "target_info")
        assert target.labels["service_name"] == "torchelastic"
        assert target.labels["process_pid"] == str(result["pid"])
        # every name in the documented table is served
        for name in PROMETHEUS_NAMES.values():
            assert name in samples or f"{name}_count" in samples, name

        finish(proc)


def test_prometheus_port_offset_per_local_rank() -> None:
    """Workers serve on base + 1 + LOCAL_RANK, so two workers of one node both serve."""
    base = free_port_block(3)
    with contextlib.ExitStack() as stack:
        procs = {
            rank: stack.enter_context(popen_child("prometheus", prometheus_env(base, LOCAL_RANK=str(rank))))
            for rank in (0, 1)
        }
        pids = {rank: read_result(proc)["pid"] for rank, proc in procs.items()}
        for rank in (0, 1):
            samples = scrape(base + 1 + rank)
            target = sample(samples, "target_info")
            assert target.labels["process_pid"] == str(pids[rank])
            assert target.labels["torchelastic_local_rank"] == str(rank)
            assert sample(samples, "torchelastic_workers_remaining_restarts", role="default").value == 3
        for proc in procs.values():
            _out, err = finish(proc)
            assert "could not start" not in err


# --------------------------------------------------------------------------------------------------------------
# Bad configuration
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "otel, lost, warning",
    [
        pytest.param({"OTEL_METRICS_EXPORTER": "doesnotexist"}, {"metrics"}, "doesnotexist", id="unknown_exporter"),
        pytest.param(
            {"OTEL_TRACES_EXPORTER": "otlp,doesnotexist"}, set(), "doesnotexist", id="unknown_beside_a_good_one"
        ),
        pytest.param({"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "bogus"}, {"metrics"}, "bogus", id="bad_signal_protocol"),
        pytest.param(
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"},
            {"traces", "metrics", "logs"},
            "carrier-pigeon",
            id="bad_protocol",
        ),
    ],
)
def test_bad_configuration_costs_only_what_it_names(
    rx: OtlpReceiver, otel: dict[str, str], lost: set[str], warning: str
) -> None:
    child = run_child("default", exporting_to(rx, "grpc", **otel))  # exits 0
    assert warning in child.stderr  # said so, once, on stderr
    assert "Traceback" not in child.stderr

    kept = [s for s in ("traces", "metrics", "logs") if s not in lost]
    assert rx.wait_for(lambda r: all(signal_arrived(r, s) for s in kept), timeout=DELIVERY_WAIT), rx.requests
    if "logs" in kept:
        assert_logs(rx, child.result, "grpc")
    assert not rx.wait_for(lambda r: any(r.requests[s] for s in lost), timeout=ABSENCE_WAIT), rx.requests


def test_prometheus_port_taken_keeps_the_other_metric_exporter(rx: OtlpReceiver) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        env = exporting_to(
            rx,
            "grpc",
            OTEL_METRICS_EXPORTER="prometheus,otlp",
            OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
            OTEL_EXPORTER_PROMETHEUS_PORT=str(taken.getsockname()[1]),
        )
        child = run_child("default", env)
    assert "prometheus" in child.stderr and "could not start" in child.stderr
    assert rx.wait_for(everything_arrived, timeout=DELIVERY_WAIT), rx.requests
    assert_metrics(rx, "grpc")
