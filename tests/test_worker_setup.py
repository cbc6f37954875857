"""A torchrun worker sets up its exporters off its start-up path (``pipeline.defer``).

Each test starts a real interpreter with torchrun's worker environment and the bridge's bootstrap
``sitecustomize`` (exactly what a bridged agent gives its workers), exporting over real OTLP/gRPC to a receiver on
127.0.0.1, and checks at the receiver:

- before the training script's first line, neither the SDK nor an exporter is imported, yet the global providers
  are the bridge's: a span the script starts right away is exported, with the worker's resource;
- what sets the pipeline up: the first telemetry (drained by the background drainer), an explicit flush, the exit,
  or at the latest ``TORCHELASTIC_OTEL_SETUP_DELAY_MILLIS`` after start-up for a worker that records nothing --
  the ``torchelastic.worker.start`` span arrives in every case;
- an application that sets its own tracer provider during start-up gets the bridge's telemetry in it;
- with a Prometheus exporter nothing is deferred: the endpoint is up when the script starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.otlp_receiver import OtlpReceiver
from torchelastic_otel import _compat
from torchelastic_otel._install import AUTO_INSTALL_ENV, BOOTSTRAP_DIR

#: Whether workers defer their set-up: not where no thread starts at exit (CPython 3.12.0-3.12.1), since a deferred
#: pipeline could not be built there; a worker then sets up at once (the same interpreter runs the workers here).
DEFERS = _compat.threads_start_at_exit()
deferring = pytest.mark.skipif(not DEFERS, reason="this Python starts no thread at exit: workers set up at once")

pytest.importorskip("torch.distributed.elastic.events")

ROOT = Path(__file__).resolve().parent.parent
RUN_ID = "deferred-setup"
TIMEOUT = 90


def worker_env(rx: OtlpReceiver | None, **overrides: str) -> dict[str, str]:
    """torchrun's worker environment, the bridge's bootstrap, OTLP/gRPC to ``rx``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TORCHELASTIC_", "TRACEPARENT"))}
    env.update(
        RANK="1", LOCAL_RANK="1", GROUP_RANK="0", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", ROLE_NAME="trainer",
        TORCHELASTIC_RUN_ID=RUN_ID, TORCHELASTIC_RESTART_COUNT="0", OTEL_BSP_SCHEDULE_DELAY="100",
        OTEL_BLRP_SCHEDULE_DELAY="100", TRACEPARENT="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        PYTHONPATH=os.pathsep.join(p for p in (BOOTSTRAP_DIR, str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        **{AUTO_INSTALL_ENV: "1"},
    )  # fmt: skip
    if rx is not None:
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT=rx.grpc_endpoint, OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                   OTEL_EXPORTER_OTLP_INSECURE="true")  # fmt: skip
    env.update(overrides)
    return env


def run(code: str, env: dict[str, str]) -> dict[str, Any]:
    """Run ``code`` (which prints one JSON line last) in a worker interpreter; its parsed last line."""
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                            timeout=TIMEOUT, stdin=subprocess.DEVNULL)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


#: What the worker's script sees at its first line.
FIRST_LINE = r"""
import json, sys
from opentelemetry import trace
first_line = {
    "installed": __import__("torchelastic_otel").is_installed(),
    "sdk": "opentelemetry.sdk.trace" in sys.modules,
    "grpc": "grpc" in sys.modules,
    "exporter": any(m.startswith("opentelemetry.exporter.otlp") for m in sys.modules),
}
"""


def run_until_received(code: str, env: dict[str, str], rx: OtlpReceiver, what: Any) -> tuple[dict[str, Any], bool]:
    """Run ``code`` in a worker interpreter that stays alive (reading its stdin) until ``what(rx)`` holds at the
    receiver (or 30 s pass), then ends with ``os._exit``: no flush, no exit handler, so what arrived was sent by
    the bridge's background threads. Returns the child's JSON line and whether ``what`` held."""
    code += "\nsys.stdin.read()\nprint(json.dumps(first_line), flush=True)\nimport os\nos._exit(0)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        arrived = rx.wait_for(what, timeout=30)
        out, err = proc.communicate("", timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1]), arrived


def worker_start(rx: OtlpReceiver) -> list[dict[str, Any]]:
    return [s for s in rx.spans("torchelastic.worker.start") if s["resource"].get("torchelastic.run_id") == RUN_ID]


@deferring
def test_start_up_imports_no_sdk_and_a_span_started_at_once_is_exported() -> None:
    code = FIRST_LINE + r"""
with trace.get_tracer("app").start_as_current_span("app.first"):
    pass
first_line["sdk_after_first_span"] = "opentelemetry.sdk.trace" in sys.modules
print(json.dumps(first_line))
"""
    with OtlpReceiver() as rx:
        got = run(code, worker_env(rx))  # a normal exit: the exit handler flushes
        assert got == {"installed": True, "sdk": False, "grpc": False, "exporter": False,
                       "sdk_after_first_span": True}  # fmt: skip
        assert rx.wait_for(lambda r: r.spans("app.first") and worker_start(r), timeout=30)
        app = rx.spans("app.first")[0]
        assert app["resource"]["torchelastic.rank"] == 1 and app["resource"]["torchelastic.run_id"] == RUN_ID
        assert app["trace_id"] == "0af7651916cd43dd8448eb211c80319c"  # a child of the agent's attempt span
        start = worker_start(rx)[0]
        assert start["parent_span_id"] == "b7ad6b7169203331"
        assert start["end_time_unix_nano"] >= start["start_time_unix_nano"] > 0


@deferring
def test_first_telemetry_sets_the_pipeline_up_in_the_background() -> None:
    """The drainer moves the first event (0.5 s rounds) and builds the pipeline for it; the script never waits."""
    code = FIRST_LINE + r"""
from torch.distributed.elastic import events
events.record(events.Event("trainer.started", events.EventSource.WORKER, metadata={"rank": 1}), destination="otel")
first_line["sdk_after_record"] = "opentelemetry.sdk.trace" in sys.modules
"""
    with OtlpReceiver() as rx:
        arrived_both = lambda r: r.logs("trainer.started") and worker_start(r)  # noqa: E731
        got, arrived = run_until_received(code, worker_env(rx), rx, arrived_both)
        assert got["sdk"] is False and got["sdk_after_record"] is False  # recording costs the script no set-up
        assert arrived, (rx.requests, got)
        assert rx.logs("trainer.started")[0]["resource"]["torchelastic.rank"] == 1


@deferring
def test_a_worker_that_records_nothing_is_set_up_after_the_delay() -> None:
    code = FIRST_LINE
    with OtlpReceiver() as rx:
        env = worker_env(rx, TORCHELASTIC_OTEL_SETUP_DELAY_MILLIS="300")
        got, arrived = run_until_received(code, env, rx, lambda r: len(worker_start(r)) == 1)
        assert got["sdk"] is False and arrived, rx.requests


@deferring
def test_an_application_provider_set_during_start_up_gets_the_bridges_telemetry() -> None:
    """Rule 1 of the pipeline holds with the deferred set-up: a provider the application sets is used."""
    code = FIRST_LINE + r"""
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
import torchelastic_otel
torchelastic_otel.flush()
first_line["app_spans"] = sorted(s.name for s in exporter.get_finished_spans())
first_line["same_provider"] = torchelastic_otel.get_pipeline().tracer_provider is provider
print(json.dumps(first_line))
"""
    got = run(code, worker_env(None, OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none",
                               OTEL_LOGS_EXPORTER="none"))  # fmt: skip
    assert got["app_spans"] == ["torchelastic.worker.start"] and got["same_provider"] is True


def test_nothing_is_deferred_with_a_prometheus_exporter() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        base = sock.getsockname()[1]
    port = base + 1 + 1  # the worker's port: base + 1 + LOCAL_RANK
    code = FIRST_LINE + rf"""
import urllib.request
first_line["status"] = urllib.request.urlopen("http://127.0.0.1:{port}/metrics", timeout=10).status
print(json.dumps(first_line))
import os
os._exit(0)
"""
    env = worker_env(None, OTEL_METRICS_EXPORTER="prometheus", OTEL_TRACES_EXPORTER="none",
                     OTEL_LOGS_EXPORTER="none", OTEL_EXPORTER_PROMETHEUS_PORT=str(base))  # fmt: skip
    got = run(code, env)
    assert got["sdk"] is True and got["status"] == 200


@pytest.mark.parametrize("record", [False, True], ids=["quiet", "one-event"])
def test_a_worker_that_exits_at_once_delivers_at_exit(record: bool) -> None:
    """A normal exit before anything set the pipeline up: it is built before the interpreter shuts down (whose
    thread pools refuse work by the time ``atexit`` handlers run), so the worker span and the event arrive."""
    code = FIRST_LINE
    if record:
        code += (
            "from torch.distributed.elastic import events\n"
            "events.record(events.Event('trainer.done', events.EventSource.WORKER), destination='otel')\n"
        )
    code += "print(json.dumps(first_line))\n"
    with OtlpReceiver() as rx:
        got = run(code, worker_env(rx))
        assert got["sdk"] is not DEFERS
        assert rx.wait_for(lambda r: worker_start(r) and (not record or r.logs("trainer.done")), timeout=30), (
            rx.requests
        )
