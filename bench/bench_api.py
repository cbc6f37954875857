"""Micro-benchmark of the bridge's hot paths against torch's defaults and the raw OpenTelemetry SDK.

``make bench`` runs it (``.venv/bin/python bench/bench_api.py``). It is a report, not a test: it exits 0 even
when a target is missed; look for FAIL. Everything runs in one process. Each figure is ns per call: N calls
timed with ``time.perf_counter_ns``, REPEATS times after a warm-up, median reported. The variants of a section
are timed in turns (A B C, A B C, ...) so that load from other processes hits them alike. The loop overhead
(printed) is included in every figure.

  a. metric  bridge ``metrics.put_metric`` with ``OtelMetricHandler``  vs torch's null ``put_metric``
             vs the SDK's ``Histogram.record``
  b. event   bridge ``events.record(event, "otel")``  vs torch's ``record(event, "null")``  vs SDK ``Logger.emit``
  c. rdzv    bridge ``construct_and_record_rdzv_event`` -> OtelLoggingHandler
             vs torch's, with a ``StreamHandler`` on an ``io.StringIO`` as its "dynamic_rendezvous" handler

The bridge defers work: ``put_metric`` and ``record`` append to buffers that a background thread drains into the
SDK every 0.5 s (converting events to log records there), and the SDK's batch processors export. So the "+ drain" /
"+ flush" rows time that deferred work too (N calls, then ``handler.drain()`` / ``torchelastic_otel.flush()``,
divided by N), and the run checks that every metric value and every log record arrived.
"""

from __future__ import annotations

import collections
import datetime
import gc
import io
import json
import logging
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

REPEATS = 7
N_METRIC = 10_000
N_EVENT = 1_000
N_RDZV = 100
RDZV_DEPTH = 10  # ordinary Python frames between the benchmark loop and the rendezvous call

STARTED = time.monotonic()
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # torch's CPU wheel without numpy

import torch  # noqa: E402
import torch.distributed.elastic.events as torch_events  # noqa: E402
import torch.distributed.elastic.events.handlers as torch_event_handlers  # noqa: E402
import torch.distributed.elastic.metrics as torch_metrics  # noqa: E402
from opentelemetry.sdk._logs import LoggerProvider  # noqa: E402
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, LogRecordExporter, LogRecordExportResult  # noqa: E402
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402

import torchelastic_otel  # noqa: E402
from torchelastic_otel import events, metrics  # noqa: E402
from torchelastic_otel.events import _otel as event_adapter  # noqa: E402
from torchelastic_otel.events import handlers as bridge_event_handlers  # noqa: E402


class CountingNullExporter(LogRecordExporter):
    """Discards each batch at once, counting records per instrumentation scope (to check nothing was lost)."""

    def __init__(self) -> None:
        self.by_scope: collections.Counter[str] = collections.Counter()

    def export(self, batch):  # type: ignore[no-untyped-def]
        for item in batch:
            self.by_scope[item.instrumentation_scope.name] += 1
        return LogRecordExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


# ---- timing ----------------------------------------------------------------------------------------------------


@dataclass
class Case:
    label: str
    loop: Callable[[int], Any]  # runs the call k times
    after: Callable[[], Any] | None = None  # timed after the loop (the deferred work), counted per call
    between: Callable[[], Any] | None = None  # untimed, after each run
    ns: float = 0.0


def run_cases(cases: list[Case], n: int, warmup: int) -> None:
    """Time the cases in turns, REPEATS rounds; store the median ns/call in each case."""
    for case in cases:
        case.loop(warmup)
        for hook in (case.after, case.between):
            if hook is not None:
                hook()
    samples: dict[int, list[float]] = {i: [] for i in range(len(cases))}
    gc.collect()
    for _ in range(REPEATS):
        for i, case in enumerate(cases):
            gc.collect(1)  # young generations only: a full collection takes ~0.1 s with torch imported
            t0 = time.perf_counter_ns()
            case.loop(n)
            if case.after is not None:
                case.after()
            samples[i].append((time.perf_counter_ns() - t0) / n)
            if case.between is not None:
                case.between()
    for i, case in enumerate(cases):
        case.ns = statistics.median(samples[i])


def at_depth(depth: int, fn: Callable[[], Any]) -> Any:
    """Call ``fn`` ``depth`` ordinary frames further down (torch's inspect.stack() reads every frame)."""
    if depth <= 0:
        return fn()
    return at_depth(depth - 1, fn)


@dataclass
class Gate:
    name: str
    ratio: float
    target: float
    baseline: str
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.ratio <= self.target


SECTIONS: list[tuple[str, str, list[Case]]] = []  # (title, note, cases); the first case is the baseline
GATES: list[Gate] = []
CHECKS: list[tuple[str, bool]] = []


# ---- a. metrics ------------------------------------------------------------------------------------------------


def bench_metrics(pipeline: Any, reader: InMemoryMetricReader) -> None:
    handler = metrics.OtelMetricHandler()
    metrics.configure(handler, group="bench")
    bridge_put, torch_put = metrics.put_metric, torch_metrics.put_metric
    puts = [0]

    def torch_loop(k: int) -> None:
        for _ in range(k):
            torch_put("bench.count", 1, "bench")

    def bridge_loop(k: int) -> None:
        puts[0] += k
        for _ in range(k):
            bridge_put("bench.count", 1, "bench")

    def bridge_histogram_loop(k: int) -> None:
        for _ in range(k):
            bridge_put("train_step.duration.ms", 12, "bench")

    meter = pipeline.meter_provider.get_meter("bench.raw")
    histogram = meter.create_histogram("raw.duration", unit="s")
    counter = meter.create_counter("raw.count")
    attrs = {"metric_group": "bench"}

    def raw_histogram_loop(k: int) -> None:
        record = histogram.record
        for _ in range(k):
            record(0.012, attrs)

    def raw_counter_loop(k: int) -> None:
        add = counter.add
        for _ in range(k):
            add(1, attrs)

    cases = [
        Case('torch null put_metric("bench.count", 1, "bench")', torch_loop),
        Case("bridge put_metric -> OtelMetricHandler (buffered emit only)", bridge_loop, between=handler.drain),
        Case("bridge put_metric + handler.drain(), counter", bridge_loop, after=handler.drain),
        Case("bridge put_metric + handler.drain(), histogram (.duration.ms)", bridge_histogram_loop,
             after=handler.drain),
        Case("raw SDK Histogram.record(v, attrs)", raw_histogram_loop),
        Case("raw SDK Counter.add(v, attrs)", raw_counter_loop),
    ]  # fmt: skip
    run_cases(cases, N_METRIC, N_METRIC // 10)
    SECTIONS.append(("a. metric", f"{N_METRIC:,} calls per run", cases))
    GATES.append(Gate("metric put_metric", cases[1].ns / cases[0].ns, 2.0, "torch null"))

    # Every value put must have reached the SDK: the counter's cumulative sum is the number of puts.
    torchelastic_otel.flush()
    total = 0
    for resource_metrics in reader.get_metrics_data().resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.name == "bench.count":
                    total += sum(point.value for point in metric.data.data_points)
    CHECKS.append((f"metric values arrived: counter bench.count = {total:,} for {puts[0]:,} puts", total == puts[0]))
    metrics.configure(metrics.NullMetricHandler(), group="bench")


# ---- b. events -------------------------------------------------------------------------------------------------


def agent_metadata(state: str, raw_error: str | None) -> dict[str, Any]:
    """A worker event's metadata exactly as torch's SimpleElasticAgent._construct_event builds it."""
    failed = state == "FAILED"
    md = {
        "group_world_size": 2,
        "entry_point": "train.py",
        "local_rank": (0,),
        "role_rank": (3,),
        "role_world_size": (8,),
        "exit_code": (1 if failed else None,),
        "worker_pid": (41234 if failed else None,),
    }
    return {
        "run_id": "job-7f3a",
        "global_rank": 3,
        "group_rank": 1,
        "worker_id": "41234",
        "role": "default",
        "hostname": "node-1.cluster.local",
        "state": state,
        "total_run_time": 3600,
        "rdzv_backend": "c10d",
        "raw_error": raw_error,
        "metadata": json.dumps(md),
        "agent_restarts": 0,
        "duration_ms": None,
    }


#: torch's json.dumps(failure.error_file_data) for a worker that raised (shape of torch's error file).
RAW_ERROR = json.dumps(
    {
        "message": {
            "message": "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB",
            "extraInfo": {
                "py_callstack": 'Traceback (most recent call last):\n  File "train.py", line 42, in step\n'
                "    loss = model(batch)\nRuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
                "timestamp": "1718000000",
            },
        }
    }
)


def bench_events(pipeline: Any, exporter: CountingNullExporter) -> None:
    torch_record, bridge_record = torch_events.record, events.record
    raw_logger = pipeline.logger_provider.get_logger("bench.raw")
    tracer = pipeline.tracer_provider.get_tracer("bench")
    to_log_fields = event_adapter.to_log_fields
    recorded = [0]
    for state, raw_error in (("SUCCEEDED", None), ("FAILED", RAW_ERROR)):
        name = f"torchelastic.worker.status.{state}"
        torch_event = torch_events.Event(
            name, torch_events.EventSource.WORKER, metadata=agent_metadata(state, raw_error)
        )
        bridge_event = events.Event(name, events.EventSource.WORKER, metadata=agent_metadata(state, raw_error))
        fields = event_adapter.to_log_fields(bridge_event)  # the record the bridge emits, converted once

        def torch_loop(k: int, event: Any = torch_event) -> None:
            for _ in range(k):
                torch_record(event, "null")

        def bridge_loop(k: int, event: Any = bridge_event) -> None:
            recorded[0] += k
            for _ in range(k):
                bridge_record(event, "otel")

        def bridge_in_span_loop(k: int) -> None:
            with tracer.start_as_current_span("bench.attempt"):
                bridge_loop(k)

        def conversion_loop(k: int, event: Any = bridge_event) -> None:
            for _ in range(k):
                to_log_fields(event)

        def raw_loop(k: int, f: dict = fields) -> None:
            emit = raw_logger.emit
            for _ in range(k):
                emit(**f)

        cases = [
            Case(f'torch record(event, "null"), worker {state} event', torch_loop),
            Case('bridge record(event, "otel") (buffered)', bridge_loop, between=torchelastic_otel.flush),
            Case('bridge record(event, "otel") + flush() (convert, emit, export)', bridge_loop,
                 after=torchelastic_otel.flush),
            Case("  of which conversion: events._otel.to_log_fields(event)", conversion_loop),
            Case("raw SDK Logger.emit(**same fields, converted once)", raw_loop),
            Case("bridge, inside a recording span (+ a span event)", bridge_in_span_loop),
        ]  # fmt: skip
        run_cases(cases, N_EVENT, N_EVENT // 10)
        note = f"{len(fields['attributes'])} attributes" + (", raw_error = torch error-file JSON" if raw_error else "")
        SECTIONS.append((f"b. event {state}", f"{N_EVENT:,} calls per run; {note}", cases))
        base = cases[0].ns
        GATES.append(
            Gate(f"event record ({state})", cases[1].ns / base, 0.7, "torch null record",
                 f"of which: the SDK's own Logger.emit {cases[4].ns / base:.2f}x, "
                 f"the bridge's conversion {cases[3].ns / base:.2f}x")
        )  # fmt: skip
    torchelastic_otel.flush()
    exported = exporter.by_scope[event_adapter.SCOPE]
    CHECKS.append((f"event records exported: {exported:,} of {recorded[0]:,} bridge records", exported == recorded[0]))


# ---- c. rendezvous ---------------------------------------------------------------------------------------------


def bench_rdzv() -> None:
    common = dict(
        run_id="job-7f3a",
        message="Added node to the rendezvous",
        name="DynamicRendezvousHandler._record",
        hostname="node-1.cluster.local",
        pid=41234,
        local_id=0,
        rank=3,
    )
    torch_kwargs = dict(common, node_state=torch_events.NodeState.RUNNING)
    bridge_kwargs = dict(common, node_state=events.NodeState.RUNNING)
    sink = io.StringIO()
    torch_handler = logging.StreamHandler(sink)
    bridge_handler = events.OtelLoggingHandler()
    saved = (
        torch_event_handlers._log_handlers["dynamic_rendezvous"],
        bridge_event_handlers._log_handlers["dynamic_rendezvous"],
    )
    torch_event_handlers._log_handlers["dynamic_rendezvous"] = torch_handler
    bridge_event_handlers._log_handlers["dynamic_rendezvous"] = bridge_handler
    torch_call, bridge_call = torch_events.construct_and_record_rdzv_event, events.construct_and_record_rdzv_event
    depth = [0]

    def torch_at_depth() -> None:
        torch_call(**torch_kwargs)

    def bridge_at_depth() -> None:
        bridge_call(**bridge_kwargs)

    def probe() -> None:
        frame, n = sys._getframe(), 0
        while frame is not None:
            n, frame = n + 1, frame.f_back
        depth[0] = n  # frames on the stack where the calls are made (what inspect.stack() reads)

    def torch_loop(k: int) -> None:
        for _ in range(k):
            at_depth(RDZV_DEPTH, torch_at_depth)

    def bridge_loop(k: int) -> None:
        for _ in range(k):
            at_depth(RDZV_DEPTH, bridge_at_depth)

    def clear_sink() -> None:
        sink.seek(0)
        sink.truncate()

    try:
        at_depth(RDZV_DEPTH, probe)
        cases = [
            Case("torch construct_and_record_rdzv_event, StreamHandler(StringIO)", torch_loop, between=clear_sink),
            Case("bridge construct_and_record_rdzv_event -> OtelLoggingHandler", bridge_loop),
        ]
        run_cases(cases, N_RDZV, 10)
        torch_loop(1)
        wrote_json = '"node_state": "RUNNING"' in sink.getvalue()
    finally:
        torch_event_handlers._log_handlers["dynamic_rendezvous"] = saved[0]
        bridge_event_handlers._log_handlers["dynamic_rendezvous"] = saved[1]
        # torch (and the bridge) keep the destination's logger with the handler it had at first use
        for module, handler in ((torch_events, torch_handler), (events, bridge_handler)):
            logger = module._events_loggers.pop("dynamic_rendezvous", None)
            if logger is not None:
                logger.removeHandler(handler)
    SECTIONS.append(
        ("c. rdzv", f"{N_RDZV} calls per run; called with {depth[0] - 1} frames on the stack "
                    f"({RDZV_DEPTH} ordinary frames below the benchmark loop)", cases)
    )  # fmt: skip
    GATES.append(Gate("rdzv construct_and_record_rdzv_event", cases[1].ns / cases[0].ns, 0.1, "torch's"))
    CHECKS.append(("torch's rendezvous handler wrote the event JSON to its StringIO", wrote_json))


# ---- report ----------------------------------------------------------------------------------------------------


def loop_overhead() -> float:
    def empty(k: int) -> None:
        for _ in range(k):
            pass

    case = Case("empty loop", empty)
    run_cases([case], 100_000, 1_000)
    return case.ns


def print_report(overhead: float) -> None:
    width = 70
    print("torchelastic_otel API benchmark")
    print(f"  date:    {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(f"  machine: {os.cpu_count()} CPUs, {platform.machine()}, {platform.system()} {platform.release()}")
    print(
        f"  python:  {platform.python_version()}  torch {torch.__version__}  "
        f"opentelemetry-sdk {_version('opentelemetry-sdk')}  torchelastic_otel {torchelastic_otel.__version__}"
    )
    print(
        f"  method:  median of {REPEATS} runs after a warm-up, variants timed in turns, gc.collect(1) before each run;"
    )
    print(f"           loop overhead {overhead:.0f} ns/call included")
    print("  setup:   torchelastic_otel.setup(MeterProvider(InMemoryMetricReader), LoggerProvider(")
    print("           BatchLogRecordProcessor(counting no-op exporter)), TracerProvider())")
    for title, note, cases in SECTIONS:
        base = cases[0].ns
        print()
        print(f"{title}  ({note})")
        print(f"  {'(ratio: to the first row)':{width}}{'ns/call':>10} {'ratio':>9}")
        for case in cases:
            print(f"  {case.label:{width}}{case.ns:>10,.0f} {case.ns / base:>8.2f}x")
    print()
    for text, ok in CHECKS:
        print(f"  [{'ok' if ok else 'FAIL'}] {text}")
    print(f"  total time {time.monotonic() - STARTED:.1f} s")
    print()
    for gate in GATES:
        verdict = "PASS" if gate.ok else "FAIL  <<<<<"
        print(f"{gate.name}: {gate.ratio:.2f}x {gate.baseline} (target <= {gate.target}x) {verdict}")
        if gate.note:
            print(f"    {gate.note}")


def _version(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return "?"


def main() -> int:
    reader = InMemoryMetricReader()
    exporter = CountingNullExporter()
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(BatchLogRecordProcessor(exporter))
    pipeline = torchelastic_otel.setup(
        tracer_provider=TracerProvider(),
        meter_provider=MeterProvider(metric_readers=[reader]),
        logger_provider=logger_provider,
    )
    overhead = loop_overhead()
    bench_metrics(pipeline, reader)
    bench_events(pipeline, exporter)
    bench_rdzv()
    print_report(overhead)
    return 0  # a report: a missed target is printed as FAIL, not an error


if __name__ == "__main__":
    sys.exit(main())
