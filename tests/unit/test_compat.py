"""Every private internal the bridge relies on (``torchelastic_otel._compat``), pinned: each test fails when a
release of CPython, OpenTelemetry or torch changes what the bridge reads or writes; the fallbacks are counted."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pytest

from tests.support import ROOT
from tests.support.env import clean_env
from torchelastic_otel import _compat
from torchelastic_otel import _selftelemetry as selftelemetry


def _child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean_env(), capture_output=True, text=True,
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
    before = selftelemetry.total(selftelemetry.FALLBACK, reason="sys._current_frames")
    monkeypatch.delattr(sys, "_current_frames")
    assert _compat.thread_frames() == {}
    assert selftelemetry.total(selftelemetry.FALLBACK, reason="sys._current_frames") == before + 1


@pytest.mark.jobs
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
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, InMemoryLogRecordExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    for processor in (
        BatchSpanProcessor(
            InMemorySpanExporter(), max_queue_size=7, max_export_batch_size=7, schedule_delay_millis=60000
        ),
        BatchLogRecordProcessor(
            InMemoryLogRecordExporter(), max_queue_size=7, max_export_batch_size=7, schedule_delay_millis=60000
        ),
    ):
        before = selftelemetry.total(selftelemetry.FALLBACK)
        state = _compat.batch_queue(processor)
        assert state is not None and (state.length, state.limit, state.shut_down) == (0, 7, False)
        processor.shutdown()
        state = _compat.batch_queue(processor)
        assert state is not None and state.shut_down
        assert selftelemetry.total(selftelemetry.FALLBACK) == before


@pytest.mark.jobs
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
    from opentelemetry.sdk.trace import TracerProvider

    before = selftelemetry.total(selftelemetry.FALLBACK)
    assert _compat.metric_readers(TracerProvider()) is None  # not a meter provider: no fallback to count
    assert selftelemetry.total(selftelemetry.FALLBACK) == before


def test_metric_readers_fallback_is_counted_for_an_sdk_provider_without_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.sdk.metrics import MeterProvider

    provider = MeterProvider()
    monkeypatch.setattr(provider, "_sdk_config", None)
    monkeypatch.setattr(provider, "_metric_readers", None, raising=False)  # SDK < 1.45: only _sdk_config
    before = selftelemetry.total(selftelemetry.FALLBACK, reason="MeterProvider._metric_readers")
    assert _compat.metric_readers(provider) is None
    assert selftelemetry.total(selftelemetry.FALLBACK, reason="MeterProvider._metric_readers") == before + 1


# ---- torch ----------------------------------------------------------------------------------------------------------


def test_torch_event_destinations_is_the_table_torch_reads() -> None:
    """What the bridge adds to the table is what torch's public ``get_logging_handler`` returns."""
    pytest.importorskip("torch")
    import logging

    import torch.distributed.elastic.events as torch_events

    table = _compat.torch_event_destinations()
    assert table is not None and {"console", "null", "dynamic_rendezvous"} <= set(table)
    marker = logging.NullHandler()
    table["compat-test"] = marker
    try:
        assert torch_events.get_logging_handler("compat-test") is marker
    finally:
        del table["compat-test"]


def test_torch_event_logger_is_where_torch_record_writes() -> None:
    pytest.importorskip("torch")
    import logging

    import torch.distributed.elastic.events as torch_events

    seen: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    before = selftelemetry.total(selftelemetry.FALLBACK)
    logger = _compat.torch_event_logger("null")
    capture = Capture()
    logger.addHandler(capture)
    try:
        torch_events.record(torch_events.Event("compat.event", torch_events.EventSource.WORKER), destination="null")
    finally:
        logger.removeHandler(capture)
    assert len(seen) == 1 and '"compat.event"' in seen[0]
    assert selftelemetry.total(selftelemetry.FALLBACK) == before


class _Recorder:
    """Calls ``name_of`` the way torch's rendezvous ``_record`` methods call ``get_method_name``: from a method
    that the recording method calls."""

    def __init__(self, name_of) -> None:  # type: ignore[no-untyped-def]
        self.name_of = name_of

    def _record(self, *depth: int) -> str:
        return f"{self.__class__.__name__}.{self.name_of(*depth)}"

    def next_rendezvous(self, *depth: int) -> str:
        return self._record(*depth)


@pytest.mark.parametrize("depth", [(), (0,), (1,), (2,), (3,), (4,), (200,), (-1,)])
def test_rdzv_method_name_gives_torchs_name(depth: tuple[int, ...]) -> None:
    """The frame-based ``get_method_name`` names what torch's names, at torch's default depth (2: the method that
    records, as in every ``_record`` of torch's rendezvous), at others, and past the stack's end."""
    pytest.importorskip("torch")
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    original = dynamic_rendezvous.get_method_name
    assert not getattr(original, "__torchelastic_otel__", False), "torch's own function, not the bridge's"
    before = selftelemetry.total(selftelemetry.FALLBACK)
    faster = _compat.rdzv_method_name(original)
    assert faster is not None and selftelemetry.total(selftelemetry.FALLBACK) == before
    expected = _Recorder(original).next_rendezvous(*depth)
    if depth and depth[0] < 0:
        assert _Recorder(faster).next_rendezvous(*depth) == expected
        return
    import inspect

    def no_stack(*args: object, **kwargs: object) -> None:
        raise AssertionError("inspect.stack() walked")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(inspect, "stack", no_stack)
        assert _Recorder(faster).next_rendezvous(*depth) == expected
    if not depth:
        assert expected == "_Recorder.next_rendezvous"


def test_rdzv_method_name_keeps_a_changed_function_counted() -> None:
    """A ``get_method_name`` that is not torch's known one (another default depth) is kept: ``None``, counted."""

    def get_method_name(depth=3):  # type: ignore[no-untyped-def]
        import inspect

        return inspect.stack()[depth].function

    before = selftelemetry.total(selftelemetry.FALLBACK, reason="torch dynamic_rendezvous.get_method_name")
    assert _compat.rdzv_method_name(get_method_name) is None
    assert selftelemetry.total(selftelemetry.FALLBACK, reason="torch dynamic_rendezvous.get_method_name") == before + 1


def _local_agent(max_restarts: int):  # type: ignore[no-untyped-def]
    """A real LocalElasticAgent (not started: no rendezvous, no workers), as torchrun builds one."""
    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous

    rdzv = StaticTCPRendezvous("127.0.0.1", 1, 0, 1, "compat-run", 5)
    spec = WorkerSpec(role="trainer", local_world_size=1, rdzv_handler=rdzv, entrypoint="true",
                      max_restarts=max_restarts)  # fmt: skip
    return LocalElasticAgent(spec, logs_specs=DefaultLogsSpecs()), spec


def test_agent_spec_and_remaining_restarts_of_a_real_agent() -> None:
    pytest.importorskip("torch")
    agent, spec = _local_agent(max_restarts=3)
    before = selftelemetry.total(selftelemetry.FALLBACK)
    assert _compat.agent_spec(agent) is spec
    assert _compat.agent_remaining_restarts(agent) == 3
    assert selftelemetry.total(selftelemetry.FALLBACK) == before
    assert _compat.agent_spec(object()) is None and _compat.agent_remaining_restarts(object()) is None
    assert selftelemetry.total(selftelemetry.FALLBACK) == before + 2


def test_every_agent_method_the_bridge_wraps_is_defined_by_torch() -> None:
    pytest.importorskip("torch")
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    from torchelastic_otel._torch.agent import lifecycle
    from torchelastic_otel._torch.patches import Patches

    patches = Patches()
    before = selftelemetry.total(selftelemetry.FALLBACK)
    lifecycle.install(patches, lambda data: None)
    try:
        wrapped = [(cls.__name__, name) for cls in (SimpleElasticAgent, LocalElasticAgent)
                   for name, value in vars(cls).items() if getattr(value, "__torchelastic_otel__", False)]  # fmt: skip
        assert len(wrapped) == 8, wrapped
        assert selftelemetry.total(selftelemetry.FALLBACK) == before
    finally:
        patches.restore()
    assert _compat.agent_method(LocalElasticAgent, "_no_such_method") is None
    assert selftelemetry.total(selftelemetry.FALLBACK) == before + 1


# ---- OpenTelemetry OTLP exporters -----------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_an_otlp_exporters_retry_warning_is_recognised(protocol: str) -> None:
    """A real OTLP exporter against a 127.0.0.1 port nobody listens on logs its retry warning, which the bridge
    must recognise (or it tells a down backend only by the slower stall timer)."""
    import logging
    import socket

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{port}", insecure=True, timeout=2)
    else:  # a server answering 503 (SDKs before 1.42 do not retry a refused HTTP connection)
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        unavailable = _unavailable_http_server()
        port = unavailable.server_address[1]
        exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=2)
    records: list[logging.LogRecord] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    capture = Capture(logging.DEBUG)
    root = logging.getLogger("opentelemetry")
    root.addHandler(capture)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        provider.get_tracer("compat").start_span("retried").end()
    finally:
        root.removeHandler(capture)
        provider.shutdown()
        if protocol == "http":
            unavailable.shutdown()
            unavailable.server_close()
    assert any(_compat.is_export_retry_log(r) for r in records), [r.getMessage() for r in records]


def _unavailable_http_server():  # type: ignore[no-untyped-def]
    """An HTTP server on 127.0.0.1 answering every POST with 503 (the test shuts it down)."""
    import http.server

    class Unavailable(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Unavailable)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# ---- OpenTelemetry SDK configuration -------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol, module", [("grpc", ".grpc."), ("http/protobuf", ".http.")])
def test_sdk_exporter_classes_resolve_otlp_by_protocol(
    monkeypatch: pytest.MonkeyPatch, protocol: str, module: str
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    before = selftelemetry.total(selftelemetry.FALLBACK)
    for kind in ("traces", "metrics", "logs"):
        classes = _compat.sdk_exporter_classes(kind, "otlp")
        assert len(classes) == 1 and module in next(iter(classes.values())).__module__, classes
        # The fallback resolves the same class through the entry points.
        assert _compat._exporter_entry_point(kind, "otlp") is next(iter(classes.values()))
    assert "console" in str(_compat.sdk_exporter_classes("traces", "console")).lower()
    assert selftelemetry.total(selftelemetry.FALLBACK) == before
    # the type is the SDK's private helper's (RuntimeError now; the fallback's ValueError): the contract is "raises"
    with pytest.raises(Exception):  # noqa: B017
        _compat.sdk_exporter_classes("traces", "no_such_exporter")


def test_sdk_sampler_and_id_generator_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
    from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    sampler = _compat.sdk_sampler()
    assert isinstance(sampler, TraceIdRatioBased) and sampler.rate == 0.25
    monkeypatch.setenv("OTEL_PYTHON_ID_GENERATOR", "random")
    assert isinstance(_compat.sdk_id_generator(), RandomIdGenerator)


def test_sdk_configuration_fallbacks_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk._configuration", None)  # as if a release moved it
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
    before = selftelemetry.total(selftelemetry.FALLBACK)
    classes = _compat.sdk_exporter_classes("traces", "otlp")
    assert ".http." in next(iter(classes.values())).__module__
    assert _compat.sdk_sampler() is None and _compat.sdk_id_generator() is None
    assert selftelemetry.total(selftelemetry.FALLBACK) == before + 3


def test_every_dataloader_iterator_inherits_the_wrapped_next() -> None:
    """The input phase wraps one ``__next__``: the base class's, which torch's two iterators must inherit (a
    release that gives one its own ``__next__`` would take the input phase away from it: this fails)."""
    dataloader = pytest.importorskip("torch.utils.data.dataloader")
    cls = _compat.dataloader_iter_class(dataloader)
    assert cls is dataloader._BaseDataLoaderIter
    for iterator in (dataloader._SingleProcessDataLoaderIter, dataloader._MultiProcessingDataLoaderIter):
        assert issubclass(iterator, cls) and "__next__" not in iterator.__dict__


def test_a_dataloader_without_the_base_iterator_is_a_counted_fallback() -> None:
    reason = "torch dataloader._BaseDataLoaderIter.__next__"
    before = selftelemetry.total(selftelemetry.FALLBACK, reason=reason)
    assert _compat.dataloader_iter_class(object()) is None
    assert selftelemetry.total(selftelemetry.FALLBACK, reason=reason) == before + 1


def test_caller_module_names_the_module_of_a_frame_above() -> None:
    """``checkpoints`` tells torch's own calls (off the main thread) from the user's by the caller's module."""

    def inner() -> str | None:
        return _compat.caller_module(1)  # 0: inner, 1: this test

    assert inner() == __name__
    assert _compat.caller_module(10_000) is None  # past the top of the stack


def test_caller_frame_is_the_frame_above() -> None:
    """``_torch.tracebacks`` takes a wrapper's entry off a traceback only where it is the calling frame's."""

    def inner() -> object:
        return _compat.caller_frame(1)  # 0: inner, 1: this test

    assert inner() is sys._getframe()
    assert _compat.caller_frame(10_000) is None  # past the top of the stack


def test_reraised_traceback_sets_the_traceback_of_the_exception_being_handled() -> None:
    """``PyErr_SetExcInfo`` (3.10's way for ``_torch.tracebacks``): what ``sys.exc_info()`` gives in the ``except``
    block is the new traceback, on every version; no reference is gained or lost."""

    def fail() -> None:
        raise ValueError("failed")

    before = selftelemetry.total(selftelemetry.FALLBACK, reason="PyErr_SetExcInfo")
    try:
        fail()
    except ValueError as exc:
        tb = exc.__traceback__
        assert tb is not None and tb.tb_next is not None
        exc.__traceback__ = tb.tb_next
        references = sys.getrefcount(exc), sys.getrefcount(tb) + sys.getrefcount(tb.tb_next)
        assert _compat.reraised_traceback(exc, tb.tb_next)
        assert sys.exc_info()[1] is exc and sys.exc_info()[2] is tb.tb_next
        # (3.10: the exception being handled holds the new traceback in place of the old one)
        assert (sys.getrefcount(exc), sys.getrefcount(tb) + sys.getrefcount(tb.tb_next)) == references
    assert selftelemetry.total(selftelemetry.FALLBACK, reason="PyErr_SetExcInfo") == before
