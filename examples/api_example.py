"""The bridge's APIs in one process, without torchrun or a backend: ``.venv/bin/python examples/api_example.py``.

(``make demo`` runs a real elastic job instead: ``examples/demo.py``.) A tiny synthetic "training run" uses both
APIs of torchelastic_otel the way torch code does:

- metrics: ``@metrics.prof`` on a training step (three successes, one failure), ``put_metric`` of a user value
  (loss) and of two names torch's agent reports (``workers.default.remaining_restarts`` and
  ``SimpleElasticAgent._rendezvous.duration.ms``);
- events: torch-style ``events.record(Event(...), "otel")`` (a worker START and a FAILED worker event shaped like
  torch's agent builds them, with ``raw_error``), a rendezvous ``RdzvEvent``, and the legacy
  ``events.record("checkpoint.saved", "demo", {...})``;

all inside a span "demo.run" with a child span per step. The providers write to in-memory exporters; after
``torchelastic_otel.flush()`` the example prints what they hold: log records, the span tree, the metric points.
"""

from __future__ import annotations

import datetime
import json
import os
import textwrap
import time
import traceback

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Gauge, Histogram, InMemoryMetricReader, Sum
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import torchelastic_otel
from torchelastic_otel import events, metrics
from torchelastic_otel.events import Event, EventSource, NodeState, RdzvEvent

RUN_ID = "demo-job-1"
HOST = "node-1"
PID = os.getpid()


# ---- 1. the pipeline: three providers with in-memory exporters -------------------------------------------------

resource = Resource.create({"service.name": "torchelastic-demo"})
spans = InMemorySpanExporter()
logs = InMemoryLogRecordExporter()
reader = InMemoryMetricReader()
tracer_provider = TracerProvider(resource=resource)
tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
logger_provider = LoggerProvider(resource=resource)
logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
torchelastic_otel.setup(tracer_provider, meter_provider, logger_provider)

metrics.configure(metrics.OtelMetricHandler())  # every metric group -> OpenTelemetry instruments
events.configure(events.OtelEventHandler())  # legacy API: every event type -> OpenTelemetry
tracer = tracer_provider.get_tracer("demo")


# ---- 2. a small training run ------------------------------------------------------------------------------------


def worker_event(state: str, raw_error: str | None = None, exit_code: int | None = None) -> Event:
    """A worker status event as torch's SimpleElasticAgent._construct_event builds it."""
    packed = {"group_world_size": 1, "entry_point": "demo.py", "local_rank": [0], "role_rank": [0],
              "role_world_size": [1], "exit_code": [exit_code], "worker_pid": [PID]}  # fmt: skip
    return Event(
        f"torchelastic.worker.status.{state}",
        EventSource.WORKER,
        metadata={
            "run_id": RUN_ID, "global_rank": 0, "group_rank": 0, "worker_id": str(PID), "role": "default",
            "hostname": HOST, "state": state, "total_run_time": 0, "rdzv_backend": "c10d",
            "raw_error": raw_error, "metadata": json.dumps(packed), "agent_restarts": 0, "duration_ms": None,
        },
    )  # fmt: skip


def torch_error_file(exc: BaseException) -> str:
    """``raw_error`` as torch's agent sends it: the JSON of the worker's error file."""
    message = f"{type(exc).__name__}: {exc}"
    extra = {"py_callstack": traceback.format_exc(), "timestamp": str(int(time.time()))}
    return json.dumps({"message": {"message": message, "extraInfo": extra}})


class Trainer:
    @metrics.prof(group="demo")  # -> torchelastic.function.calls / torchelastic.function.duration
    def train_step(self, step: int) -> float:
        time.sleep(0.02)
        if step == 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return 1.0 / (step + 1)


with tracer.start_as_current_span("demo.run", attributes={"run_id": RUN_ID}):
    events.record(
        RdzvEvent(
            name="dynamic_rendezvous.py:DynamicRendezvousHandler.next_rendezvous",
            run_id=RUN_ID,
            message=f"The node '{HOST}_{PID}_0' added itself to the participants of round 0.",
            hostname=HOST,
            pid=PID,
            node_state=NodeState.RUNNING,
            master_endpoint="127.0.0.1:29400",
            rank=0,
        ),
        "otel",
    )
    metrics.put_metric("SimpleElasticAgent._rendezvous.duration.ms", 1500, "torchelastic")  # torch's agent name
    events.record(worker_event("START"), "otel")
    trainer = Trainer()
    for step in range(4):
        try:
            with tracer.start_as_current_span("demo.step", attributes={"step": step}):
                loss = trainer.train_step(step)
                metrics.put_metric("loss", loss, "demo")
                if step == 1:
                    events.record("checkpoint.saved", "demo", {"step": step, "path": f"/tmp/ckpt/step-{step}.pt"})
        except RuntimeError as exc:  # the step span records the exception and ends with status ERROR
            events.record(worker_event("FAILED", torch_error_file(exc), exit_code=1), "otel")
    metrics.put_metric("workers.default.remaining_restarts", 2, "torchelastic")  # torch's agent name

torchelastic_otel.flush()  # drains the metric buffer into the SDK and flushes every provider


# ---- 3. what was exported ---------------------------------------------------------------------------------------

WIDTH = 112
finished_spans = sorted(spans.get_finished_spans(), key=lambda s: s.start_time)
span_names = {s.context.span_id: s.name for s in finished_spans}
run_start = finished_spans[0].start_time if finished_spans else 0


def clock(ns: int) -> str:
    return datetime.datetime.fromtimestamp(ns / 1e9).strftime("%H:%M:%S.%f")[:-3]


def show(value: object, limit: int = 60) -> str:
    """A compact value: strings quoted (a traceback shortened to its last line), long ones cut."""
    if isinstance(value, str):
        lines = value.strip().splitlines()
        if len(lines) > 1:
            return f"<traceback, {len(lines)} lines>"
        return repr(value if len(value) <= limit else value[: limit - 3] + "...")
    if isinstance(value, tuple):
        return repr(list(value))
    return repr(value)


NAMESPACES = ("exception.", "torchelastic.metadata.", "torchelastic.")  # attributes are grouped by these
SHOWN_IN_ORDER = ("exception.", "torchelastic.", "torchelastic.metadata.", "")


def print_attributes(attributes: object) -> None:
    """Attributes grouped by namespace: ``torchelastic.* run_id=...`` stands for ``torchelastic.run_id=...``."""
    groups: dict[str, list[str]] = {}
    for key, value in dict(attributes or {}).items():  # type: ignore[call-overload]
        space = next((n for n in NAMESPACES if key.startswith(n)), "")
        groups.setdefault(space, []).append(f"{key[len(space) :]}={show(value)}".replace(" ", "\0"))
    for space in SHOWN_IN_ORDER:
        if space in groups:  # one item is never split across lines (its spaces are \0 while filling)
            label = f"      {space + '*' if space else '':<24}"
            text = textwrap.fill("  ".join(groups[space]), WIDTH, initial_indent=label, subsequent_indent=" " * 30,
                                 break_long_words=False, break_on_hyphens=False)  # fmt: skip
            print(text.replace("\0", " "))


def print_logs() -> None:
    records = [r.log_record for r in logs.get_finished_logs()]
    print(f"(1) LOG RECORDS: {len(records)}, one per event  [time severity event_name body (span); attributes]")
    for record in records:
        head = f"  {clock(record.timestamp)} {record.severity_text:<5} {record.event_name}"
        body = f"body={show(record.body, 80)}"
        span = f"(span {span_names.get(record.span_id, '-')})"
        if len(head) + len(body) + len(span) + 4 <= WIDTH + 8:
            print(f"{head}  {body}  {span}")
        else:
            print(f"{head}  {span}\n{' ' * 30}{body}")
        print_attributes(record.attributes)


def print_spans() -> None:
    print(f"(2) SPANS: {len(finished_spans)}, one trace  [name {{attributes}} start +ms, duration; * = span event]")
    children: dict[object, list] = {}
    for s in finished_spans:
        children.setdefault(s.parent.span_id if s.parent else None, []).append(s)

    def walk(s, depth: int) -> None:  # type: ignore[no-untyped-def]
        pad = "  " * depth
        status = f"  {s.status.status_code.name}: {s.status.description}" if s.status.description else ""
        attrs = " {" + ", ".join(f"{k}={v}" for k, v in s.attributes.items()) + "}" if s.attributes else ""
        print(f"  {pad}{s.name}{attrs}  +{(s.start_time - run_start) / 1e6:.1f} ms, "
              f"{(s.end_time - s.start_time) / 1e6:.1f} ms{status}")  # fmt: skip
        entries = [(e.timestamp, "event", e) for e in s.events] + [(c.start_time, "span", c) for c in children.get(
            s.context.span_id, [])]  # fmt: skip
        for _, kind, item in sorted(entries, key=lambda x: x[0]):
            if kind == "span":
                walk(item, depth + 1)
            else:
                n = len(item.attributes or {})
                detail = item.attributes.get("exception.message") if item.attributes else None
                detail = f"  {show(detail)}" if detail else ""
                print(f"  {pad}  * {item.name}  ({n} attributes){detail}")

    for root in children.get(None, []):
        walk(root, 0)


SOURCES = {  # what the demo put (torch-style names) -> the instrument the rule table chose
    "loss": 'put_metric("loss", v, "demo")',
    "torchelastic.function.calls": "@prof: Trainer.train_step.success, Trainer.train_step.failure",
    "torchelastic.function.duration": "*.duration.ms values: @prof's and SimpleElasticAgent._rendezvous's; ms -> s",
    "torchelastic.workers.remaining_restarts": 'put_metric("workers.default.remaining_restarts", 2)',
}  # fmt: skip


def print_metrics() -> None:
    data = reader.get_metrics_data()
    found = [m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics] if data else []
    print(f"(3) METRICS: {len(found)} instruments  [name kind unit; what the demo put; {{attributes}} -> value]")
    for m in sorted(found, key=lambda m: m.name):
        kind = {Gauge: "gauge", Histogram: "histogram"}.get(type(m.data))
        if isinstance(m.data, Sum):
            kind = "counter" if m.data.is_monotonic else "updown_counter"
        print(f"  {m.name}  {kind}  {m.unit or '(no unit)'}")
        if m.name in SOURCES:
            print(f"      from {SOURCES[m.name]}")
        for p in m.data.data_points:
            attrs = "{" + ", ".join(f"{k}={v}" for k, v in sorted(p.attributes.items())) + "}"
            value = f"count={p.count} sum={p.sum:g}" if kind == "histogram" else f"{p.value:g}"
            print(f"      {attrs} -> {value}")


print(
    "torchelastic_otel API example: what one small run exports "
    f"(resource service.name={resource.attributes['service.name']})"
)
print()
print_logs()
print()
print_spans()
print()
print_metrics()
print()
print(
    "Metric names -> instruments: the rule table in torchelastic_otel.metrics.rules. Event metadata -> torchelastic.*"
)
print("attributes; torch's packed 'metadata' JSON -> torchelastic.metadata.*; raw_error / error_trace -> exception.*")
print("To send the same to a real backend (OpenTelemetry Collector, Jaeger, ...), don't call setup(): the bridge then")
print("configures itself from the standard OTEL_* variables (OTLP exporters by default):")
print("  OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 python your_script.py")
