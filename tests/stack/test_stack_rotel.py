"""The bridge's OTLP output passes through a real collector: rotel (``pip install --pre rotel``).

rotel is an OpenTelemetry collector written in Rust; its wheel ships the binary ``rotel/rotel-agent`` (no console
script): ``rotel-agent start --otlp-grpc-endpoint H:P --otlp-http-endpoint H:P --exporter otlp
--otlp-exporter-endpoint http://H:P``. Here it listens on 127.0.0.1 (OTLP gRPC and HTTP) and forwards everything
over OTLP/gRPC to :class:`OtlpReceiver`. What arrived there must be what the bridge sent, intact:

- a real 2-worker torchrun job (``torchelastic-otel run``, worker ``tests/support/workers/_stack_worker.py``, rank 1
  failing once, one restart) exporting over OTLP/gRPC with only ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at rotel: the
  run's trace (agent spans with their span events, the workers' spans in the same trace), the log records with their
  attributes, the metric points with the values the workers reported, and the resource attributes;
- a bridged program (``tests/support/workers/_e2e_child.py``) exporting over OTLP/HTTP to rotel's HTTP receiver.

Every request the receiver got was sent by rotel (its user agent), none by the SDK directly.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, WORKERS, stack
from tests.support.env import clean_env, otlp_env
from tests.support.jobs import TORCHELASTIC_OTEL
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.ports import free_port, listening

STEPS = 4
BATCH = 16
JOB_TIMEOUT = 120.0
WAIT = 30.0
SEVERITY_INFO, SEVERITY_WARN, SEVERITY_ERROR = 9, 13, 17
STATUS_ERROR = 2


@dataclass
class Rotel:
    proc: stack.Proc
    grpc_port: int
    http_port: int

    @property
    def grpc_endpoint(self) -> str:
        return f"http://{stack.HOST}:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        return f"http://{stack.HOST}:{self.http_port}"


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as rx:
        yield rx


@pytest.fixture(scope="module")
def rotel(receiver: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rotel]:
    binary = stack.rotel_bin()
    tmp = tmp_path_factory.mktemp("rotel")
    version = stack.run_tool([binary, "--version"], timeout=20)
    assert version.returncode == 0 and "rotel" in version.stdout, version
    for _ in range(5):  # ports are picked free but could be taken before rotel binds them
        grpc_port, http_port = free_port(), free_port()
        cmd = [
            binary, "start",
            "--otlp-grpc-endpoint", f"{stack.HOST}:{grpc_port}",
            "--otlp-http-endpoint", f"{stack.HOST}:{http_port}",
            "--exporter", "otlp",
            "--otlp-exporter-endpoint", receiver.grpc_endpoint,
            "--otlp-exporter-protocol", "grpc",
            "--batch-timeout", "100ms",
            "--pid-file", str(tmp / "rotel.pid"),
            "--log-file", str(tmp / "rotel-daemon.log"),
        ]  # fmt: skip
        proc = stack.start(cmd, tmp / "rotel.log", env=clean_env())
        try:
            deadline = time.monotonic() + 15
            while proc.running() and time.monotonic() < deadline:
                if listening(grpc_port) and listening(http_port):
                    break
                time.sleep(0.05)
            if proc.running() and listening(grpc_port) and listening(http_port):
                yield Rotel(proc, grpc_port, http_port)
                assert proc.running(), f"rotel died during the test:\n{proc.output()}"
                return
            if "in use" not in proc.output():
                pytest.fail(f"rotel did not start listening:\n{proc.output()}")
        finally:
            proc.stop()
    pytest.fail("rotel could not bind free ports")


def _through_rotel(receiver: OtlpReceiver) -> None:
    agents = {r.headers.get("user-agent", "") for r in receiver.raw_requests()}
    assert agents and all(a.startswith("Rotel") for a in agents), agents


# ---- a torchrun job through rotel ----------------------------------------------------------------------------------


@dataclass
class JobResult:
    reports: dict[tuple[int, int], dict[str, Any]]
    output: str


@pytest.fixture(scope="module")
def job_through_rotel(rotel: Rotel, receiver: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory) -> JobResult:
    receiver.clear()
    tmp = tmp_path_factory.mktemp("rotel_job")
    flags = tmp / "flags"
    flags.mkdir()
    env = clean_env(
        OTEL_EXPORTER_OTLP_ENDPOINT=rotel.grpc_endpoint,  # the only exporter setting: grpc, otlp for all signals
        OTEL_METRIC_EXPORT_INTERVAL="1000",
        OTEL_BSP_SCHEDULE_DELAY="200",
        OTEL_BLRP_SCHEDULE_DELAY="200",
    )
    cmd = [
        TORCHELASTIC_OTEL, "run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
        "--monitor-interval", "0.1",
        stack.WORKER, "--flag-dir", flags, "--steps", str(STEPS), "--wait", "0", "--fail-once-rank", "1",
    ]  # fmt: skip
    job = stack.start(cmd, tmp / "job.log", env=env)
    try:
        returncode = job.wait(JOB_TIMEOUT)
    finally:
        job.stop()
    assert returncode == 0, job.output()
    reports = {}
    for path in flags.glob("ready-r*-rank*.json"):
        report = json.loads(path.read_text())
        reports[(report["restart"], report["rank"])] = report
    assert set(reports) == {(0, 0), (0, 1), (1, 0), (1, 1)}, job.output()

    def complete(rx: OtlpReceiver) -> bool:
        steps = collections.Counter(
            (s["resource"].get("torchelastic.restart_count"), s["resource"].get("torchelastic.rank"))
            for s in rx.spans("trainer.step")
        )
        outcomes = [p for p in rx.metric_points("torchelastic.workers.run_outcomes")]
        return (
            len(rx.spans("torchelastic.run")) == 1
            and all(steps[key] == STEPS for key in reports)
            and all(_last_point(rx, "samples_total", *key) is not None for key in reports)
            and bool(outcomes)
            and len(rx.logs("trainer.step")) >= 4 * STEPS
        )

    if not receiver.wait_for(complete, timeout=WAIT, interval=0.2):
        summary = {
            "spans": collections.Counter(s["name"] for s in receiver.spans()),
            "logs": collections.Counter(r["event_name"] for r in receiver.logs()),
            "metrics": sorted({p["name"] for p in receiver.metric_points()}),
        }
        pytest.fail(f"not everything arrived through rotel: {summary}\n{rotel.proc.output()}\n{job.output()}")
    return JobResult(reports, job.output())


def _worker_points(rx: OtlpReceiver, name: str, restart: int, rank: int) -> list[dict[str, Any]]:
    return [
        p for p in rx.metric_points(name)
        if p["resource"].get("torchelastic.restart_count") == restart and p["resource"].get("torchelastic.rank") == rank
    ]  # fmt: skip


def _last_point(rx: OtlpReceiver, name: str, restart: int, rank: int) -> dict[str, Any] | None:
    points = _worker_points(rx, name, restart, rank)
    return max(points, key=lambda p: p["time_unix_nano"]) if points else None


def test_trace_passes_rotel_intact(job_through_rotel: JobResult, receiver: OtlpReceiver) -> None:
    _through_rotel(receiver)
    (run,) = receiver.spans("torchelastic.run")
    run_id = run["attributes"]["torchelastic.run_id"]
    assert run["attributes"]["torchelastic.max_restarts"] == 1
    trace_id = run["trace_id"]
    attempts = receiver.spans("torchelastic.attempt")
    assert sorted(a["attributes"]["torchelastic.restart_count"] for a in attempts) == [0, 1]
    (restart,) = receiver.spans("torchelastic.restart")
    assert restart["parent_span_id"] == run["span_id"]
    assert [e["name"] for e in restart["events"]] == ["torchelastic.restart"]
    assert restart["events"][0]["attributes"]["torchelastic.restart_count"] == 1
    rendezvous = receiver.spans("torchelastic.rendezvous")
    assert len(rendezvous) == 2 and all(r["events"] for r in rendezvous)  # rendezvous events as span events
    failures = receiver.spans("torchelastic.workers.failure")
    assert failures and failures[0]["status_code"] == STATUS_ERROR
    failure_events = [e for f in failures for e in f["events"] if e["name"] == "torchelastic.worker.failure"]
    assert failure_events and failure_events[0]["attributes"]["exception.type"] == "RuntimeError"
    steps = receiver.spans("trainer.step")
    assert len(steps) == 4 * STEPS
    attempt_ids = {a["span_id"] for a in attempts}
    for step in steps:
        assert step["trace_id"] == trace_id  # the workers' spans are in the run's trace
        assert [e["name"] for e in step["events"]] == ["trainer.step"]
        assert step["events"][0]["attributes"]["torchelastic.step"] == step["attributes"]["step"]
        assert step["resource"]["torchelastic.run_id"] == run_id
    starts = receiver.spans("torchelastic.worker.start")
    assert {s["parent_span_id"] for s in starts} <= attempt_ids and len(starts) == 4


def test_logs_pass_rotel_intact(job_through_rotel: JobResult, receiver: OtlpReceiver) -> None:
    (run,) = receiver.spans("torchelastic.run")
    steps = receiver.logs("trainer.step")
    by_key = collections.defaultdict(list)
    for record in steps:
        resource = record["resource"]
        by_key[(resource["torchelastic.restart_count"], resource["torchelastic.rank"])].append(record)
        assert record["severity_number"] == SEVERITY_INFO
        assert record["attributes"]["torchelastic.source"] == "WORKER"
        assert record["trace_id"] == run["trace_id"] and record["span_id"]  # logged inside the trainer.step span
    assert {k: len(v) for k, v in by_key.items()} == {k: STEPS for k in job_through_rotel.reports}
    for key, report in job_through_rotel.reports.items():
        last = max(by_key[key], key=lambda r: r["attributes"]["torchelastic.step"])
        assert last["attributes"]["torchelastic.step"] == STEPS - 1
        assert last["attributes"]["torchelastic.loss"] == pytest.approx(report["loss"], rel=1e-12)
    (restart,) = receiver.logs("torchelastic.restart")
    assert restart["severity_number"] == SEVERITY_WARN
    exceptions = receiver.logs("torchelastic.worker.exception")
    assert [(e["resource"]["torchelastic.rank"], e["resource"]["torchelastic.restart_count"]) for e in exceptions] == [
        (1, 0)
    ]
    assert exceptions[0]["severity_number"] == SEVERITY_ERROR
    assert exceptions[0]["attributes"]["exception.type"] == "RuntimeError"
    assert "stack worker rank 1 failed" in exceptions[0]["attributes"]["exception.message"]


def test_metrics_pass_rotel_intact(job_through_rotel: JobResult, receiver: OtlpReceiver) -> None:
    for (restart, rank), report in job_through_rotel.reports.items():
        loss = _last_point(receiver, "loss", restart, rank)
        samples = _last_point(receiver, "samples_total", restart, rank)
        calls = [
            p
            for p in _worker_points(receiver, "torchelastic.function.calls", restart, rank)
            if p["attributes"].get("function") == "__main__.train_step"
        ]
        assert loss is not None and loss["value"] == pytest.approx(report["loss"], rel=1e-12), loss
        assert loss["attributes"] == {"metric_group": "trainer"} and loss["type"] == "gauge"
        assert samples is not None and samples["value"] == BATCH * STEPS and samples["type"] == "sum"
        assert samples["is_monotonic"] is True
        assert calls and max(p["value"] for p in calls) == STEPS
    agent = [p for p in receiver.metric_points() if "torchelastic.rank" not in p["resource"]]
    restarts = [p for p in agent if p["name"] == "torchelastic.workers.restarts"]
    assert restarts and max(p["value"] for p in restarts) == 1 and restarts[0]["attributes"]["role"] == "default"
    outcomes = {
        p["attributes"]["outcome"]: p["value"] for p in agent if p["name"] == "torchelastic.workers.run_outcomes"
    }
    assert outcomes["success_with_retries"] == 1 and outcomes["failed_with_retries"] == 0
    durations = [
        p
        for p in agent
        if p["name"] == "torchelastic.function.duration"
        and p["attributes"]["function"] == "SimpleElasticAgent._rendezvous"
    ]
    assert durations and durations[-1]["type"] == "histogram" and durations[-1]["unit"] == "s"
    assert max(p["count"] for p in durations) == 2


def test_resources_pass_rotel_intact(job_through_rotel: JobResult, receiver: OtlpReceiver) -> None:
    (run,) = receiver.spans("torchelastic.run")
    run_id = run["attributes"]["torchelastic.run_id"]
    items = [*receiver.spans(), *receiver.logs(), *receiver.metric_points()]
    for item in items:
        assert item["resource"]["service.name"] == "torchelastic"
    workers = [i["resource"] for i in items if "torchelastic.rank" in i["resource"]]
    assert {(r["torchelastic.restart_count"], r["torchelastic.rank"]) for r in workers} == set(
        job_through_rotel.reports
    )
    for resource in workers:
        assert resource["torchelastic.run_id"] == run_id
        assert resource["torchelastic.process.kind"] == "worker"
        assert resource["torchelastic.world_size"] == 2 and resource["torchelastic.local_world_size"] == 2
        assert resource["torchelastic.max_restarts"] == 1
        assert resource["torchelastic.local_rank"] == resource["torchelastic.rank"]
        assert isinstance(resource["process.pid"], int) and resource["host.name"]
    agent = [i["resource"] for i in items if "torchelastic.rank" not in i["resource"]]
    assert agent and all(r["process.pid"] == agent[0]["process.pid"] for r in agent)


def test_agent_resource_names_its_run(job_through_rotel: JobResult, receiver: OtlpReceiver) -> None:
    (run,) = receiver.spans("torchelastic.run")
    agent = [p["resource"] for p in receiver.metric_points("torchelastic.workers.restarts")]
    assert agent and agent[0].get("torchelastic.process.kind") == "agent"
    assert agent[0].get("torchelastic.run_id") == run["attributes"]["torchelastic.run_id"]


# ---- a bridged program over OTLP/HTTP through rotel ------------------------------------------------------------------


def test_bridged_program_over_http_through_rotel(rotel: Rotel, receiver: OtlpReceiver, tmp_path: Path) -> None:
    receiver.clear()
    env = otlp_env(
        rotel.http_endpoint, "http/protobuf", pace={}, OTEL_RESOURCE_ATTRIBUTES="deployment.environment=stack-test"
    )
    proc = subprocess.run(
        [sys.executable, str(WORKERS / "_e2e_child.py"), "default"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    line = next(li for li in proc.stdout.splitlines() if li.startswith("E2E_RESULT "))
    result = json.loads(line[len("E2E_RESULT ") :])

    def arrived(rx: OtlpReceiver) -> bool:
        names = {p["name"] for p in rx.metric_points()}
        return bool(rx.spans("e2e.run")) and len(rx.logs()) >= 3 and {"loss", "torchelastic.function.calls"} <= names

    assert receiver.wait_for(arrived, timeout=WAIT), (receiver, rotel.proc.output())
    _through_rotel(receiver)
    (span,) = receiver.spans("e2e.run")
    assert (span["trace_id"], span["span_id"]) == (result["trace_id"], result["span_id"])
    assert [e["name"] for e in span["events"]] == ["e2e.started", "torchelastic.worker.status.FAILED", "e2e.legacy"]
    (failed,) = receiver.logs("torchelastic.worker.status.FAILED")
    assert failed["severity_number"] == SEVERITY_ERROR
    assert failed["attributes"]["exception.type"] == "ValueError"
    assert failed["attributes"]["exception.message"] == "boom at step 7"
    assert failed["attributes"]["torchelastic.metadata.group_world_size"] == 2
    assert (failed["trace_id"], failed["span_id"]) == (result["trace_id"], result["span_id"])
    for item in (span, failed, *receiver.metric_points()):
        assert item["resource"]["deployment.environment"] == "stack-test"
        assert item["resource"]["process.pid"] == result["pid"]
    loss = max(receiver.metric_points("loss"), key=lambda p: p["time_unix_nano"])
    assert loss["value"] == 0.25 and loss["attributes"] == {"metric_group": "app"}
