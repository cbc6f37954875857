"""A worker's final words arrive however it dies: real torchrun jobs (CPU, gloo, 127.0.0.1), bridge-unaware scripts.

Why: a real training script never imports the bridge and records nothing before it fails. Its pipeline was built
lazily on first use, and for such a script the first use was the failure path: the agent's SIGTERM landed inside
that build (importing the gRPC exporter while holding the pipeline's lock), the final words waited for the lock the
interrupted thread held, and the rank died at the end of the exit bound having sent nothing -- neither its
``torchelastic.worker.exception`` nor its ``torchelastic.worker.terminated`` record, 4 runs out of 4.

Now the pipeline is built at start-up in a thread of its own, the final words never build or wait, and what they
cannot send (the pipeline not ready yet, a collector down or silent) is kept where the agent reads it and sends it
(``torchelastic.delivered_by="agent"``).

The worker is ``tests/support/workers/_silent_worker.py``; its modes put the signal everywhere a real rank can be: still
starting (``import``: rank 1 exits before importing torch, rank 0 is importing torch or in ``init_process_group``), in a
world ``all_reduce`` whose peer raised (``allreduce``, the example of issue 15), in a subgroup ``all_reduce`` and a TCP
store wait (``subgroup``, both in C++ with no peer dead), in the bridge's excepthook and its flush (``excepthook``), at
interpreter exit (``atexit``). Every mode runs bridged with the collector live, down (nothing listens) and silent
(accepts connections, never answers: ``tests.support.silent_collector``), and once under plain torchrun. Every case: the
same job exit code and the same per-rank exit statuses as plain torchrun (where they are not a race of the script's
own), no SIGKILL after torch's grace, a job time within a few seconds of plain torchrun (the exact figures are in
``bench/bench_failures.py``); with the collector live, every rank's final record arrived.

An export in flight when the signal lands is part of the silent-collector cases: there every export hangs until
the exporter's timeout, so each signal finds one in flight.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, WORKERS
from tests.support.env import clean_env, otlp_env, plain_env, use_otlp
from tests.support.final_words import delivered_by_agent
from tests.support.jobs import FAILURE_REPORTED, SIGTERM_SENT, agent_log_seconds, rank_1_fails_after
from tests.support.marks import needs_a_deferred_build
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.procs import Job
from tests.support.silent_collector import SilentCollector

#: These tests compare a job's time with plain torchrun's: ``make test`` runs this file alone (``solo``).
pytestmark = pytest.mark.solo

pytest.importorskip("torch.distributed.elastic.agent.server.local_elastic_agent")

WORKER = WORKERS / "_silent_worker.py"
JOB_TIMEOUT = 90.0
BASELINE_SLACK = 8.0  # seconds a bridged job may take beyond plain torchrun: catches a 30 s grace, not noise
TELEMETRY_WAIT = 10.0
FORCED_KILL = "forcefully exiting via 9"
EXCEPTION, TERMINATED = "torchelastic.worker.exception", "torchelastic.worker.terminated"


@dataclass(frozen=True)
class Mode:
    name: str
    nproc: int
    #: rank -> the exit statuses plain torchrun may give it (two where the script itself races a signal)
    statuses: dict[int, frozenset[int]]
    #: rank -> the final records of which one must arrive (live collector)
    evidence: dict[int, frozenset[str]]


_TERM, _ONE = -15, 1
_EITHER = frozenset({EXCEPTION, TERMINATED})
MODES = {
    "import": Mode("import", 2, {0: frozenset({_TERM}), 1: frozenset({_ONE})}, {0: frozenset({TERMINATED})}),
    "allreduce": Mode(
        "allreduce", 2, {0: frozenset({_TERM, _ONE}), 1: frozenset({_ONE})}, {0: _EITHER, 1: frozenset({EXCEPTION})}
    ),
    "subgroup": Mode(
        "subgroup",
        4,
        {0: frozenset({_TERM}), 1: frozenset({_ONE}), 2: frozenset({_TERM}), 3: frozenset({_TERM, _ONE})},
        {0: frozenset({TERMINATED}), 1: frozenset({EXCEPTION}), 2: frozenset({TERMINATED}), 3: _EITHER},
    ),  # fmt: skip
    "excepthook": Mode(
        "excepthook",
        2,
        {0: frozenset({_TERM, _ONE}), 1: frozenset({_TERM, _ONE})},
        {0: _EITHER, 1: frozenset({EXCEPTION})},
    ),  # fmt: skip
    "atexit": Mode("atexit", 2, {0: frozenset({_TERM}), 1: frozenset({_ONE, _TERM})}, {0: frozenset({TERMINATED})}),
}
COLLECTORS = ["live", "down", "silent"]


def _args(mode: Mode) -> list[str]:
    return ["--standalone", "--nproc-per-node", str(mode.nproc), "--max-restarts", "0", "--monitor-interval", "0.1",
            str(WORKER), "--mode", mode.name]  # fmt: skip


_REPORT = re.compile(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def rank_statuses(output: str) -> dict[int, int]:
    """Each failed rank's exit status, from torch's failure report (``rank : N (local_rank: M)`` / ``exitcode``)."""
    return {int(rank): int(code) for rank, code in _REPORT.findall(output)}


@dataclass
class Outcome:
    job: Job
    logs: list[dict[str, Any]]

    @property
    def output(self) -> str:
        return self.job.output()

    def final_records(self) -> dict[int, set[str]]:
        """rank -> the names of its final records that arrived (sent by the worker or by its agent)."""
        out: dict[int, set[str]] = {}
        for record in self.logs:
            name = record.get("event_name")
            rank = record["attributes"].get("torchelastic.global_rank")
            if name in (EXCEPTION, TERMINATED) and rank is not None:
                out.setdefault(int(rank), set()).add(name)
        return out


class Runner:
    """Runs each job once per module; every job it starts is stopped (with its workers) at module end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.jobs, self.outcomes = tmp, [], {}

    def close(self) -> None:
        for job in self.jobs:
            job.kill()

    def _run(self, name: str, cmd: list[str], env: dict[str, str]) -> Job:
        path = self.tmp / f"{name}.log"
        with open(path, "wb") as out:
            proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)  # fmt: skip
        job = Job(proc, path)
        self.jobs.append(job)
        job.wait(timeout=JOB_TIMEOUT)
        return job

    def plain(self, mode: Mode) -> Outcome:
        key = (mode.name, "plain")
        if key not in self.outcomes:
            env = plain_env()
            cmd = [sys.executable, "-m", "torch.distributed.run", *_args(mode)]
            self.outcomes[key] = Outcome(self._run(f"{mode.name}-plain", cmd, env), [])
        return self.outcomes[key]

    def bridged(self, mode: Mode, collector: str) -> Outcome:
        key = (mode.name, collector)
        if key not in self.outcomes:
            self.outcomes[key] = self._bridged(mode, collector)
        return self.outcomes[key]

    def _bridged(self, mode: Mode, collector: str) -> Outcome:
        cmd = [sys.executable, "-m", "torchelastic_otel.run", *_args(mode)]
        with contextlib.ExitStack() as stack:
            rx = stack.enter_context(OtlpReceiver())
            target: OtlpReceiver | str = rx
            if collector == "down":
                target = "http://127.0.0.1:1"
            elif collector == "silent":
                target = stack.enter_context(SilentCollector()).endpoint
            env = otlp_env(target)
            job = self._run(f"{mode.name}-{collector}", cmd, env)
            if collector == "live":
                expected = _evidence_arrived(mode)
                rx.wait_for(lambda r: expected(r.logs()), timeout=TELEMETRY_WAIT)
            return Outcome(job, rx.logs() if collector == "live" else [])


def _evidence_arrived(mode: Mode) -> Any:
    def arrived(logs: list[dict[str, Any]]) -> bool:
        got = Outcome(None, logs).final_records()  # type: ignore[arg-type]
        return all(got.get(rank, set()) & names for rank, names in mode.evidence.items())

    return arrived


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runner]:
    with contextlib.closing(Runner(tmp_path_factory.mktemp("final-words"))) as r:
        yield r


CASES = [(mode, collector) for mode in MODES for collector in COLLECTORS]


@pytest.mark.parametrize(("mode_name", "collector"), CASES, ids=[f"{m}-{c}" for m, c in CASES])
def test_the_job_ends_as_under_plain_torchrun(runner: Runner, mode_name: str, collector: str) -> None:
    mode = MODES[mode_name]
    plain, bridged = runner.plain(mode), runner.bridged(mode, collector)
    assert bridged.job.returncode == plain.job.returncode == 1, bridged.job.tail()
    statuses = rank_statuses(bridged.output)
    plain_statuses = rank_statuses(plain.output)
    assert statuses and set(plain_statuses) <= set(mode.statuses), (statuses, plain_statuses)
    if len(plain_statuses) > 1 or len(statuses) > 1:
        assert set(statuses) == set(plain_statuses), bridged.job.tail()
    # else torch before 2.10, which lists only the root-cause rank, the first whose death it saw: where two ranks
    # end within the bound of a silent collector's flush (atexit: rank 0's SIGTERM at exit, rank 1's exception),
    # which it sees first is a race that flush can tilt (1 run in 5 of the oldest combination, torch 2.8, under load)
    for rank, status in statuses.items():
        assert status in mode.statuses[rank], f"rank {rank} exited {status}\n{bridged.job.tail()}"
    assert FORCED_KILL not in bridged.output
    assert bridged.job.seconds <= plain.job.seconds + BASELINE_SLACK, (bridged.job.seconds, plain.job.seconds)


@pytest.mark.parametrize("mode_name", list(MODES))
def test_every_ranks_final_record_arrives(runner: Runner, mode_name: str) -> None:
    mode = MODES[mode_name]
    outcome = runner.bridged(mode, "live")
    got = outcome.final_records()
    for rank, names in mode.evidence.items():
        assert got.get(rank, set()) & names, f"rank {rank}: {got}\n{outcome.job.tail()}"


def test_a_rank_stopped_while_starting_is_reported_with_its_line(runner: Runner) -> None:
    """Rank 0 of the ``import`` job is stopped before its pipeline could send anything of its own or while it
    waits in ``init_process_group``: its terminated record names the line of the script it was on."""
    outcome = runner.bridged(MODES["import"], "live")
    records = [r for r in outcome.logs if r.get("event_name") == TERMINATED]
    assert records, outcome.job.tail()
    attributes = records[0]["attributes"]
    assert attributes.get("torchelastic.global_rank") == "0"
    assert attributes.get("code.file.path", "").endswith("_silent_worker.py"), attributes
    assert attributes.get("torchelastic.signal") == "SIGTERM", attributes


def test_records_the_agent_sent_say_so_and_keep_the_workers_trace(runner: Runner) -> None:
    """Whatever the agent sent for a worker carries ``torchelastic.delivered_by="agent"`` and the worker's
    attempt trace; nothing is sent twice by the agent (its files are removed once sent)."""
    sent_by_agent = []
    for mode in MODES.values():
        outcome = runner.bridged(mode, "live")
        trace_ids = {r.get("trace_id") for r in outcome.logs if r.get("event_name") == "torchelastic.worker.failure"}
        for record in outcome.logs:
            if record["attributes"].get("torchelastic.delivered_by") == "agent":
                sent_by_agent.append(record)
                assert record.get("trace_id") in trace_ids, record
                # under its worker's resource, as if the worker had sent it
                resource = record["resource"]
                assert resource["torchelastic.process.kind"] == "worker", record
                rank = record["attributes"].get("torchelastic.global_rank")  # a Python log record has none
                assert rank is None or str(resource["torchelastic.rank"]) == str(rank), record
                assert resource["process.pid"] != outcome.job.proc.pid, record
        keys = [(r.get("event_name"), r["attributes"].get("torchelastic.global_rank"), r.get("time_unix_nano"))
                for r in outcome.logs if r["attributes"].get("torchelastic.delivered_by") == "agent"]  # fmt: skip
        assert len(keys) == len(set(keys)), keys
    assert sent_by_agent, "no case needed the agent: the import case should (its rank 0 is stopped while starting)"


def test_the_report_puts_a_record_the_agent_sent_on_its_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A terminated record kept by a worker (``final_words.write``) and sent by its agent (``final_words.deliver``,
    through the real OTLP JSON file exporter, with the agent's resource) shows in the report on that worker: its
    state and its stack, as if the worker had sent it. Synthetic job files (``tests/support/report_files.py``)
    around it."""
    from importlib.metadata import entry_points

    if not list(entry_points(group="opentelemetry_traces_exporter", name="otlp_json_file")):
        pytest.skip("opentelemetry-exporter-otlp-json-file (the `file` extra) is not installed")
    from tests.support.report_files import Process, Shape, write_job
    from torchelastic_otel._torch import final_words
    from torchelastic_otel.events import _otel as event_adapter
    from torchelastic_otel.events.api import Event, EventSource
    from torchelastic_otel.report import model, otlpjson

    files, kept = tmp_path / "files", tmp_path / "kept"
    kept.mkdir()
    facts = write_job(files, Shape(ranks=2, attempts=2, cause_rank=1))
    monkeypatch.setenv(final_words.DIR_ENV, str(kept))
    metadata = {
        "run_id": facts.run_id,
        "global_rank": 0,
        "local_rank": 0,
        "restart_count": 0,
        "state": "TERMINATED",
        "signal": "SIGTERM",
        "stack": 'Thread 1 "MainThread" (most recent call last):\n  all_reduce\n',
    }
    event = Event("torchelastic.worker.terminated", EventSource.WORKER, timestamp=0, metadata=metadata)
    assert final_words.write(event_adapter.to_log_fields(event, facts.start + 3_000_000_000)) is not None
    agent = Process(files, "agent-delivery", {"torchelastic.run_id": facts.run_id, "torchelastic.process.kind": "agent",
                                              "host.name": "node0", "process.pid": 100})  # fmt: skip
    assert final_words.deliver(str(kept), agent) == 1  # providers the bridge did not build: the agent's resource
    agent.close()
    assert not list(kept.iterdir())  # sent once: the kept file is gone
    (job,) = model.build(otlpjson.read([files]))
    (worker,) = [w for a in job.attempts if a.restart == 0 for w in a.workers if w.rank == 0]
    assert worker.state == "terminated" and "all_reduce" in worker.stack, worker


def test_a_worker_that_exits_at_once_is_in_the_trace_without_waiting_for_its_pipeline() -> None:
    """A worker that prints a line and exits before its pipeline is built does not wait for the build (it would
    pay it at every exit); its ``torchelastic.worker.start`` span still arrives, from the worker or sent by its
    agent, under the agent's attempt span, with the worker's rank."""
    with OtlpReceiver() as rx:
        cmd = [sys.executable, "-m", "torchelastic_otel.run", "--standalone", "--nproc-per-node", "2",
               "--monitor-interval", "0.1", "--no-python", sys.executable, "-c", "print('hi', flush=True)"]  # fmt: skip
        done = subprocess.run(cmd, env=otlp_env(rx), cwd=ROOT, capture_output=True, text=True, timeout=JOB_TIMEOUT)
        assert done.returncode == 0, done.stderr[-3000:]
        assert rx.wait_for(lambda r: len(r.spans("torchelastic.worker.start")) >= 2, timeout=TELEMETRY_WAIT)
        spans = rx.spans("torchelastic.worker.start")
        attempts = {s["span_id"] for s in rx.spans("torchelastic.attempt")}
        assert sorted(s["attributes"]["torchelastic.global_rank"] for s in spans) == ["0", "1"], spans
        assert all(s["parent_span_id"] in attempts for s in spans), (spans, attempts)


#: Rank 0 stands for a worker stopped inside an import: it holds the interpreter's import lock (what an import in
#: progress holds, at any of torch's thousand imports) and waits in a sleep, the signal landing there. The
#: script is bridge-unaware; rank 1 fails at once, so the agent SIGTERMs rank 0.
_IN_AN_IMPORT = """
import _imp, os, sys, time
if os.environ["RANK"] == "1":
    sys.exit(1)
_imp.acquire_lock()
print("rank 0 holds the import lock", flush=True)
time.sleep(60)
"""


def test_a_rank_stopped_inside_an_import_dies_at_once_with_its_record() -> None:
    """The final words run while the interrupted main thread may hold the import lock, so they import nothing:
    once they did (``sysconfig`` loading its data module to tell the standard library's frames from the user's),
    and such a rank died only at the end of the exit bound plus half a second (1.5 s by default; it took a worker
    stopped while importing torch, about 1 SIGTERM in 50). With a 5 s bound: the rank dies of its SIGTERM within
    2.5 s, and its ``torchelastic.worker.terminated`` record arrives (kept for its agent: its pipeline, whose
    build needs imports too, was never ready)."""
    with OtlpReceiver() as rx:
        cmd = [sys.executable, "-m", "torchelastic_otel.run", "--standalone", "--nproc-per-node", "2",
               "--monitor-interval", "0.1", "--no-python", sys.executable, "-c", _IN_AN_IMPORT]  # fmt: skip
        env = otlp_env(rx, TORCHELASTIC_OTEL_EXIT_TIMEOUT_MILLIS="5000")
        done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=JOB_TIMEOUT)
        output = done.stdout + done.stderr
        assert done.returncode == 1, output[-3000:]
        assert "rank 0 holds the import lock" in output, output[-3000:]
        assert FORCED_KILL not in output, output[-3000:]
        stopped_in = agent_log_seconds(output, SIGTERM_SENT, FAILURE_REPORTED)
        assert stopped_in is not None and stopped_in < 2.5, output[-3000:]

        def rank_0_terminated(r: OtlpReceiver) -> bool:
            return any(rec["attributes"].get("torchelastic.global_rank") == "0" for rec in r.logs(TERMINATED))

        assert rx.wait_for(rank_0_terminated, timeout=TELEMETRY_WAIT), rx.requests


def test_what_the_agent_sends_for_a_worker_carries_the_worker_resource(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker process (a real interpreter with torchrun's worker environment) leaves a terminated record and its
    start span for its agent; the agent's providers (built by the bridge, exporting over OTLP/gRPC to a receiver on
    127.0.0.1) send them under the worker's resource: its rank, its pid, ``torchelastic.process.kind=worker`` --
    and the agent's other resource attributes (``OTEL_RESOURCE_ATTRIBUTES``, ``service.name``), not its pid."""
    import json
    import os

    worker = r"""
import json, os, time
from torchelastic_otel._torch import final_words
from torchelastic_otel.events import _otel as event_adapter
from torchelastic_otel.events.api import Event, EventSource
event = Event("torchelastic.worker.terminated", EventSource.WORKER, metadata={"state": "TERMINATED", "global_rank": 3})
assert final_words.write(event_adapter.to_log_fields(event)) is not None
assert final_words.write_span("torchelastic.worker.start", time.time_ns() - 1000, time.time_ns(), {"a": "b"})
print(os.getpid())
"""
    env = clean_env(RANK="3", LOCAL_RANK="1", WORLD_SIZE="4", TORCHELASTIC_RUN_ID="delivery", ROLE_NAME="trainer",
                    TORCHELASTIC_OTEL_FAILURE_DIR=str(tmp_path))  # fmt: skip
    done = subprocess.run([sys.executable, "-c", worker], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    worker_pid = int(done.stdout.split()[-1])
    assert len(list(tmp_path.glob("final-*.json"))) == 2
    assert json.loads(next(tmp_path.glob("final-*.json")).read_text())["resource"]["process.pid"] == worker_pid

    with OtlpReceiver() as rx:
        use_otlp(monkeypatch, rx, pace={}, OTEL_RESOURCE_ATTRIBUTES="deployment.environment=delivery-test",
                 TORCHELASTIC_RUN_ID="delivery")  # fmt: skip
        with delivered_by_agent(tmp_path) as (delivered, resource):
            assert delivered == 2
            both = lambda r: r.logs("torchelastic.worker.terminated") and r.spans("torchelastic.worker.start")  # noqa: E731
            assert rx.wait_for(both, timeout=TELEMETRY_WAIT)
        for item in (rx.logs("torchelastic.worker.terminated")[0], rx.spans("torchelastic.worker.start")[0]):
            got = item["resource"]
            assert got["process.pid"] == worker_pid != os.getpid(), got
            assert got["torchelastic.rank"] == 3 and got["torchelastic.local_rank"] == 1, got
            assert got["torchelastic.process.kind"] == "worker" and got["torchelastic.role"] == "trainer", got
            assert got["deployment.environment"] == "delivery-test", got
            assert got["service.name"] == resource.attributes["service.name"], got
            assert item["attributes"]["torchelastic.delivered_by"] == "agent"
    assert not list(tmp_path.glob("final-*.json"))


#: Rank 0 logs a line (Python ``logging``, as torch's own INFO lines are), then waits in gloo's
#: ``init_process_group`` (native code) for rank 1, which waits until rank 0 has logged and exits 1: the agent
#: SIGTERMs rank 0 there. The script is bridge-unaware.
_LOGS_THEN_STOPPED = (
    """
import logging, os, sys, time
from datetime import timedelta
logging.basicConfig(level=logging.INFO)
"""
    + rank_1_fails_after("rank0-logged", poll=0.05)
    + """\
import torch.distributed as dist
logging.getLogger("trainer").warning("rank 0 is about to join")
open(flag, "w").close()
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
"""
)


@needs_a_deferred_build
def test_a_rank_stopped_before_its_pipeline_was_built_hands_its_span_and_records_to_the_agent(
    tmp_path: Path,
) -> None:
    """A rank SIGTERMed before its pipeline was built (it builds once what it buffered could no longer be handed
    over, or after ``TORCHELASTIC_OTEL_SETUP_DELAY_MILLIS``: a minute here) loses nothing: its final words hand the
    worker span and the Python log records buffered so far to its agent, beside its terminated record, and the
    agent sends them under the attempt -- while the rank still dies of the SIGTERM at once, as under plain
    torchrun, with no SIGKILL."""
    with OtlpReceiver() as rx:
        cmd = [sys.executable, "-m", "torchelastic_otel.run", "--standalone", "--nproc-per-node", "2",
               "--monitor-interval", "0.1", "--no-python", sys.executable, "-c", _LOGS_THEN_STOPPED]  # fmt: skip
        env = otlp_env(rx, TORCHELASTIC_OTEL_SETUP_DELAY_MILLIS="60000", FLAG_DIR=str(tmp_path))
        done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=JOB_TIMEOUT)
        output = done.stdout + done.stderr
        assert done.returncode == 1, output[-3000:]
        statuses = rank_statuses(output)  # torch before 2.10 reports the root-cause rank only
        assert statuses.get(1) == 1 and statuses.get(0, -15) == -15, output[-3000:]
        assert FORCED_KILL not in output, output[-3000:]

        def rank_0(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [i for i in items if str(i["resource"].get("torchelastic.rank")) == "0"]

        def logged(r: OtlpReceiver) -> list[dict[str, Any]]:
            # the logging record itself (``code.*``), not the line it printed on stderr (``log.iostream``)
            return [rec for rec in rank_0(r.logs()) if rec["body"] == "rank 0 is about to join"]

        def arrived(r: OtlpReceiver) -> bool:
            return bool(logged(r) and rank_0(r.spans("torchelastic.worker.start")) and rank_0(r.logs(TERMINATED)))

        assert rx.wait_for(arrived, timeout=TELEMETRY_WAIT), rx.requests
        (record,) = logged(rx)
        (span,) = rank_0(rx.spans("torchelastic.worker.start"))
        attempts = {s["span_id"] for s in rx.spans("torchelastic.attempt")}
        for item in (record, span):
            assert item["attributes"]["torchelastic.delivered_by"] == "agent", item
        function = record["attributes"].get("code.function.name", record["attributes"].get("code.function"))
        assert record["severity_number"] == 13 and function == "<module>", record
        assert span["parent_span_id"] in attempts, (span, attempts)
