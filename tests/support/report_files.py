"""OTLP JSON Lines files of a synthetic torchrun job, written by the real exporter package, for report tests and
the report benchmark.

The job has the shape of what the bridge exports (see ``tests/jobs/test_report.py`` for a real one): an agent with a
``torchelastic.run`` span, one ``torchelastic.attempt`` per restart with a rendezvous, ``torchelastic.restart``
spans between them; per attempt and rank a worker process with its ``torchelastic.worker.start`` span and its own
``train.step`` spans; the agent's ``torchelastic.worker.failure`` records for the failed first attempt, in which
``cause_rank`` raised; INFO records as many as asked; a gauge and a counter per worker. Each process writes its
own files through ``opentelemetry-exporter-otlp-json-file`` (providers of the SDK with explicit span and record
times, so the timeline is known exactly: ``Facts``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry._logs import SeverityNumber
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Status, StatusCode


def _file_exporter(signal: str) -> Any:
    """The ``otlp_json_file`` exporter class of ``signal``, found as the SDK finds it (by entry point)."""
    (point,) = entry_points(group=f"opentelemetry_{signal}_exporter", name="otlp_json_file")
    return point.load()


FileSpanExporter, FileLogExporter, FileMetricExporter = (_file_exporter(s) for s in ("traces", "logs", "metrics"))

MS = 1_000_000
S = 1000 * MS


@dataclass
class Shape:
    ranks: int = 2
    attempts: int = 2  # the first fails (cause_rank raises), the others succeed
    cause_rank: int = 1
    steps: int = 3  # train.step spans per worker process
    records: int = 0  # extra INFO log records, spread over the worker processes
    collections: int = 3  # metric exports per worker process
    run_id: str = "synthetic-run"
    error: str = ""  # the message of cause_rank's exception (default: "rank <r> failed")


@dataclass
class Facts:
    """What the files hold, for assertions: the run id, the job's start (ns), attempt spans by restart."""

    run_id: str
    start: int
    attempt_spans: dict[int, str] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)


class Process:
    """One process's providers, writing ``<signal>-<name>.jsonl`` in ``directory`` through the file exporters."""

    def __init__(self, directory: Path, name: str, resource: dict[str, Any]) -> None:
        res = Resource.create({"service.name": "torchelastic", **resource})
        self.paths = [directory / f"{signal}-{name}.jsonl" for signal in ("traces", "logs", "metrics")]
        self.tracer_provider = TracerProvider(resource=res)
        spans = BatchSpanProcessor(FileSpanExporter(self.paths[0]), max_queue_size=1 << 16)
        self.tracer_provider.add_span_processor(spans)
        self.logger_provider = LoggerProvider(resource=res)
        self.logger_provider.add_log_record_processor(
            BatchLogRecordProcessor(FileLogExporter(self.paths[1]), max_queue_size=1 << 18, max_export_batch_size=2048)
        )
        self.reader = PeriodicExportingMetricReader(FileMetricExporter(self.paths[2]), export_interval_millis=3_600_000)
        self.meter_provider = MeterProvider(resource=res, metric_readers=[self.reader])
        self.tracer = self.tracer_provider.get_tracer("torchelastic_otel")
        self.logger = self.logger_provider.get_logger("torchelastic_otel")
        self.meter = self.meter_provider.get_meter("torchelastic_otel")

    def span(self, name: str, start: int, end: int, parent: Any = None, error: str = "", **attrs: Any) -> Any:
        ctx = trace.set_span_in_context(parent) if parent is not None else None
        span = self.tracer.start_span(name, context=ctx, start_time=start, attributes=attrs)
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=end)
        return span

    def record(self, name: str, time: int, severity: SeverityNumber, span: Any = None, **attrs: Any) -> None:
        ctx = trace.set_span_in_context(span) if span is not None else None
        self.logger.emit(timestamp=time, observed_timestamp=time, severity_number=severity, severity_text=severity.name,
                         body=name, event_name=name, attributes=attrs, context=ctx)  # fmt: skip

    def close(self) -> None:
        for provider in (self.tracer_provider, self.logger_provider, self.meter_provider):
            provider.shutdown()


def write_job(directory: Path, shape: Shape | None = None) -> Facts:
    """Write the files of one job (``Shape()`` unless given) into ``directory``; returns what they hold."""
    shape = shape or Shape()
    directory.mkdir(parents=True, exist_ok=True)
    # ends a second ago: the metric points (stamped by the SDK at collection, now) come right after the spans
    start = (time.time_ns() // S - shape.attempts * 4 - 1) * S
    facts = Facts(shape.run_id, start)
    agent = Process(directory, "agent", {"torchelastic.run_id": shape.run_id, "torchelastic.process.kind": "agent",
                                         "host.name": "node0", "process.pid": 100})  # fmt: skip
    attempt_length = 4 * S
    end = start + shape.attempts * attempt_length
    run = agent.tracer.start_span("torchelastic.run", start_time=start)
    per_process = shape.records // max(1, shape.ranks * shape.attempts)
    for restart in range(shape.attempts):
        a0 = start + restart * attempt_length
        failed = restart == 0 and shape.attempts > 1
        attempt = agent.tracer.start_span("torchelastic.attempt", context=trace.set_span_in_context(run), start_time=a0,
                                          attributes={"torchelastic.restart_count": str(restart)})  # fmt: skip
        facts.attempt_spans[restart] = f"{attempt.get_span_context().span_id:016x}"
        agent.span("torchelastic.rendezvous", a0, a0 + 200 * MS, attempt)
        for rank in range(shape.ranks):
            _worker(directory, shape, attempt, restart, rank, a0, failed, per_process)
            if failed:
                stopped = rank != shape.cause_rank
                agent.record("torchelastic.worker.failure", a0 + 3 * S, SeverityNumber.ERROR, attempt, **{
                    "torchelastic.global_rank": str(rank), "torchelastic.local_rank": str(rank),
                    "torchelastic.restart_count": str(restart), "torchelastic.exit_code": "-15" if stopped else "1",
                    **({"torchelastic.signal": "SIGTERM"} if stopped else {}),
                })  # fmt: skip
        if failed:
            attempt.set_status(Status(StatusCode.ERROR, "worker group failed"))
        attempt.end(end_time=a0 + (3 * S if failed else attempt_length - 100 * MS))
        if restart + 1 < shape.attempts:
            restarted = {"torchelastic.restart_count": str(restart + 1), "torchelastic.restart.reason": "failure"}
            agent.span("torchelastic.restart", a0 + 3 * S, a0 + attempt_length, run, **restarted)
    run.set_attribute("torchelastic.run.state", "SUCCEEDED")
    run.end(end_time=end)
    agent.close()
    facts.files = sorted(directory.glob("*.jsonl"))
    return facts


def _worker(directory: Path, shape: Shape, attempt: Any, restart: int, rank: int, a0: int, failed: bool,
            records: int) -> None:  # fmt: skip
    proc = Process(directory, f"rank{rank}-restart{restart}", {
        "torchelastic.run_id": shape.run_id, "torchelastic.process.kind": "worker", "torchelastic.rank": rank,
        "torchelastic.local_rank": rank, "torchelastic.restart_count": restart, "host.name": "node0",
        "process.pid": 1000 + 10 * restart + rank,
    })  # fmt: skip
    w0 = a0 + 300 * MS
    proc.span("torchelastic.worker.start", w0, w0 + 800 * MS, attempt)
    step = (2 * S) // max(1, shape.steps)
    for i in range(shape.steps):
        proc.span("train.step", w0 + S + i * step, w0 + S + (i + 1) * step - MS, attempt, step=i)
    for i in range(records):
        proc.record("trainer.progress", w0 + S + i * (2 * S // max(1, records)), SeverityNumber.INFO, attempt, step=i)
    if failed and rank == shape.cause_rank:
        message = shape.error or f"rank {rank} failed"
        trace_text = f'Traceback (most recent call last):\n  File "train.py", line 7\nValueError: {message}\n'
        proc.record("torchelastic.worker.exception", w0 + 2 * S, SeverityNumber.ERROR, attempt, **{
            "exception.type": "ValueError", "exception.message": message, "exception.stacktrace": trace_text,
        })  # fmt: skip
    loss = proc.meter.create_gauge("loss")
    samples = proc.meter.create_counter("samples_total")
    for i in range(shape.collections):
        loss.set(1.0 / (i + 1), {"metric_group": "trainer"})
        samples.add(32, {"metric_group": "trainer"})
        proc.reader.collect()
    proc.close()


def lines_of(paths: list[Path]) -> int:
    return sum(1 for p in paths for _ in open(p))


def size_of(paths: list[Path]) -> int:
    return sum(os.path.getsize(p) for p in paths)


def without_named(line: str, name: str) -> str:
    """One OTLP JSON Lines line less its log records whose ``eventName`` is ``name`` and its metrics called
    ``name``: a real job's files without one signal."""
    data = json.loads(line)
    for block in data.get("resourceLogs", []):
        for scope in block.get("scopeLogs", []):
            scope["logRecords"] = [r for r in scope.get("logRecords", []) if r.get("eventName") != name]
    for block in data.get("resourceMetrics", []):
        for scope in block.get("scopeMetrics", []):
            scope["metrics"] = [m for m in scope.get("metrics", []) if m.get("name") != name]
    return json.dumps(data)
