"""Every private internal the bridge relies on (``torchelastic_otel._compat``), pinned: each test fails when a
release of CPython, OpenTelemetry or torch changes what the bridge reads or writes; the fallbacks are counted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from torchelastic_otel import _compat, _selftelemetry

ROOT = Path(__file__).resolve().parent.parent


def _child(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TORCHELASTIC_"))}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)  # fmt: skip


def test_thread_frames_has_every_thread() -> None:
    started, stop = threading.Event(), threading.Event()

    def parked() -> None:
        started.set()
        stop.wait(10)

    thread = threading.Thread(target=parked)
    thread.start()
    try:
        assert started.wait(10)
        frames = _compat.thread_frames()
        frame, names = frames[threading.get_ident()], []
        while frame is not None:
            names.append(frame.f_code.co_name)
            frame = frame.f_back
        assert "test_thread_frames_has_every_thread" in names
        assert thread.ident in frames
    finally:
        stop.set()
        thread.join(10)


def test_thread_frames_fallback_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    before = _selftelemetry.total(_selftelemetry.FALLBACK, reason="sys._current_frames")
    monkeypatch.delattr(sys, "_current_frames")
    assert _compat.thread_frames() == {}
    assert _selftelemetry.total(_selftelemetry.FALLBACK, reason="sys._current_frames") == before + 1


def test_default_disposition_from_another_thread_ends_the_process_by_the_signal() -> None:
    """``signal.signal`` works in the main thread only; libc's ``signal()`` sets SIG_DFL from the watcher thread,
    so the process dies of SIGTERM (-15, what torch's agent reports) with a Python handler installed."""
    code = (
        "import os, signal, threading, time\n"
        "from torchelastic_otel import _compat\n"
        "signal.signal(signal.SIGTERM, lambda *a: print('PYTHON HANDLER', flush=True))\n"
        "def die():\n"
        "    assert _compat.default_disposition(signal.SIGTERM)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "t = threading.Thread(target=die); t.start(); t.join()\n"
        "time.sleep(5)\n"
        "print('STILL ALIVE')\n"
    )
    result = _child(code)
    assert result.returncode == -signal.SIGTERM, (result.stdout, result.stderr[-2000:])
    assert "PYTHON HANDLER" not in result.stdout and "STILL ALIVE" not in result.stdout


def test_batch_queue_reads_the_sdk_batch_processors() -> None:
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
    from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    for processor in (
        BatchSpanProcessor(InMemorySpanExporter(), max_queue_size=7, max_export_batch_size=7, schedule_delay_millis=60000),
        BatchLogRecordProcessor(InMemoryLogRecordExporter(), max_queue_size=7, max_export_batch_size=7, schedule_delay_millis=60000),
    ):
        before = _selftelemetry.total(_selftelemetry.FALLBACK)
        state = _compat.batch_queue(processor)
        assert state is not None and (state.length, state.limit, state.shut_down) == (0, 7, False)
        processor.shutdown()
        state = _compat.batch_queue(processor)
        assert state is not None and state.shut_down
        assert _selftelemetry.total(_selftelemetry.FALLBACK) == before


def test_global_providers_are_where_the_bridge_reads_and_writes_them() -> None:
    code = (
        "from opentelemetry import _logs, metrics, trace\n"
        "from opentelemetry.sdk._logs import LoggerProvider\n"
        "from opentelemetry.sdk.metrics import MeterProvider\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from torchelastic_otel import _compat\n"
        "getters = {'traces': trace.get_tracer_provider, 'metrics': metrics.get_meter_provider,\n"
        "           'logs': _logs.get_logger_provider}\n"
        "for signal, get in getters.items():\n"
        "    assert _compat.global_provider(signal) is None, signal\n"
        "    assert _compat.is_proxy_provider(get()), signal\n"
        "    new = {'traces': TracerProvider, 'metrics': MeterProvider, 'logs': LoggerProvider}[signal]()\n"
        "    assert _compat.replace_global_provider(signal, None, new)\n"
        "    assert get() is new and _compat.global_provider(signal) is new, signal\n"
        "    assert not _compat.is_proxy_provider(new)\n"
        "    assert not _compat.replace_global_provider(signal, None, object())  # only where `old` is\n"
        "print('OK')\n"
    )
    result = _child(code)
    assert result.returncode == 0 and result.stdout.strip() == "OK", result.stderr[-3000:]


def test_metric_readers_of_an_sdk_meter_provider() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    assert _compat.metric_readers(MeterProvider(metric_readers=[reader])) == [reader]
    assert _compat.metric_readers(object()) is None
