"""Real torchrun jobs (CPU, gloo, 127.0.0.1) exporting over OTLP/gRPC to an in-process receiver.

Every route a user has to bridge a job is run for real and checked at the receiver, i.e. on what crossed the wire:

- ``torchelastic-otel run ...`` and ``python -m torchelastic_otel.run ...`` (torchrun with the bridge);
- ``opentelemetry-instrument torchrun ...`` (the instrumentor entry point);
- ``examples/my_launcher.py`` (a custom launcher calling ``torchelastic_otel.install()``);
- a worker failing once (restart), a worker failing always, and two agents ("two nodes") joining one rendezvous.

The worker is ``tests/support/workers/torchrun_worker.py``. Each job is bounded by a timeout and killed (with the
workers it started) if it outlives it. A quick in-process test checks that ``install()`` / ``uninstall()`` are
symmetric.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, WORKERS
from tests.support.env import clean_env, otlp_env
from tests.support.jobs import (
    OTEL_INSTRUMENT,
    SEVERITY_ERROR,
    SEVERITY_INFO,
    SEVERITY_WARN,
    TORCHELASTIC_OTEL,
    TORCHRUN,
    c10d_args,
    is_worker,
    unique_id,
)
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.ports import free_port
from tests.support.procs import Job
from tests.support.releases import torch_events_have_exit_code

pytest.importorskip("torch.distributed.elastic.agent.server.local_elastic_agent")

WORKER = WORKERS / "torchrun_worker.py"
LAUNCHER = ROOT / "examples" / "my_launcher.py"

JOB_TIMEOUT = 120.0  # seconds, per torchrun job
WAIT = 30.0  # seconds to wait for telemetry at the receiver once the job ended
STEPS = 3  # steps of each worker (one span, one event, one put_metric and one @prof call each)

STATUS_OK_OR_UNSET, STATUS_ERROR = (0, 1), 2


# ---- running a job ------------------------------------------------------------------------------------------


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Callable[..., Job]]:
    """``start(cmd, env)`` starts a job; every job started is killed (with its workers) at the end of the test."""
    started: list[Job] = []

    def start(cmd: list[str | Path], env: dict[str, str]) -> Job:
        output_path = tmp_path / f"job{len(started)}.log"
        with open(output_path, "wb") as out:
            proc = subprocess.Popen(
                [str(c) for c in cmd], env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        job = Job(proc, output_path)
        started.append(job)
        return job

    try:
        yield start
    finally:
        for job in started:
            job.kill()


def run_job(start: Callable[..., Job], cmd: list[str | Path], env: dict[str, str]) -> Job:
    job = start(cmd, env)
    job.wait()
    return job


def bridged_run(start: Callable[..., Job], rx: OtlpReceiver, run_id: str, *worker_args: str,
                restarts: int | None = None) -> Job:  # fmt: skip
    """``torchelastic-otel run`` of the worker (``--steps STEPS``, then ``worker_args``) on 2 ranks, c10d rendezvous
    ``run_id``, exporting to ``rx``; to its end."""
    cmd: list[str | Path] = [TORCHELASTIC_OTEL, "run", "--nproc-per-node", "2"]
    if restarts is not None:
        cmd += ["--max-restarts", str(restarts)]
    cmd += [*c10d_args(run_id), WORKER, "--steps", str(STEPS), *worker_args]
    return run_job(start, cmd, otlp_env(rx))


# ---- reading what the receiver got ------------------------------------------------------------------------


def agent_items(items: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [i for i in items if not is_worker(i)]


def worker_items(items: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [i for i in items if is_worker(i)]


def ranks_of(items: Iterable[dict[str, Any]]) -> set[int]:
    return {i["resource"]["torchelastic.rank"] for i in items if is_worker(i)}


def derived_ids(run_id: str) -> tuple[str, str]:
    """(trace id, span id) of the synthetic parent the bridge derives from a run id."""
    from opentelemetry import trace

    from torchelastic_otel._torch.agent import lifecycle

    ctx = lifecycle.run_parent_context(run_id)
    assert ctx is not None, f"no parent derived from run id {run_id!r}"
    span_context = trace.get_current_span(ctx).get_span_context()
    return f"{span_context.trace_id:032x}", f"{span_context.span_id:016x}"


def wait_or_fail(
    rx: OtlpReceiver, what: str, predicate: Callable[[OtlpReceiver], bool], job: Job | None = None
) -> None:
    if not rx.wait_for(predicate, timeout=WAIT, interval=0.2):
        summary = {
            "logs": collections.Counter(r["event_name"] for r in rx.logs()),
            "spans": collections.Counter(s["name"] for s in rx.spans()),
            "metrics": sorted({p["name"] for p in rx.metric_points()}),
        }
        output = f"\njob output:\n{job.tail()}" if job is not None else ""
        pytest.fail(f"timed out waiting for {what}; received: {summary}{output}")


def worker_steps_done(rx: OtlpReceiver, ranks: set[int], restart_count: int = 0) -> bool:
    """Every rank's spans, events and final metric values of the attempt ``restart_count`` have arrived."""

    def done(items: list[dict[str, Any]], rank: int, n: int) -> bool:
        return (
            sum(
                1
                for i in items
                if i["resource"].get("torchelastic.rank") == rank
                and i["resource"].get("torchelastic.restart_count") == restart_count
            )
            >= n
        )

    spans, steps = rx.spans("worker.step"), rx.logs("trainer.step")
    calls = [
        p for p in rx.metric_points("torchelastic.function.calls") if p["attributes"].get("metric_group") == "trainer"
    ]
    calls = [p for p in calls if p["value"] == STEPS]
    return all(done(spans, r, STEPS) and done(steps, r, STEPS) and done(calls, r, 1) for r in ranks)


def one(items: list[dict[str, Any]], what: str = "") -> dict[str, Any]:
    assert len(items) == 1, f"expected exactly one {what}, got {len(items)}: {items}"
    return items[0]


def latest(points: list[dict[str, Any]]) -> dict[str, Any]:
    return max(points, key=lambda p: p["time_unix_nano"])


def points(rx: OtlpReceiver, name: str, **attributes: Any) -> list[dict[str, Any]]:
    return [p for p in rx.metric_points(name) if all(p["attributes"].get(k) == v for k, v in attributes.items())]


def render_span_tree(spans: list[dict[str, Any]]) -> str:
    """A text tree of ``spans`` (parent -> children by start time); repeated worker spans are folded into one line."""
    by_id = {s["span_id"]: s for s in spans}
    children: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    roots = []
    for span in sorted(spans, key=lambda s: s["start_time_unix_nano"]):
        if span["parent_span_id"] in by_id:
            children[span["parent_span_id"]].append(span)
        else:
            roots.append(span)

    def who(span: dict[str, Any]) -> str:
        res = span["resource"]
        if is_worker(span):
            return f"worker rank {res['torchelastic.rank']} restart {res.get('torchelastic.restart_count')}"
        return f"agent pid {res.get('process.pid')}"

    keys = (
        "torchelastic.restart_count",
        "torchelastic.restart.reason",
        "torchelastic.failed_ranks",
        "torchelastic.run.state",
        "torchelastic.state",
    )

    def label(span: dict[str, Any], count: int) -> str:
        attrs = ", ".join(f"{k.split('.', 1)[1]}={span['attributes'][k]}" for k in keys if k in span["attributes"])
        status = " [ERROR]" if span["status_code"] == STATUS_ERROR else ""
        times = f" x{count}" if count > 1 else ""
        events = len(span["events"])
        ev = f" ({events} events)" if events else ""
        return f"{span['name']}{times}{status}  <{who(span)}>{'  ' + attrs if attrs else ''}{ev}"

    lines: list[str] = []

    def walk(span_list: list[dict[str, Any]], prefix: str, top: bool) -> None:
        folded: list[list[Any]] = []  # [first span, count]; leaf spans of one name and process folded
        leaves: dict[tuple[str, str], list[Any]] = {}
        for span in span_list:
            key = (span["name"], who(span))
            if not children.get(span["span_id"]) and key in leaves:
                leaves[key][1] += 1
                continue
            entry = [span, 1]
            folded.append(entry)
            if not children.get(span["span_id"]):
                leaves[key] = entry
        for index, (span, count) in enumerate(folded):
            last_one = index == len(folded) - 1
            connector = "" if top else ("└── " if last_one else "├── ")
            lines.append(prefix + connector + label(span, count))
            walk(children.get(span["span_id"], []), prefix + ("" if top else ("    " if last_one else "│   ")), False)

    for root in roots:
        parent = f" (parent {root['parent_span_id']}: remote)" if root["parent_span_id"] else ""
        lines.append(f"trace {root['trace_id']}{parent}")
        walk([root], "", True)
    return "\n".join(lines)


# ---- the shared assertions of a successful job ----------------------------------------------------------


def wait_for_job_telemetry(rx: OtlpReceiver, job: Job, ranks: set[int], n_runs: int = 1) -> None:
    wait_or_fail(rx, "the agents' run spans", lambda r: len(r.spans("torchelastic.run")) >= n_runs, job)
    wait_or_fail(
        rx,
        "the agents' SUCCEEDED events",
        lambda r: (
            len(
                [
                    x
                    for x in agent_items(r.logs("torchelastic.worker.status.SUCCEEDED"))
                    if x["attributes"].get("torchelastic.source") == "AGENT"
                ]
            )
            >= n_runs
        ),
        job,
    )
    wait_or_fail(rx, f"the workers' telemetry (ranks {sorted(ranks)})", lambda r: worker_steps_done(r, ranks), job)
    wait_or_fail(
        rx,
        "the agents' platform metrics",
        lambda r: (
            len(points(r, "torchelastic.workers.runs")) >= 1
            and len(points(r, "torchelastic.function.duration", function="SimpleElasticAgent._rendezvous")) >= 1
        ),
        job,
    )


def assert_agent_events(rx: OtlpReceiver, run_id: str | None, role: str, nproc: int, group_rank: int = 0) -> None:
    """torch's agent events, as log records of the agent(s)."""
    starts = agent_items(rx.logs("torchelastic.worker.status.START"))
    starts = [s for s in starts if s["attributes"].get("torchelastic.group_rank") == group_rank]
    assert len(starts) == nproc, starts
    for record in starts:
        assert record["severity_number"] == SEVERITY_INFO and record["severity_text"] == "INFO"
        attrs = record["attributes"]
        if run_id is not None:
            assert attrs["torchelastic.run_id"] == run_id
        assert attrs["torchelastic.role"] == role
        assert attrs["torchelastic.source"] == "WORKER"
        assert attrs["torchelastic.state"] == "START"
        assert attrs["torchelastic.rdzv_backend"] == "c10d"
        assert attrs["torchelastic.event.kind"] == "event"
        assert record["time_unix_nano"] > 0  # torch sends 0: the bridge stamps it
        assert record["trace_id"] and record["span_id"]
    assert sorted(s["attributes"]["torchelastic.metadata.local_rank"] for s in starts) == list(range(nproc))
    global_ranks = {s["attributes"]["torchelastic.global_rank"] for s in starts}
    assert len(global_ranks) == nproc

    rendezvous = [r for r in agent_items(rx.logs("torchelastic.worker.status.RENDEZVOUS"))]
    assert rendezvous, "no RENDEZVOUS event"
    assert all(r["severity_text"] == "INFO" and r["attributes"]["torchelastic.source"] == "AGENT" for r in rendezvous)
    assert all(r["attributes"]["torchelastic.duration_ms"] > 0 for r in rendezvous)

    succeeded = [
        r
        for r in agent_items(rx.logs("torchelastic.worker.status.SUCCEEDED"))
        if r["attributes"]["torchelastic.source"] == "AGENT"
    ]
    assert succeeded, "no SUCCEEDED event of the agent"
    for record in succeeded:
        assert record["severity_text"] == "INFO"
        attrs = record["attributes"]
        if run_id is not None:
            assert attrs["torchelastic.run_id"] == run_id
        assert attrs["torchelastic.role"] == role
        assert isinstance(attrs["torchelastic.group_rank"], int)
        assert attrs["torchelastic.metadata.entry_point"]
        assert "torchelastic.metadata" not in attrs  # torch's JSON string was unpacked

    # Rendezvous events: torch drops them (NullHandler) unless bridged.
    rdzv = [r for r in agent_items(rx.logs()) if r["event_name"].startswith("dynamic_rendezvous.py:")]
    names = {r["event_name"] for r in rdzv}
    assert "dynamic_rendezvous.py:DynamicRendezvousHandler.next_rendezvous" in names, names
    assert "dynamic_rendezvous.py:_DistributedRendezvousOpExecutor._mark_rendezvous_complete" in names, names
    for record in rdzv:
        attrs = record["attributes"]
        assert attrs["torchelastic.event.kind"] == "rdzv"
        assert attrs["torchelastic.node_state"]
        if run_id is not None:
            assert attrs["torchelastic.run_id"] == run_id
        assert isinstance(record["body"], str) and record["body"]


def assert_worker_telemetry(rx: OtlpReceiver, run_id: str | None, nproc: int, world_size: int) -> None:
    """The workers' own events and metrics (torch's APIs, bridged in the worker) and their resources."""
    workers = worker_items(rx.logs() + rx.spans() + rx.metric_points())
    ranks = ranks_of(workers)
    assert ranks == set(range(world_size)), ranks
    for item in workers:
        res = item["resource"]
        if run_id is not None:
            assert res["torchelastic.run_id"] == run_id
        assert res["torchelastic.world_size"] == world_size
        assert res["torchelastic.local_world_size"] == nproc
        assert res["torchelastic.local_rank"] in range(nproc)
        assert isinstance(res["torchelastic.restart_count"], int)
        assert res["torchelastic.process.kind"] == "worker"
        assert res["service.name"] == "torchelastic"
    local_ranks = {(i["resource"]["torchelastic.rank"], i["resource"]["torchelastic.local_rank"]) for i in workers}
    assert len(local_ranks) == world_size

    steps = rx.logs("trainer.step")
    assert all(is_worker(s) for s in steps)
    for rank in ranks:
        mine = [s for s in steps if s["resource"]["torchelastic.rank"] == rank]
        assert sorted(s["attributes"]["torchelastic.step"] for s in mine)[:STEPS] == list(range(STEPS))
        assert all(s["attributes"]["torchelastic.rank"] == rank for s in mine)
        assert all(s["attributes"]["torchelastic.source"] == "WORKER" and s["severity_text"] == "INFO" for s in mine)

        loss = [p for p in rx.metric_points("worker.loss") if p["resource"]["torchelastic.rank"] == rank]
        assert loss and all(p["type"] == "gauge" and p["attributes"] == {"metric_group": "trainer"} for p in loss)
        calls = [
            p
            for p in points(rx, "torchelastic.function.calls", metric_group="trainer", outcome="success")
            if p["resource"]["torchelastic.rank"] == rank
        ]
        assert (
            calls and latest(calls)["value"] == STEPS and latest(calls)["attributes"]["function"].endswith("train_step")
        )
        durations = [
            p
            for p in points(rx, "torchelastic.function.duration", metric_group="trainer")
            if p["resource"]["torchelastic.rank"] == rank
        ]
        assert durations and durations[0]["type"] == "histogram" and durations[0]["unit"] == "s"


def assert_agent_metrics(rx: OtlpReceiver, role: str) -> None:
    """torch's platform metrics of the agent, under the bridge's instrument names."""
    agent_points = agent_items(rx.metric_points())
    names = {p["name"] for p in agent_points}
    for name in (
        "torchelastic.function.duration",
        "torchelastic.function.calls",
        "torchelastic.workers.remaining_restarts",
        "torchelastic.workers.state.observations",
        "torchelastic.workers.runs",
    ):
        assert name in names, (name, sorted(names))
    functions = {p["attributes"]["function"] for p in agent_points if p["name"] == "torchelastic.function.duration"}
    assert {"SimpleElasticAgent._rendezvous", "LocalElasticAgent._start_workers", "SimpleElasticAgent.run"} <= functions
    rendezvous = [
        p
        for p in agent_points
        if p["name"] == "torchelastic.function.duration"
        and p["attributes"]["function"] == "SimpleElasticAgent._rendezvous"
    ]
    assert all(p["type"] == "histogram" and p["unit"] == "s" and p["count"] >= 1 for p in rendezvous)
    assert all(p["attributes"]["metric_group"] == "torchelastic" for p in rendezvous)
    assert 0 < latest(rendezvous)["sum"] < 60  # seconds, not milliseconds
    remaining = [p for p in agent_points if p["name"] == "torchelastic.workers.remaining_restarts"]
    assert all(
        p["type"] == "gauge" and p["attributes"] == {"metric_group": "torchelastic", "role": role} for p in remaining
    )
    states = {p["attributes"]["state"] for p in agent_points if p["name"] == "torchelastic.workers.state.observations"}
    assert "succeeded" in states, states
    runs = [p for p in agent_points if p["name"] == "torchelastic.workers.runs"]
    assert all(p["type"] == "sum" and p["is_monotonic"] for p in runs)
    assert latest(runs)["value"] == 1


def assert_trace_tree(rx: OtlpReceiver, run_id: str | None, world_size: int) -> dict[str, Any]:
    """run -> attempt -> {rendezvous, workers.start, worker spans}; one trace; returns the run span."""
    spans = rx.spans()
    by_id = {s["span_id"]: s for s in spans}
    run = one(rx.spans("torchelastic.run"), "torchelastic.run span")
    assert not is_worker(run)
    assert run["status_code"] in STATUS_OK_OR_UNSET
    assert run["attributes"]["torchelastic.run.state"] == "SUCCEEDED"
    if run_id is not None:
        assert run["attributes"]["torchelastic.run_id"] == run_id
    trace_id = run["trace_id"]
    assert all(s["trace_id"] == trace_id for s in spans), collections.Counter((s["name"], s["trace_id"]) for s in spans)
    run_ids = {run["attributes"]["torchelastic.run_id"]} | {
        i["resource"]["torchelastic.run_id"] for i in worker_items(spans)
    }
    assert len(run_ids) == 1
    expected_trace, expected_parent = derived_ids(run_ids.pop())
    assert (trace_id, run["parent_span_id"]) == (expected_trace, expected_parent)
    assert run["parent_span_id"] not in by_id  # the synthetic remote parent is never exported

    attempt = one(rx.spans("torchelastic.attempt"), "attempt span")
    assert attempt["parent_span_id"] == run["span_id"]
    assert attempt["attributes"]["torchelastic.restart_count"] == 0
    for name in ("torchelastic.rendezvous", "torchelastic.workers.start"):
        span = one(rx.spans(name), name)
        assert span["parent_span_id"] == attempt["span_id"], name
        assert not is_worker(span)
    start = one(rx.spans("torchelastic.workers.start"))
    assert len(start["attributes"]["torchelastic.worker_pids"]) == world_size
    rendezvous = one(rx.spans("torchelastic.rendezvous"))
    assert any(e["name"].startswith("dynamic_rendezvous.py:") for e in rendezvous["events"])

    worker_spans = worker_items(spans)
    assert {s["name"] for s in worker_spans} == {"worker.step", "torchelastic.worker.start"}
    assert all(s["parent_span_id"] == attempt["span_id"] for s in worker_spans)
    # No worker span starts before its parent (torchelastic.worker.start begins at the process start).
    assert all(s["start_time_unix_nano"] >= attempt["start_time_unix_nano"] for s in worker_spans)
    assert all(s["end_time_unix_nano"] <= attempt["end_time_unix_nano"] for s in worker_spans)
    for rank in range(world_size):
        mine = [s for s in worker_spans if s["resource"]["torchelastic.rank"] == rank]
        assert collections.Counter(s["name"] for s in mine) == {"worker.step": STEPS, "torchelastic.worker.start": 1}
    # The workers' events are inside their worker.step spans.
    step_span_ids = {s["span_id"] for s in worker_spans if s["name"] == "worker.step"}
    assert all(r["trace_id"] == trace_id and r["span_id"] in step_span_ids for r in rx.logs("trainer.step"))
    # The agent's worker-status records belong to the same trace.
    assert all(r["trace_id"] == trace_id for r in rx.logs("torchelastic.worker.status.START"))
    return run


# ---- the routes -----------------------------------------------------------------------------------------


def test_torchelastic_otel_run_route(jobs: Callable[..., Job]) -> None:
    """``torchelastic-otel run``: agent events, rendezvous events, platform metrics, worker telemetry, trace tree."""
    run_id = unique_id("route-cli")
    with OtlpReceiver() as rx:
        job = bridged_run(jobs, rx, run_id)
        assert job.returncode == 0, job.tail()
        wait_for_job_telemetry(rx, job, {0, 1})

        assert_agent_events(rx, run_id, role="default", nproc=2)
        assert_agent_metrics(rx, role="default")
        assert_worker_telemetry(rx, run_id, nproc=2, world_size=2)
        run = assert_trace_tree(rx, run_id, world_size=2)
        assert run["resource"]["process.pid"] == job.pid  # the console script is the agent
        assert derived_ids(run_id)[0] == run["trace_id"]
        assert {i["resource"]["process.pid"] for i in agent_items(rx.logs() + rx.spans())} == {job.pid}


def test_python_m_run_route_standalone(jobs: Callable[..., Job]) -> None:
    """``python -m torchelastic_otel.run --standalone``: torch makes up the run id; the trace is still derived from
    it."""
    with OtlpReceiver() as rx:
        cmd = [sys.executable, "-m", "torchelastic_otel.run", "--standalone", "--nproc-per-node", "1",
               "--monitor-interval", "0.1", WORKER, "--steps", str(STEPS)]  # fmt: skip
        job = run_job(jobs, cmd, otlp_env(rx))
        assert job.returncode == 0, job.tail()
        wait_for_job_telemetry(rx, job, {0})

        assert_agent_events(rx, None, role="default", nproc=1)
        assert_worker_telemetry(rx, None, nproc=1, world_size=1)
        run = assert_trace_tree(rx, None, world_size=1)
        generated = run["attributes"]["torchelastic.run_id"]
        assert generated not in ("", "none")
        uuid.UUID(generated)  # torch's --standalone run id
        assert {
            r["attributes"]["torchelastic.run_id"] for r in agent_items(rx.logs("torchelastic.worker.status.START"))
        } == {generated}


def test_opentelemetry_instrument_route(jobs: Callable[..., Job]) -> None:
    """``opentelemetry-instrument torchrun ...``: the instrumentor entry point bridges the agent and the workers."""
    run_id = unique_id("route-instrument")
    with OtlpReceiver() as rx:
        env = otlp_env(rx, OTEL_TRACES_EXPORTER="otlp", OTEL_METRICS_EXPORTER="otlp", OTEL_LOGS_EXPORTER="otlp")
        cmd = [OTEL_INSTRUMENT, TORCHRUN, "--nproc-per-node", "2", *c10d_args(run_id), WORKER, "--steps", str(STEPS)]
        job = run_job(jobs, cmd, env)
        assert job.returncode == 0, job.tail()
        wait_for_job_telemetry(rx, job, {0, 1})

        assert_agent_events(rx, run_id, role="default", nproc=2)
        assert_agent_metrics(rx, role="default")
        assert_worker_telemetry(rx, run_id, nproc=2, world_size=2)
        assert_trace_tree(rx, run_id, world_size=2)


def test_custom_launcher_route(jobs: Callable[..., Job]) -> None:
    """``examples/my_launcher.py`` (torch's custom-launcher example plus ``torchelastic_otel.install()``)."""
    run_id = unique_id("route-launcher")
    with OtlpReceiver() as rx:
        cmd = [sys.executable, LAUNCHER, "--nproc-per-node", "2", "--run-id", run_id, WORKER, "--steps", str(STEPS)]
        job = run_job(jobs, cmd, otlp_env(rx))
        assert job.returncode == 0, job.tail()
        assert "worker 0 return value is:" in job.output()
        wait_or_fail(rx, "the run span", lambda r: len(r.spans("torchelastic.run")) >= 1, job)
        wait_or_fail(rx, "the workers' telemetry", lambda r: worker_steps_done(r, {0, 1}), job)
        wait_or_fail(rx, "agent metrics", lambda r: len(points(r, "torchelastic.workers.runs")) >= 1, job)

        # The launcher records no SUCCEEDED event of its own (torch's launch_agent does); the rest is the same.
        starts = agent_items(rx.logs("torchelastic.worker.status.START"))
        assert len(starts) == 2 and all(s["attributes"]["torchelastic.role"] == "trainer" for s in starts)
        assert agent_items(rx.logs("dynamic_rendezvous.py:DynamicRendezvousHandler.next_rendezvous"))
        assert_agent_metrics(rx, role="trainer")
        assert_worker_telemetry(rx, run_id, nproc=2, world_size=2)
        assert {i["resource"]["torchelastic.role"] for i in worker_items(rx.spans())} == {"trainer"}
        run = assert_trace_tree(rx, run_id, world_size=2)
        assert run["attributes"]["torchelastic.role"] == "trainer"
        assert run["resource"]["process.pid"] == job.pid
        assert run["resource"]["torchelastic.run_id"] == run_id  # the launcher sets it before install()


# ---- failures ---------------------------------------------------------------------------------------------


def test_worker_fails_once_and_the_group_restarts(jobs: Callable[..., Job]) -> None:
    """Rank 1 raises in attempt 0, ``--max-restarts 1``: failure, restart and the second attempt in one trace."""
    run_id = unique_id("restart")
    with OtlpReceiver() as rx:
        job = bridged_run(jobs, rx, run_id, "--fail-once-rank", "1", restarts=1)
        assert job.returncode == 0, job.tail()
        wait_or_fail(rx, "the run span", lambda r: len(r.spans("torchelastic.run")) >= 1, job)
        wait_or_fail(rx, "attempt 1 of the workers", lambda r: worker_steps_done(r, {0, 1}, restart_count=1), job)
        wait_or_fail(rx, "the worker's exception", lambda r: len(r.logs("torchelastic.worker.exception")) >= 1, job)
        wait_or_fail(rx, "the restart counter", lambda r: len(points(r, "torchelastic.workers.restarts")) >= 1, job)

        spans = rx.spans()
        print("\n" + render_span_tree(spans))
        by_id = {s["span_id"]: s for s in spans}
        run = one(rx.spans("torchelastic.run"))
        trace_id = run["trace_id"]
        assert trace_id == derived_ids(run_id)[0]
        assert all(s["trace_id"] == trace_id for s in spans)
        assert run["status_code"] in STATUS_OK_OR_UNSET
        assert run["attributes"]["torchelastic.restart_count"] == 1

        restart = one(rx.spans("torchelastic.restart"), "restart span")
        assert restart["parent_span_id"] == run["span_id"]
        assert restart["attributes"]["torchelastic.restart_count"] == 1
        assert restart["attributes"]["torchelastic.restart.reason"] == "failure"
        assert restart["attributes"]["torchelastic.remaining_restarts"] == 0

        attempts = sorted(rx.spans("torchelastic.attempt"), key=lambda s: s["attributes"]["torchelastic.restart_count"])
        assert [a["attributes"]["torchelastic.restart_count"] for a in attempts] == [0, 1]
        first, second = attempts
        assert first["parent_span_id"] == run["span_id"] and first["status_code"] == STATUS_ERROR
        assert second["parent_span_id"] == restart["span_id"] and second["status_code"] in STATUS_OK_OR_UNSET
        assert first["end_time_unix_nano"] <= second["start_time_unix_nano"]

        failure = one(rx.spans("torchelastic.workers.failure"), "failure span")
        assert failure["status_code"] == STATUS_ERROR
        assert failure["parent_span_id"] == first["span_id"]
        assert failure["attributes"]["torchelastic.failed_ranks"] == [1]
        assert [e["name"] for e in failure["events"]] == ["torchelastic.worker.failure", "torchelastic.root_cause"]
        stop = one(rx.spans("torchelastic.workers.stop"), "stop span")
        assert stop["parent_span_id"] == restart["span_id"]

        # Every worker span hangs under the attempt it belongs to.
        for span in worker_items(spans):
            attempt = by_id[span["parent_span_id"]]
            assert attempt["name"] == "torchelastic.attempt"
            assert attempt["attributes"]["torchelastic.restart_count"] == span["resource"]["torchelastic.restart_count"]
            assert attempt["start_time_unix_nano"] <= span["start_time_unix_nano"]
        assert {
            (s["resource"]["torchelastic.rank"], s["resource"]["torchelastic.restart_count"])
            for s in worker_items(rx.spans("torchelastic.worker.start"))
        } == {(0, 0), (1, 0), (0, 1), (1, 1)}

        restart_record = one(agent_items(rx.logs("torchelastic.restart")), "restart record")
        assert restart_record["severity_text"] == "WARN" and restart_record["severity_number"] == SEVERITY_WARN
        assert restart_record["attributes"]["torchelastic.restart_count"] == 1
        assert restart_record["attributes"]["torchelastic.run_id"] == run_id
        assert restart_record["span_id"] == restart["span_id"]

        exception = one(rx.logs("torchelastic.worker.exception"), "worker exception record")
        assert exception["severity_text"] == "ERROR" and exception["severity_number"] == SEVERITY_ERROR
        assert exception["resource"]["torchelastic.rank"] == 1
        assert exception["resource"]["torchelastic.restart_count"] == 0
        assert exception["attributes"]["exception.type"] == "RuntimeError"
        assert exception["attributes"]["exception.message"] == "torchrun_worker rank 1 failed (restart 0)"
        assert "Traceback" in exception["attributes"]["exception.stacktrace"]
        assert exception["trace_id"] == trace_id and exception["span_id"] == first["span_id"]

        agent_failure = one(agent_items(rx.logs("torchelastic.worker.failure")), "agent failure record")
        assert agent_failure["severity_text"] == "ERROR"
        assert agent_failure["attributes"]["torchelastic.global_rank"] == 1
        assert agent_failure["attributes"]["exception.message"] == "torchrun_worker rank 1 failed (restart 0)"

        restarts = points(rx, "torchelastic.workers.restarts", role="default")
        assert restarts and latest(restarts)["type"] == "sum" and latest(restarts)["value"] == 1
        assert latest(points(rx, "torchelastic.workers.runs"))["value"] == 1
        assert "failed" in {p["attributes"]["state"] for p in points(rx, "torchelastic.workers.state.observations")}
        assert {(i["resource"]["torchelastic.rank"], i["resource"]["torchelastic.restart_count"])
                for i in worker_items(rx.logs("trainer.step"))} == {(0, 0), (1, 0), (0, 1), (1, 1)}  # fmt: skip


def test_worker_fails_always(jobs: Callable[..., Job]) -> None:
    """Rank 1 always raises, no restarts: torchrun fails; FAILED events (ERROR, exception.*), run span ERROR."""
    run_id = unique_id("fail-always")
    with OtlpReceiver() as rx:
        job = bridged_run(jobs, rx, run_id, "--fail-always-rank", "1", restarts=0)
        assert job.returncode != 0, job.tail()
        wait_or_fail(rx, "the run span", lambda r: len(r.spans("torchelastic.run")) >= 1, job)
        wait_or_fail(rx, "the FAILED event", lambda r: len(r.logs("torchelastic.worker.status.FAILED")) >= 1, job)
        wait_or_fail(rx, "the worker's exception", lambda r: len(r.logs("torchelastic.worker.exception")) >= 1, job)

        failed = one(agent_items(rx.logs("torchelastic.worker.status.FAILED")), "FAILED worker event")
        assert failed["severity_number"] == SEVERITY_ERROR and failed["severity_text"] == "ERROR"
        attrs = failed["attributes"]
        assert attrs["torchelastic.global_rank"] == 1 and attrs["torchelastic.run_id"] == run_id
        if torch_events_have_exit_code():
            assert attrs["torchelastic.metadata.exit_code"] != 0
        else:
            assert "torchelastic.metadata.exit_code" not in attrs
        assert attrs["exception.type"] == "RuntimeError"
        assert attrs["exception.message"] == "torchrun_worker rank 1 failed (restart 0)"
        assert "raise RuntimeError" in attrs["exception.stacktrace"]

        run = one(rx.spans("torchelastic.run"))
        assert run["status_code"] == STATUS_ERROR
        assert run["attributes"]["torchelastic.failed_ranks"] == [1]
        assert run["attributes"]["torchelastic.run.state"] == "FAILED"
        assert run["trace_id"] == derived_ids(run_id)[0]
        assert "torchelastic.worker.status.FAILED" in [e["name"] for e in run["events"]]
        assert one(rx.spans("torchelastic.attempt"))["status_code"] == STATUS_ERROR
        assert not rx.spans("torchelastic.restart")

        exception = one(rx.logs("torchelastic.worker.exception"), "worker exception record")
        assert exception["resource"]["torchelastic.rank"] == 1
        assert exception["severity_text"] == "ERROR"
        assert exception["attributes"]["exception.message"] == "torchrun_worker rank 1 failed (restart 0)"
        assert exception["trace_id"] == run["trace_id"]

        assert "failed" in {p["attributes"]["state"] for p in points(rx, "torchelastic.workers.state.observations")}


# ---- two agents -------------------------------------------------------------------------------------------


def test_two_agents_share_one_trace(jobs: Callable[..., Job]) -> None:
    """Two torchrun agents ("nodes") on one c10d rendezvous: one trace derived from the run id, two run spans."""
    run_id = unique_id("two-nodes")
    with OtlpReceiver() as rx:
        env = otlp_env(rx)
        args = c10d_args(run_id, free_port())
        cmd = [TORCHELASTIC_OTEL, "run", "--nnodes", "2", "--nproc-per-node", "1", *args, WORKER, "--steps", str(STEPS)]
        nodes = [jobs(cmd, env), jobs(cmd, env)]
        for node in nodes:
            node.wait()
        assert [n.returncode for n in nodes] == [0, 0], "\n----\n".join(n.tail() for n in nodes)
        wait_for_job_telemetry(rx, nodes[0], {0, 1}, n_runs=2)

        spans = rx.spans()
        runs = rx.spans("torchelastic.run")
        assert len(runs) == 2
        assert {r["resource"]["process.pid"] for r in runs} == {n.pid for n in nodes}
        expected_trace, expected_parent = derived_ids(run_id)
        assert all(s["trace_id"] == expected_trace for s in spans)
        assert all(r["parent_span_id"] == expected_parent for r in runs)

        # Each agent's tree, and each worker under its own agent's attempt.
        attempts = {a["resource"]["process.pid"]: a for a in rx.spans("torchelastic.attempt")}
        assert set(attempts) == {n.pid for n in nodes}
        for run in runs:
            assert attempts[run["resource"]["process.pid"]]["parent_span_id"] == run["span_id"]
        for span in worker_items(spans):
            assert span["parent_span_id"] in {a["span_id"] for a in attempts.values()}
        group_of_attempt = {a["span_id"]: a for a in attempts.values()}
        workers = worker_items(spans)
        assert {(w["resource"]["torchelastic.group_rank"], w["resource"]["torchelastic.rank"]) for w in workers} == {
            (0, 0),
            (1, 1),
        }
        # A worker's attempt span is the one of the agent that started it (one worker per agent).
        by_attempt = collections.defaultdict(set)
        for w in workers:
            by_attempt[group_of_attempt[w["parent_span_id"]]["span_id"]].add(w["resource"]["torchelastic.group_rank"])
        assert sorted(by_attempt.values(), key=sorted) == [{0}, {1}]

        assert_worker_telemetry(rx, run_id, nproc=1, world_size=2)
        for group_rank in (0, 1):
            assert_agent_events(rx, run_id, role="default", nproc=1, group_rank=group_rank)


# ---- install / uninstall in this process ------------------------------------------------------------------

_KEEP_ALIVE: list[Any] = []  # self-telemetry registers per id(meter_provider): never let an id be reused


def _torch_state() -> dict[str, Any]:
    """Everything of torch's (and of the environment) that install() may change, by identity."""
    import torch.distributed.elastic.events as torch_events
    import torch.distributed.elastic.events.handlers as torch_handlers
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.metrics import api as torch_metrics
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend, dynamic_rendezvous

    from torchelastic_otel._torch.worker_env import worker_environ

    state: dict[str, Any] = {
        "_log_handlers": dict(torch_handlers._log_handlers),
        "MetricStream.add_value": torch_metrics.MetricStream.__dict__.get("add_value"),
        # What the workers get (never this process's own os.environ: see the test's environment check).
        "workers' PYTHONPATH": worker_environ().get("PYTHONPATH"),
        "workers' TORCHELASTIC_OTEL_AUTO_INSTALL": worker_environ().get("TORCHELASTIC_OTEL_AUTO_INSTALL"),
    }
    for cls, names in (
        (SimpleElasticAgent, ("run", "_initialize_workers", "_rendezvous", "_restart_workers")),
        (LocalElasticAgent, ("_start_workers", "_monitor_workers", "_stop_workers", "_shutdown")),
    ):
        for name in names:
            state[f"{cls.__name__}.{name}"] = cls.__dict__.get(name)
    for module in (torch_events, dynamic_rendezvous, c10d_rendezvous_backend):
        state[f"{module.__name__}.construct_and_record_rdzv_event"] = module.__dict__.get(
            "construct_and_record_rdzv_event"
        )
    state["dynamic_rendezvous.get_method_name"] = dynamic_rendezvous.__dict__.get("get_method_name")
    for destination in ("null", "console"):
        state[f"logger[{destination}].handlers"] = list(torch_events._get_or_create_logger(destination).handlers)
    state.update(_worker_state())
    return state


def _worker_state() -> dict[str, Any]:
    """What install() changes only in a torchrun worker (RANK and TORCHELASTIC_RUN_ID in the environment)."""
    return {
        "sys.excepthook": sys.excepthook,
        "SIGTERM handler": signal.getsignal(signal.SIGTERM),
        "wakeup fd": _wakeup_fd(),
        "threads": sorted(t.name for t in threading.enumerate() if t.name.startswith("torchelastic-otel-sigterm")),
    }


def _wakeup_fd() -> str:
    """The signal wakeup fd (read by setting it back at once), as a string so ``_same`` compares it by value."""
    current = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(current)
    return str(current)


def _same(a: Any, b: Any) -> bool:
    """Identity, element-wise for the containers ``_torch_state`` makes."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(a[k] is b[k] for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))
    return a is b or (isinstance(a, str) and a == b)


@pytest.mark.parametrize("as_worker", [False, True], ids=["agent", "worker"])
def test_install_uninstall_is_symmetric_and_idempotent(monkeypatch: pytest.MonkeyPatch, as_worker: bool) -> None:
    import torch.distributed.elastic.metrics as torch_metrics
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from torch.distributed.elastic.metrics import api as torch_metrics_api

    import torchelastic_otel
    from torchelastic_otel import pipeline
    from torchelastic_otel._install import BOOTSTRAP_DIR

    for var in ("RANK", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_OTEL_AUTO_INSTALL", "TRACEPARENT"):
        monkeypatch.delenv(var, raising=False)
    if as_worker:
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "symmetry")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/some/where", "/else"]))
    assert not torchelastic_otel.is_installed(), "another test left the bridge installed"

    reader = InMemoryMetricReader()
    providers = (TracerProvider(), MeterProvider(metric_readers=[reader]), LoggerProvider())
    _KEEP_ALIVE.extend(providers)

    class UserHandler(torch_metrics.MetricHandler):
        def __init__(self) -> None:
            self.values: list[tuple[str, str, Any]] = []

        def emit(self, metric_data: Any) -> None:
            self.values.append((metric_data.group_name, metric_data.name, metric_data.value))

    group = unique_id("user-group")
    user = UserHandler()
    saved_metrics_map = dict(torch_metrics_api._metrics_map)

    def exported(name: str) -> list[tuple[dict, Any]]:
        torchelastic_otel.flush()
        data = reader.get_metrics_data()
        found = []
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == name:
                        found.extend((dict(p.attributes), p) for p in metric.data.data_points)
        return found

    before = _torch_state()
    environ_before = dict(os.environ)
    try:
        assert torchelastic_otel.install(*providers) is True
        installed = _torch_state()
        assert torchelastic_otel.install() is True  # idempotent: nothing changes a second time
        assert torchelastic_otel.install(*providers) is True
        assert torchelastic_otel.is_installed()
        again = _torch_state()
        for key in before:
            assert _same(installed[key], again[key]), f"second install() changed {key}"

        changed = {key for key in before if not _same(before[key], installed[key])}
        worker_only = set(_worker_state())
        expected = set(before) if as_worker else set(before) - worker_only
        assert changed == expected, f"install() changed {sorted(changed)}, expected {sorted(expected)}"
        assert "otel" in installed["_log_handlers"] and "otel" not in before["_log_handlers"]
        assert installed["workers' PYTHONPATH"].split(os.pathsep) == [BOOTSTRAP_DIR, "/some/where", "/else"]
        assert installed["workers' TORCHELASTIC_OTEL_AUTO_INSTALL"] == "1"
        if not as_worker:  # an agent or launcher (a worker's set-up is the workers' business)
            assert dict(os.environ) == environ_before, "install() changed this process's environment"

        # torch's own metric API reaches the meter provider given to install(), for any group...
        torch_metrics.put_metric("inproc.value", 7, "inproc")
        got = exported("inproc.value")
        assert [(attrs, p.value) for attrs, p in got] == [({"metric_group": "inproc"}, 7)]

        # ... and a handler the user configures afterwards still receives every value.
        torch_metrics.configure(user, group)
        torch_metrics.put_metric("user.value", 3, group)
        assert user.values == [(group, "user.value", 3)]
        got = exported("user.value")
        assert [(attrs, p.value) for attrs, p in got] == [({"metric_group": group}, 3)]

        @torch_metrics.prof(group=group)
        def profiled() -> None:
            pass

        profiled()
        calls = [attrs for attrs, p in exported("torchelastic.function.calls") if attrs.get("metric_group") == group]
        assert calls and calls[0]["outcome"] == "success" and calls[0]["function"].endswith("profiled")
        assert (group, f"{profiled.__qualname__}.success", 1) in user.values
    finally:
        torchelastic_otel.uninstall()
        after = _torch_state()
        torchelastic_otel.uninstall()  # a no-op
        again_after = _torch_state()
        torch_metrics_api._metrics_map.clear()
        torch_metrics_api._metrics_map.update(saved_metrics_map)
        pipeline._reset_for_tests()

    assert not torchelastic_otel.is_installed()
    if not as_worker:
        assert dict(os.environ) == environ_before
    for key in before:
        assert _same(before[key], after[key]), f"uninstall() did not restore {key}: {before[key]!r} -> {after[key]!r}"
        assert _same(after[key], again_after[key]), f"second uninstall() changed {key}"

    # Uninstalled: the user's handler still works, nothing reaches the bridge's provider any more.
    user.values.clear()
    torch_metrics.configure(user, group)
    try:
        torch_metrics.put_metric("after.value", 5, group)
    finally:
        torch_metrics_api._metrics_map.pop(group, None)
    assert user.values == [(group, "after.value", 5)]
    providers[1].force_flush()
    data = reader.get_metrics_data()
    names = {m.name for rm in (data.resource_metrics if data else ()) for sm in rm.scope_metrics for m in sm.metrics}
    assert "after.value" not in names


# ---- SIGTERM while a worker flushes ------------------------------------------------------------------------

_SIGTERM_CHILD = r"""
import os, signal, sys, threading, time
os.environ.update(RANK="0", LOCAL_RANK="0", TORCHELASTIC_RUN_ID="sigterm-during-flush")
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
import torchelastic_otel

class SlowSpans(SpanExporter):
    def export(self, spans):
        print("EXPORT_START", flush=True)
        time.sleep(1.0)  # the agent's SIGTERM arrives meanwhile
        print("EXPORT_END", flush=True)
        return SpanExportResult.SUCCESS

class PrintLogs(LogRecordExporter):
    def export(self, batch):
        for data in batch:
            print("LOG", data.log_record.event_name, flush=True)
        return LogRecordExportResult.SUCCESS
    def shutdown(self):
        pass
    def force_flush(self, timeout_millis=30000):
        return True

tracer_provider = TracerProvider()
tracer_provider.add_span_processor(BatchSpanProcessor(SlowSpans(), schedule_delay_millis=60000))
logger_provider = LoggerProvider()
logger_provider.add_log_record_processor(SimpleLogRecordProcessor(PrintLogs()))
torchelastic_otel.install(tracer_provider, MeterProvider(), logger_provider, propagate_to_workers=False)
tracer_provider.get_tracer("t").start_span("last.step").end()
threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
torchelastic_otel.flush()  # what a worker does before os._exit
print("FLUSH_RETURNED", flush=True)
"""


def test_sigterm_during_a_worker_flush_ends_the_worker(tmp_path: Path) -> None:
    """The agent's SIGTERM may interrupt a worker's own flush: the worker exports ``torchelastic.worker.terminated``,
    lets the interrupted export finish within its exit budget and ends by SIGTERM, instead of deadlocking on the
    SDK's export lock (the provider flushes run in a helper thread; the main thread only waits, bounded)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _SIGTERM_CHILD], env=clean_env(), cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        pytest.fail(f"the worker hung after SIGTERM during a flush:\n{output[-3000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = output.splitlines()
    assert proc.returncode == -signal.SIGTERM, output[-3000:]
    assert "EXPORT_END" in lines and "FLUSH_RETURNED" not in lines, output[-3000:]
    assert "LOG torchelastic.worker.terminated" in lines, output[-3000:]


# ---- what install() imports -------------------------------------------------------------------------------------

_IMPORTS_CHILD = r"""
import json, sys
import torchelastic_otel
installed = torchelastic_otel.install(propagate_to_workers=False)
state = {
    "installed": installed,
    "rendezvous": "torch.distributed.elastic.rendezvous.dynamic_rendezvous" in sys.modules,
    "agent": "torch.distributed.elastic.agent.server.api" in sys.modules,
    "etcd": "torch.distributed.elastic.rendezvous.etcd_rendezvous_backend" in sys.modules,
}
import torch.distributed.elastic.rendezvous.dynamic_rendezvous as dynamic_rendezvous
from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
state["rdzv_bridged"] = getattr(dynamic_rendezvous.construct_and_record_rdzv_event, "__torchelastic_otel__", False)
state["agent_bridged"] = getattr(SimpleElasticAgent.__dict__["run"], "__torchelastic_otel__", False)
print(json.dumps(state))
"""


@pytest.mark.parametrize("as_worker", [False, True], ids=["agent", "worker"])
def test_a_worker_does_not_import_the_agent_and_rendezvous_modules(as_worker: bool) -> None:
    """A worker pays start-up time for every module the bridge imports: torch's agent and rendezvous modules
    (~150 ms) are not imported in a worker. The agent's lifecycle is bridged in a worker only if it imported the
    agent itself before install; a rendezvous module it imports later still records through the bridge (it takes
    ``construct_and_record_rdzv_event`` from torch's events module, which is bridged). An agent bridges them all
    at install. No process imports the etcd backend (and urllib3) for the bridge's sake: it records no events."""
    env = clean_env(OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none")
    if as_worker:
        env.update(RANK="0", LOCAL_RANK="0", TORCHELASTIC_RUN_ID="imports")
    result = subprocess.run([sys.executable, "-c", _IMPORTS_CHILD], env=env, cwd=ROOT, capture_output=True,
                            text=True, timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    bridged = not as_worker
    assert got == {"installed": True, "rendezvous": bridged, "agent": bridged, "etcd": False,
                   "rdzv_bridged": True, "agent_bridged": bridged}  # fmt: skip
