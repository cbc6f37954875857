"""A user program for the end-to-end pipeline tests (``tests/jobs/test_pipeline_e2e.py``), one scenario per run.

Usage: ``python tests/support/workers/_e2e_child.py SCENARIO``. It uses only the public APIs, the way an
application would, and takes all exporter configuration from the ``OTEL_*`` variables its parent sets. Scenarios:

- ``default``: events, a span and metrics, then a normal exit (the bridge must flush at exit by itself);
- ``flush_exit``: the same, then ``torchelastic_otel.flush()`` and ``os._exit(0)`` (no atexit handlers run);
- ``existing``: the application sets its own SDK providers globally first (resource ``app.owner=me``);
- ``existing_tracer``: the application sets only its own TracerProvider; the bridge builds the other two;
- ``setup``: ``torchelastic_otel.setup(...)`` with the program's own in-memory providers;
- ``prometheus``: metrics only, then wait (bounded) for a line on stdin while the parent scrapes.

One stdout line starting with ``E2E_RESULT `` is a JSON object describing what the child did (its pid, the trace and
span id of its span, provider identities, in-memory counts ...); console exporters may print after it.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time

from torchelastic_otel import metrics

SPAN_NAME = "e2e.run"
TRACER_NAME = "e2e.child"

#: torch's error-file content of a failed worker (``ProcessFailure.error_file_data``).
ERROR_FILE_DATA = {
    "message": {
        "message": "ValueError: boom at step 7",
        "extraInfo": {
            "py_callstack": 'Traceback (most recent call last):\n  File "train.py", line 7, in main\n'
            "    raise ValueError('boom at step 7')\nValueError: boom at step 7\n",
            "timestamp": "1700000000",
        },
    }
}


class Trainer:
    """``@prof`` names a method ``Class.method``, as torch's agent methods (``SimpleElasticAgent._rendezvous``)."""

    @metrics.prof(group="app")
    def train_step(self, fail: bool) -> None:
        if fail:
            raise ValueError("step failed")


#: (name, value) put in group "torchelastic" by the prometheus scenario: one per default rule.
PROMETHEUS_VALUES = (
    ("workers.default.remaining_restarts", 3),
    ("workers.default.flakiness", 25.0),
    ("workers.default.healthy", 1),
    ("workers.default.run_total", 1),
    ("workers.default.run_success_no_retries", 1),
    ("workers.default.restart_count", 2),
    ("SimpleElasticAgent._rendezvous.duration.ms", 1500),
    ("data_load.ms", 250),
    ("tokens.count", 4096),
    ("queue_depth", 5),
)


def _train_a_step_then_fail_one() -> None:
    """torch's metrics handed to OpenTelemetry; a ``Trainer`` step that succeeds, then one that raises (caught)."""
    metrics.configure(metrics.OtelMetricHandler())
    trainer = Trainer()
    trainer.train_step(False)
    try:
        trainer.train_step(True)
    except ValueError:
        pass


def _result(**data: object) -> None:
    print("E2E_RESULT " + json.dumps(data, sort_keys=True), flush=True)


def _failed_worker_event():  # type: ignore[no-untyped-def]
    """The event torch's ``SimpleElasticAgent._construct_event`` builds for a FAILED worker."""
    from torchelastic_otel.events import Event, EventSource

    metadata = {
        "run_id": "e2e-run",
        "global_rank": 1,
        "group_rank": 0,
        "worker_id": "4242",
        "role": "trainer",
        "hostname": "node-0.example",
        "state": "FAILED",
        "total_run_time": 12,
        "rdzv_backend": "c10d",
        "raw_error": json.dumps(ERROR_FILE_DATA),
        "metadata": json.dumps({"group_world_size": [2], "entry_point": ["train.py"]}),
        "agent_restarts": 1,
        "duration_ms": 34,
    }
    return Event("torchelastic.worker.status.FAILED", source=EventSource.WORKER, metadata=metadata)


def workload(tracer_provider=None) -> dict:  # type: ignore[no-untyped-def]
    """Metrics through ``OtelMetricHandler``, events of all three APIs inside one span."""
    from opentelemetry import trace

    from torchelastic_otel import events
    from torchelastic_otel.events import Event, EventSource

    events.configure(events.OtelEventHandler())
    _train_a_step_then_fail_one()
    metrics.put_metric("workers.default.remaining_restarts", 3, "torchelastic")
    metrics.put_metric("SimpleElasticAgent._rendezvous.duration.ms", 1500, "torchelastic")
    metrics.put_metric("loss", 0.25, "app")

    tracer = tracer_provider.get_tracer(TRACER_NAME) if tracer_provider is not None else trace.get_tracer(TRACER_NAME)
    with tracer.start_as_current_span(SPAN_NAME) as span:
        ctx = span.get_span_context()
        events.record(
            Event("e2e.started", EventSource.AGENT, metadata={"step": 7, "ok": True, "role": "trainer"}), "otel"
        )
        events.record(_failed_worker_event(), "otel")
        events.record("e2e.legacy", "e2e_type", {"k": 1})
    return {
        "trace_id": format(ctx.trace_id, "032x"),
        "span_id": format(ctx.span_id, "016x"),
        "pid": os.getpid(),
    }


def _stdin_line(timeout: float) -> None:
    """Block until the parent writes a line (or closes stdin), at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        ready, _, _ = select.select([sys.stdin], [], [], remaining)
        if ready:
            sys.stdin.readline()
            return


def _app_providers(tracer_only: bool = False):  # type: ignore[no-untyped-def]
    """The application's own SDK providers, exporting over OTLP/gRPC to ``OTEL_EXPORTER_OTLP_ENDPOINT``."""
    from opentelemetry import _logs, metrics, trace
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": "my-app", "app.owner": "me"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(tracer_provider)
    if tracer_only:
        return tracer_provider, None, None
    reader = PeriodicExportingMetricReader(OTLPMetricExporter())
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    metrics.set_meter_provider(meter_provider)
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(BatchLogRecordProcessor(OTLPLogExporter()))
    _logs.set_logger_provider(logger_provider)
    return tracer_provider, meter_provider, logger_provider


def main(scenario: str) -> None:
    if scenario in ("default", "flush_exit"):
        result = workload()
        if scenario == "flush_exit":
            import torchelastic_otel

            result["flushed"] = torchelastic_otel.flush()
            _result(**result)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        _result(**result)
        return

    if scenario in ("existing", "existing_tracer"):
        from opentelemetry import _logs, trace
        from opentelemetry import metrics as otel_metrics

        import torchelastic_otel

        tp, mp, lp = _app_providers(tracer_only=scenario == "existing_tracer")
        result = workload()
        pipe = torchelastic_otel.get_pipeline()
        result.update(
            same_tracer_provider=pipe.tracer_provider is trace.get_tracer_provider() is tp,
            same_meter_provider=pipe.meter_provider is otel_metrics.get_meter_provider(),
            same_logger_provider=pipe.logger_provider is _logs.get_logger_provider(),
            app_meter_provider=mp is not None and pipe.meter_provider is mp,
            app_logger_provider=lp is not None and pipe.logger_provider is lp,
            owned=pipe.owned,
        )
        _result(**result)
        return

    if scenario == "setup":
        from opentelemetry import _logs, trace
        from opentelemetry import metrics as otel_metrics
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        import torchelastic_otel

        spans, logs, reader = InMemorySpanExporter(), InMemoryLogRecordExporter(), InMemoryMetricReader()
        tp = TracerProvider()
        tp.add_span_processor(SimpleSpanProcessor(spans))
        lp = LoggerProvider()
        lp.add_log_record_processor(SimpleLogRecordProcessor(logs))
        mp = MeterProvider(metric_readers=[reader])
        pipe = torchelastic_otel.setup(tracer_provider=tp, meter_provider=mp, logger_provider=lp)
        result = workload(tracer_provider=tp)
        result["flushed"] = torchelastic_otel.flush()
        finished = spans.get_finished_spans()
        metric_names = sorted(
            {
                m.name
                for rm in (reader.get_metrics_data() or _empty()).resource_metrics
                for sm in rm.scope_metrics
                for m in sm.metrics
            }
        )
        result.update(
            pipeline_is_explicit=(pipe.tracer_provider, pipe.meter_provider, pipe.logger_provider) == (tp, mp, lp),
            same_as_get_pipeline=torchelastic_otel.get_pipeline() is pipe,
            spans=[s.name for s in finished],
            span_events=[e.name for s in finished for e in s.events],
            log_event_names=[getattr(r.log_record, "event_name", None) for r in logs.get_finished_logs()],
            metric_names=metric_names,
            global_tracer_provider=type(trace.get_tracer_provider()).__name__,
            global_meter_provider=type(otel_metrics.get_meter_provider()).__name__,
            global_logger_provider=type(_logs.get_logger_provider()).__name__,
        )
        _result(**result)
        return

    if scenario == "prometheus":
        from torchelastic_otel import events
        from torchelastic_otel.events import Event, EventSource

        _train_a_step_then_fail_one()
        # One value for every rule of the default table (see torchelastic_otel.metrics.rules).
        for name, value in PROMETHEUS_VALUES:
            metrics.put_metric(name, value, "torchelastic")
        metrics.put_metric("loss", 0.25, "app")
        metrics.put_metric("not_a_number", "abc", "app")  # dropped and counted: torchelastic_otel.dropped
        # bytes metadata is decoded and counted: torchelastic_otel.sanitized (no log exporter is configured)
        events.record(Event("e2e.bytes", EventSource.AGENT, metadata={"blob": b"\xff"}), "otel")
        _result(ready=True, pid=os.getpid())
        _stdin_line(timeout=float(os.environ.get("E2E_CHILD_WAIT", "20")))
        return

    raise SystemExit(f"unknown scenario {scenario!r}")


def _empty():  # type: ignore[no-untyped-def]
    from opentelemetry.sdk.metrics.export import MetricsData

    return MetricsData(resource_metrics=[])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "default")
