"""A worker blocked in native code when torch's agent SIGTERMs it: real torchrun jobs (CPU, gloo, 127.0.0.1).

Why: a rank that waits on a dead peer is blocked in C++ (gloo's ``init_process_group`` or a collective), where
CPython cannot run a Python-level signal handler. With the bridge's SIGTERM handler being a Python one, such a rank
ignored the agent's SIGTERM until torch's 30 s shutdown grace ran out ("Unable to shutdown process <pid> via 15,
forcefully exiting via 9") and was SIGKILLed: every restart 30 s longer, exit code -9 instead of -15, and its
``torchelastic.worker.terminated`` record lost. Without the bridge the rank dies of SIGTERM at once.

The worker is ``tests/support/workers/_blocked_worker.py`` (a bridge-unaware training script, torch's APIs only):

- ``init``: 2 ranks, ``--max-restarts 1``; in the first attempt rank 1 exits 1 before ``init_process_group`` while
  rank 0 waits for it inside ``init_process_group`` (in C++: the ``TCPStore`` it hosts waits for the world to
  connect); the agent SIGTERMs rank 0 and restarts; the second attempt succeeds (job exit 0);
- ``allreduce``: 4 ranks, no restarts; rank 0 blocks in ``dist.all_reduce(t, group=g)`` (g = {0, 2}), rank 2 in a
  TCP store wait (C++, depends on no other rank), rank 3 sleeps in Python, rank 1 raises; the agent SIGTERMs ranks
  0, 2 and 3 (job fails). Rank 0's peer in ``g`` is blocked in C++ on purpose: were it the Python sleeper, it would
  die of the old handler at once, its death would make gloo raise in rank 0's ``all_reduce``, and rank 0's Python
  handler would run after all -- the old behaviour would pass (seen with torch 2.13, gloo).

Each job runs with the collector live (the in-process OTLP receiver) and dead (a 127.0.0.1 port nothing listens
on): a dead collector must not stretch the exit either (the terminated record's flush is bounded by
``TORCHELASTIC_OTEL_EXIT_TIMEOUT_MILLIS``, 1 s by default). A job runs once per module and its outcome (output,
exit code, duration, what the receiver got) is shared by the tests that assert on it: 4 bridged jobs and one plain
torchrun job, about 35 s on 2 cores (about 3 minutes with the old behaviour, ~37 s a job).

The deadlines are conditions, not benchmarks: a job must end well within torch's 30 s grace (the old behaviour
took 36-68 s), and a bridged job may take at most a few seconds more than the same job under plain torchrun. The
exact timings belong to ``bench/``.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, WORKERS
from tests.support.env import otlp_env, plain_env
from tests.support.jobs import SEVERITY_WARN, failure_report, is_worker
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.ports import free_port
from tests.support.procs import Job
from tests.support.releases import torch_failure_report_names_signals

#: These tests compare a job's time with plain torchrun's: ``make test`` runs this file alone (``solo``).
pytestmark = pytest.mark.solo

pytest.importorskip("torch.distributed.elastic.agent.server.local_elastic_agent")

WORKER = WORKERS / "_blocked_worker.py"

JOB_DEADLINE = 25.0  # seconds: well within torch's 30 s shutdown grace (a condition, not a benchmark)
JOB_TIMEOUT = 75.0  # seconds: long enough for the old behaviour to show itself (SIGKILL after 30 s), then killed
BASELINE_SLACK = 10.0  # seconds a bridged job may take beyond plain torchrun (catches a 30 s grace, not noise)
TELEMETRY_WAIT = 5.0  # seconds to wait at the receiver once the job ended (its processes are all gone by then)
STACK_BOUND = 9 * 1024  # the contract says ~8 KB; a little slack for a truncation marker

FORCED_KILL = "forcefully exiting via 9"  # torch's agent, when a worker outlived its shutdown grace
TERMINATED = "torchelastic.worker.terminated"
THREAD_HEADER = re.compile(r'^Thread (\d+) "([^"\n]*)" \(most recent call last\):$', re.MULTILINE)

COLLECTORS = ["live", "dead"]


@dataclass(frozen=True)
class Mode:
    """One way a rank blocks: the torchrun arguments, the expected job exit, the ranks the agent SIGTERMs."""

    name: str
    nproc: int
    max_restarts: int
    succeeds: bool
    blocked: dict[int, str]  # rank -> the marker of the line it blocks on (``# BLOCKS: <marker>``)
    blocks_in: dict[int, str]  # rank -> what it prints it blocks in ("about to block in <...>")
    stack_shows: dict[int, str]  # rank -> a (multiline) regex its main thread's stack matches: torch's frame, the sleep
    function: str  # the worker's function around the blocking line


MODES = {
    "init": Mode(
        "init", 2, 1, True, {0: "init"}, {0: "init_process_group"}, {0: r", in init_process_group$"}, "_mode_init"
    ),
    "allreduce": Mode(
        "allreduce",
        4,
        0,
        False,
        {0: "all_reduce", 2: "store_wait", 3: "sleep"},
        {0: "all_reduce", 2: "store_wait", 3: "sleep"},
        {0: r", in all_reduce$", 2: r"^\s+local\.wait\(", 3: r"^\s+time\.sleep\(120\)"},
        "_mode_allreduce",
    ),  # fmt: skip
}


def marker_line(marker: str) -> int:
    """The line number of ``# BLOCKS: <marker>`` in the worker script."""
    text = WORKER.read_text().splitlines()
    lines = [n for n, line in enumerate(text, 1) if line.rstrip().endswith(f"# BLOCKS: {marker}")]
    assert len(lines) == 1, f"marker {marker!r} found on lines {lines} of {WORKER}"
    return lines[0]


# ---- running the jobs once per module ----------------------------------------------------------------------


@dataclass
class Outcome:
    """A finished job: exit code, duration, output and (live collector) what the receiver got."""

    job: Job
    timed_out: str | None = None
    logs: list[dict[str, Any]] = field(default_factory=list)
    metric_points: list[dict[str, Any]] = field(default_factory=list)

    @property
    def output(self) -> str:
        return self.job.output()

    @property
    def returncode(self) -> int | None:
        return self.job.returncode

    @property
    def seconds(self) -> float:
        return self.job.seconds if self.job.ended is not None else float("inf")

    def describe(self) -> str:
        return f"exit {self.returncode} after {self.seconds:.1f} s{'; ' + self.timed_out if self.timed_out else ''}"

    def tail(self, n: int = 6000) -> str:
        """The end of the output, without the exporters' retry chatter (a dead collector) and torch's NumPy warning."""
        lines = self.output.splitlines()
        kept = [line for line in lines if not _NOISE.search(line)]
        text = "\n".join(kept)[-n:]
        return f"{self.describe()}; {len(lines) - len(kept)} noise lines left out\n--- job output (tail) ---\n{text}"


_NOISE = re.compile(r"Transient error StatusCode|Failed to export|Failed to initialize NumPy|_conversion_method_templ")


def _expected_records_arrived(mode: Mode) -> Callable[[OtlpReceiver], bool]:
    def arrived(rx: OtlpReceiver) -> bool:
        terminated = {(r["resource"].get("torchelastic.rank"), r["resource"].get("torchelastic.restart_count"))
                      for r in rx.logs(TERMINATED) if is_worker(r)}  # fmt: skip
        before = {r["resource"].get("torchelastic.rank") for r in rx.logs("trainer.before_block") if is_worker(r)}
        return {(rank, 0) for rank in mode.blocked} <= terminated and set(mode.blocked) <= before

    return arrived


def _torchrun_args(mode: Mode) -> list[str | Path]:
    return ["--standalone", "--nproc-per-node", str(mode.nproc), "--max-restarts", str(mode.max_restarts),
            "--monitor-interval", "0.1", WORKER, "--mode", mode.name]  # fmt: skip


class Runner:
    """Starts each (mode, collector) job once; every job started is stopped (with its workers) at module end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: list[Job] = []
        self.outcomes: dict[tuple[str, str], Outcome] = {}

    def _start(self, name: str, cmd: list[str | Path], env: dict[str, str]) -> Job:
        output_path = self.tmp / f"{name}.log"
        with open(output_path, "wb") as out:
            proc = subprocess.Popen(
                [str(c) for c in cmd], env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        job = Job(proc, output_path)
        self.started.append(job)
        return job

    def _wait(self, job: Job) -> str | None:
        try:
            job.wait(timeout=JOB_TIMEOUT)
        except AssertionError as exc:  # Job.wait killed it
            return str(exc).splitlines()[0]
        return None

    def bridged(self, mode_name: str, collector: str) -> Outcome:
        key = (mode_name, collector)
        if key not in self.outcomes:
            self.outcomes[key] = self._run_bridged(MODES[mode_name], collector)
        return self.outcomes[key]

    def _run_bridged(self, mode: Mode, collector: str) -> Outcome:
        cmd = [sys.executable, "-m", "torchelastic_otel.run", *_torchrun_args(mode)]
        with contextlib.ExitStack() as stack:
            if collector == "live":
                rx: Any = stack.enter_context(OtlpReceiver())
            else:  # nothing listens there: every export fails (connection refused)
                rx = types.SimpleNamespace(grpc_endpoint=f"http://127.0.0.1:{free_port()}")
            job = self._start(f"bridged-{mode.name}-{collector}", cmd, otlp_env(rx))
            timed_out = self._wait(job)
            outcome = Outcome(job, timed_out)
            if collector == "live":
                rx.wait_for(_expected_records_arrived(mode), timeout=TELEMETRY_WAIT, interval=0.1)
                outcome.logs, outcome.metric_points = rx.logs(), rx.metric_points()
        print(f"\nbridged {mode.name} job, collector {collector}: {outcome.describe()}")
        return outcome

    def plain(self, mode_name: str) -> Outcome:
        key = (mode_name, "plain")
        if key not in self.outcomes:
            mode = MODES[mode_name]
            # No bridge: torch has no "otel" event handler, so the worker records to torch's default ("null").
            cmd = [sys.executable, "-m", "torch.distributed.run", *_torchrun_args(mode), "--events-to", "null"]
            job = self._start(f"plain-{mode.name}", cmd, plain_env())
            self.outcomes[key] = Outcome(job, self._wait(job))
            print(f"\nplain torchrun {mode.name} job: {self.outcomes[key].describe()}")
        return self.outcomes[key]

    def close(self) -> None:
        for job in self.started:
            job.kill()


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runner]:
    with contextlib.closing(Runner(tmp_path_factory.mktemp("worker_sigterm"))) as r:
        yield r


# ---- reading the agent's output and the received records ---------------------------------------------------


def worker_pids(output: str) -> dict[tuple[int, int], int]:
    """(rank, restart) -> pid, from the worker's ``pid N started`` lines."""
    found = re.findall(r"blocked_worker rank (\d+) restart (\d+): pid (\d+) started", output)
    return {(int(r), int(a)): int(p) for r, a, p in found}


def of_rank(items: list[dict[str, Any]], rank: int, restart: int = 0) -> list[dict[str, Any]]:
    return [
        i for i in items
        if is_worker(i) and i["resource"]["torchelastic.rank"] == rank
        and i["resource"].get("torchelastic.restart_count") == restart
    ]  # fmt: skip


def threads_of(stack: str) -> list[tuple[str, str]]:
    """``[(thread name, its section of the stack)]`` in order, split at the ``Thread <ident> "<name>"`` headers."""
    headers = list(THREAD_HEADER.finditer(stack))
    return [
        (h.group(2), stack[h.start() : headers[i + 1].start() if i + 1 < len(headers) else len(stack)])
        for i, h in enumerate(headers)
    ]


# ---- the tests -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("collector", COLLECTORS)
@pytest.mark.parametrize("mode_name", list(MODES))
def test_blocked_worker_ends_on_sigterm_without_sigkill(runner: Runner, mode_name: str, collector: str) -> None:
    """The agent's SIGTERM ends a rank blocked in native code at once, collector live or dead: torch never has to
    SIGKILL it ("forcefully exiting via 9"), and the job ends as it would without the bridge -- ``init``: the
    restart's second attempt succeeds (exit 0); ``allreduce``: the job fails -- well within torch's 30 s grace."""
    mode = MODES[mode_name]
    outcome = runner.bridged(mode_name, collector)
    output = outcome.output
    assert outcome.timed_out is None, outcome.tail()
    assert FORCED_KILL not in output, f"torch had to SIGKILL a worker\n{outcome.tail()}"
    # The ranks really blocked where they should before the agent stopped them.
    for rank, what in mode.blocks_in.items():
        assert f"blocked_worker rank {rank} restart 0: about to block in {what}" in output, outcome.tail()
    if mode.succeeds:
        assert outcome.returncode == 0, outcome.tail()
        for rank in range(mode.nproc):
            assert f"blocked_worker rank {rank} restart 1: done" in output, outcome.tail()
    else:
        assert outcome.returncode not in (0, None), outcome.tail()
    assert outcome.seconds < JOB_DEADLINE, f"the job took {outcome.seconds:.1f} s\n{outcome.tail()}"


@pytest.mark.parametrize("collector", COLLECTORS)
def test_failure_report_shows_sigterm_exit_codes(runner: Runner, collector: str) -> None:
    """torch's failure report of the ``allreduce`` job is the one of plain torchrun: rank 1 is the root cause
    (exit 1, its RuntimeError), ranks 0 (blocked in ``all_reduce``), 2 (in a store wait) and 3 (in ``time.sleep``)
    died of the agent's SIGTERM: exit code -15, not -9 (SIGKILL after the grace), and the pids are the workers'.
    torch before 2.10 reports the root cause only: then the ranks must be those of plain torchrun's report."""
    mode = MODES["allreduce"]
    outcome = runner.bridged("allreduce", collector)
    report = failure_report(outcome.output)
    if set(report) != set(range(mode.nproc)):
        plain = failure_report(runner.plain("allreduce").output)
        assert set(report) == set(plain) == {1}, f"failure report entries: {report}, plain {plain}\n{outcome.tail()}"
    pids = worker_pids(outcome.output)
    for rank in set(mode.blocked) & set(report):
        code, pid, rest = report[rank]
        named = "SIGTERM" in rest or not torch_failure_report_names_signals()
        assert code == -signal.SIGTERM and named, f"rank {rank}: {report[rank]}\n{outcome.tail()}"
        assert pid == pids[(rank, 0)], (report, pids)
    assert report[1][0] == 1, f"rank 1: {report[1]}\n{outcome.tail()}"
    assert "RuntimeError: blocked_worker rank 1 failed (restart 0)" in outcome.output, outcome.tail()


def _assert_terminated(outcome: Outcome, mode: Mode, rank: int) -> dict[str, Any]:
    """Rank ``rank``'s one terminated record of the first attempt, checked against the contract; returned."""
    records = of_rank([r for r in outcome.logs if r["event_name"] == TERMINATED], rank)
    assert len(records) == 1, f"rank {rank}: {len(records)} terminated records: {records}\n{outcome.tail()}"
    record = records[0]
    attrs = record["attributes"]
    assert record["severity_number"] == SEVERITY_WARN and record["severity_text"] == "WARN", record
    assert attrs["torchelastic.state"] == "TERMINATED" and attrs["torchelastic.signal"] == "SIGTERM", attrs
    assert record["resource"]["torchelastic.world_size"] == mode.nproc

    stack = attrs["torchelastic.stack"]
    assert isinstance(stack, str) and len(stack.encode()) <= STACK_BOUND, len(stack)
    assert THREAD_HEADER.match(stack), f"the stack does not start with a thread header:\n{stack}"
    name, main = threads_of(stack)[0]
    assert name == "MainThread", f"the first thread is {name!r}, not the main thread:\n{stack}"
    line = marker_line(mode.blocked[rank])
    assert f'_blocked_worker.py", line {line}, in {mode.function}' in main, f"rank {rank}:\n{stack}"
    shows = mode.stack_shows[rank]
    assert re.search(shows, main, re.MULTILINE), f"rank {rank}: no {shows!r} in the main thread\n{stack}"
    assert re.search(r'^  File "[^"]+", line \d+, in \S+$', main, re.MULTILINE), stack  # format_stack lines

    # The innermost frame of the main thread in the user's code: the line that blocked.
    assert attrs["code.file.path"].endswith("_blocked_worker.py"), attrs
    assert attrs["code.line.number"] == line, (attrs, line)
    assert attrs["code.function.name"] == mode.function, attrs
    return record


def test_live_collector_gets_the_records_before_the_block_and_the_terminated_record_init(runner: Runner) -> None:
    """``init``, live collector: rank 0 blocked in ``init_process_group`` delivers what it recorded before
    blocking (torch's event and metric APIs) and its ``torchelastic.worker.terminated`` record (WARN, TERMINATED /
    SIGTERM, every thread's stack -- the main thread first, inside ``init_process_group`` -- and the user's line
    as ``code.*``). Only the SIGTERMed rank has one: rank 1 exited by itself, the second attempt ended normally."""
    mode = MODES["init"]
    outcome = runner.bridged("init", "live")
    assert outcome.timed_out is None, outcome.tail()
    _assert_before_block(outcome, rank=0, blocks_in="init_process_group")
    record = _assert_terminated(outcome, mode, rank=0)
    assert record["resource"]["process.pid"] == worker_pids(outcome.output)[(0, 0)]
    terminated = [r for r in outcome.logs if r["event_name"] == TERMINATED]
    assert {(r["resource"]["torchelastic.rank"], r["resource"]["torchelastic.restart_count"]) for r in terminated} == {
        (0, 0)
    }


def test_live_collector_gets_the_records_before_the_block_and_the_terminated_record_allreduce(runner: Runner) -> None:
    """``allreduce``, live collector: rank 0 blocked in ``all_reduce`` delivers its records from before the block
    and its terminated record, whose ``code.*`` is the marked ``dist.all_reduce(t, group=g)`` line (the innermost
    user frame, not torch's); rank 2 (store wait, C++) and rank 3 (``time.sleep``, Python) get one too, pointing at
    their own lines; the pids are the ones torch's failure report shows. Rank 1 (raised) has none."""
    mode = MODES["allreduce"]
    outcome = runner.bridged("allreduce", "live")
    assert outcome.timed_out is None, outcome.tail()
    report = failure_report(outcome.output)
    for rank, blocks_in in mode.blocks_in.items():
        _assert_before_block(outcome, rank, blocks_in)
        record = _assert_terminated(outcome, mode, rank)
        assert record["resource"]["process.pid"] == worker_pids(outcome.output)[(rank, 0)]
        if rank in report:
            assert record["resource"]["process.pid"] == report[rank][1]
    terminated = [r for r in outcome.logs if r["event_name"] == TERMINATED]
    assert {r["resource"]["torchelastic.rank"] for r in terminated} == set(mode.blocked)


def _assert_before_block(outcome: Outcome, rank: int, blocks_in: str) -> None:
    """What rank ``rank`` recorded with torch's APIs before it blocked reached the collector."""
    events = of_rank([r for r in outcome.logs if r["event_name"] == "trainer.before_block"], rank)
    assert len(events) == 1, f"rank {rank}'s trainer.before_block events: {events}\n{outcome.tail()}"
    attrs = events[0]["attributes"]
    assert attrs["torchelastic.blocks_in"] == blocks_in and attrs["torchelastic.rank"] == rank, attrs
    assert attrs["torchelastic.source"] == "WORKER", attrs
    points = of_rank([p for p in outcome.metric_points if p["name"] == "worker.before_block"], rank)
    assert points, f"rank {rank}'s worker.before_block metric did not arrive\n{outcome.tail()}"
    assert all(p["attributes"].get("metric_group") == "trainer" and p["value"] == 1 for p in points), points


@pytest.mark.parametrize("collector", COLLECTORS)
def test_bridged_job_matches_plain_torchrun(runner: Runner, collector: str) -> None:
    """The ``init`` job under plain torchrun (``python -m torch.distributed.run``, no OpenTelemetry at all) and
    bridged: the same exit code, and the bridged job at most a few seconds longer (``BASELINE_SLACK``: generous,
    so that it catches the 30 s grace rather than measuring noise). Plain torchrun never SIGKILLs either."""
    plain = runner.plain("init")
    bridged = runner.bridged("init", collector)
    assert plain.timed_out is None and FORCED_KILL not in plain.output, plain.tail()
    assert bridged.timed_out is None, bridged.tail()
    assert bridged.returncode == plain.returncode == 0, f"plain: {plain.tail()}\nbridged: {bridged.tail()}"
    assert bridged.seconds <= plain.seconds + BASELINE_SLACK, (
        f"bridged {bridged.seconds:.1f} s vs plain torchrun {plain.seconds:.1f} s\n{bridged.tail()}"
    )
