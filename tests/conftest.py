"""Shared fixtures: an in-memory OpenTelemetry SDK pipeline and a clean slate of the bridge's global state.

The helpers the tests share are in ``tests/support``; each folder's ``conftest.py`` marks its tests (``jobs``,
``stack``: see ``[tool.pytest.ini_options]`` in ``pyproject.toml``).

Hypothesis profiles: ``full`` (Hypothesis's own settings: what ``make test`` and a plain ``pytest`` run) and ``fast``
(``make test-fast``: ``--hypothesis-profile=fast``), a tenth of the examples. A test that asks for its own number of
examples writes it as ``examples(n)``: ``n`` under ``full``, the loaded profile's share of it under another.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import torchelastic_otel
from tests.support.otel import KEEP_ALIVE, InMemoryOtel
from torchelastic_otel import events as te_events
from torchelastic_otel import pipeline
from torchelastic_otel._export import drainer as _drainer
from torchelastic_otel.metrics import api as te_metrics_api

# The test modules' bytecode, their assertions rewritten, is written beside them as pytest writes it by default, also
# where PYTHONDONTWRITEBYTECODE is set (as on the CI machines): otherwise every pytest process parses and rewrites
# every test file again, half of the time it takes to collect them. In this process only: the jobs the tests start
# keep the environment they were given.
sys.dont_write_bytecode = False

# "full": what Hypothesis loads by itself (its "default" profile, or "ci" where it detects CI); "fast": the same with a
# tenth of the examples.
FULL = settings.default  # the profile loaded when this module is imported (before any --hypothesis-profile)
settings.register_profile("full", FULL)
settings.register_profile("fast", FULL, max_examples=FULL.max_examples // 10)


def examples(n: int) -> int:
    """``n`` examples under the ``full`` profile; as many in proportion under the loaded one (``fast``: a tenth).

    Call it at import (in ``@settings(max_examples=...)``): pytest applies ``--hypothesis-profile`` before it
    imports the test modules."""
    return max(1, n * settings.default.max_examples // FULL.max_examples)


@pytest.fixture
def clean_state() -> Iterator[None]:
    """Restore the bridge's module-level routing state (metric handlers, event handlers and loggers) afterwards:
    each API's owner puts its own back."""
    with te_events._state_restored(), te_metrics_api._state_restored():
        yield


@pytest.fixture
def otel(clean_state: None) -> Iterator[InMemoryOtel]:
    """The bridge set up (``torchelastic_otel.setup``) with in-memory SDK providers; the pipeline is forgotten after."""
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    logs = InMemoryLogRecordExporter()
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    KEEP_ALIVE.extend((tracer_provider, meter_provider, logger_provider))
    torchelastic_otel.setup(
        tracer_provider=tracer_provider, meter_provider=meter_provider, logger_provider=logger_provider
    )
    try:
        yield InMemoryOtel(tracer_provider, meter_provider, logger_provider, spans, logs, reader)
    finally:
        pipeline._reset_for_tests()


@pytest.fixture
def paused_drainer() -> Iterator[Any]:
    """Suspend the background drainer so only flushes and collections move buffered values."""
    with _drainer.paused():
        yield _drainer
