"""Providers the bridge builds and sets globally return from the plain API's ``force_flush()`` / ``shutdown()`` in
time when the collector is down, and count what they could not deliver; an application's own providers are never
wrapped. (The SDK's own calls wait for the OTLP exporter's retries: ~5-10 s each with a dead collector.)"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support import ROOT
from tests.support.env import clean_env, closed_endpoint, otlp_env

_CHILD = r"""
import json, time
from opentelemetry import _logs, metrics, trace
import torchelastic_otel
from torchelastic_otel import _selftelemetry as selftelemetry

torchelastic_otel.get_pipeline()  # builds the providers from OTEL_* and sets them globally
tracer = trace.get_tracer("user")
for i in range(100):
    tracer.start_span(f"step {i}").end()
logger = _logs.get_logger("user")
for i in range(100):
    logger.emit(body=f"line {i}")
metrics.get_meter("user").create_counter("user.steps").add(5)

times = {}
for name, provider in (("traces", trace.get_tracer_provider()), ("logs", _logs.get_logger_provider()),
                       ("metrics", metrics.get_meter_provider())):
    started = time.monotonic()
    ok = provider.force_flush()
    times[f"{name}.force_flush"] = [time.monotonic() - started, ok]
for name, provider in (("traces", trace.get_tracer_provider()), ("logs", _logs.get_logger_provider()),
                       ("metrics", metrics.get_meter_provider())):
    started = time.monotonic()
    provider.shutdown()
    times[f"{name}.shutdown"] = [time.monotonic() - started, None]
dropped = {}
for (kind, signal, reason), n in selftelemetry.snapshot("dropped").items():
    dropped[signal] = dropped.get(signal, 0) + n
print(json.dumps({"times": times, "dropped": dropped}))
"""

_APP_CHILD = r"""
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
import torchelastic_otel
mine = TracerProvider()
trace.set_tracer_provider(mine)
torchelastic_otel.get_pipeline()
print(type(trace.get_tracer_provider()) is TracerProvider and trace.get_tracer_provider() is mine)
"""


def _run(code: str, env: dict[str, str]) -> str:
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def test_plain_api_flush_and_shutdown_return_in_time_with_the_collector_down() -> None:
    batches_wait = {"OTEL_BSP_SCHEDULE_DELAY": "60000", "OTEL_BLRP_SCHEDULE_DELAY": "60000"}
    env = otlp_env(closed_endpoint(), pace=batches_wait, TORCHELASTIC_OTEL_EXIT_TIMEOUT_MILLIS="1000")
    got = json.loads(_run(_CHILD, env))
    for call, (seconds, ok) in got["times"].items():
        # The exit bound (1 s) plus scheduling slack on a loaded 2-core machine; the SDK alone takes 5-10 s.
        assert seconds < 3.0, (call, got)
        assert ok is not True or call.endswith("shutdown"), (call, got)  # a flush that delivered nothing says so
    assert got["dropped"].get("traces", 0) >= 100, got
    assert got["dropped"].get("logs", 0) >= 100, got


def test_an_applications_own_provider_is_not_wrapped() -> None:
    env = clean_env(OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none")
    assert _run(_APP_CHILD, env) == "True"
