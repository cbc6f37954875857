"""The root cause of a failed attempt: which rank failed first, how and why, and which ranks were consequences.

End to end: a real 2-worker torchrun job (CPU, gloo, 127.0.0.1) through ``torchelastic-otel run``, exporting to the
in-process OTLP receiver; ``tests/support/workers/_root_cause_worker.py``: rank 1 prints, logs and raises ``ValueError``
while rank 0 waits for it inside a gloo ``all_reduce`` (rank 0 then fails in gloo, or its agent stops it). Run once with
a plain script and once with torch's ``@record`` (which writes torch's error file too). The agent must report rank 1 --
never rank 0, whose failure is later by causality -- with its traceback, and rank 0 as a consequence.

Unit level: ``root_cause.find`` over torch's real ``ProcessFailure`` objects, reading real error files written by
torch's ``ErrorHandler`` and the bridge's own failure files.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, WORKERS
from tests.support.env import otlp_env, plain_env
from tests.support.jobs import c10d_args, failure_report, is_worker, unique_id
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.procs import Job

pytest.importorskip("torch.distributed.elastic.agent.server.local_elastic_agent")

from torchelastic_otel._torch import root_cause

WORKER = WORKERS / "_root_cause_worker.py"
ROOT_CAUSE = "torchelastic.root_cause"
SEVERITY_ERROR = 17


@pytest.fixture(scope="module")
def failed_jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[bool], dict[str, Any]]]:
    """``run(record)``: the failed job's outcome (run once per flavour): exit code, output and what arrived."""
    tmp = tmp_path_factory.mktemp("root_cause")
    outcomes: dict[bool, dict[str, Any]] = {}
    plain_jobs: dict[bool, Job] = {}
    started: list[Job] = []

    def start(launcher: str, record: bool, env: dict[str, str]) -> Job:
        cmd = [sys.executable, "-m", launcher, "--nnodes", "1", "--nproc-per-node", "2", "--max-restarts", "0",
               *c10d_args(unique_id("root-cause")), str(WORKER), *(["--record"] if record else [])]  # fmt: skip
        output = tmp / f"{launcher}-{record}.log"
        with open(output, "wb") as out:
            proc = subprocess.Popen([str(c) for c in cmd], env=env, cwd=ROOT, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip
        job = Job(proc, output)
        started.append(job)
        job.wait(timeout=90)
        return job

    def run(record: bool) -> dict[str, Any]:
        if record in outcomes:
            return outcomes[record]
        with OtlpReceiver() as rx:
            job = start("torchelastic_otel.run", record, otlp_env(rx))
            rx.wait_for(lambda r: r.logs(ROOT_CAUSE) and r.spans("torchelastic.run")
                        and r.metric_points("torchelastic.root_cause.time"), timeout=10, interval=0.1)  # fmt: skip
            outcomes[record] = {
                "job": job,
                "logs": rx.logs(),
                "spans": rx.spans(),
                "points": rx.metric_points("torchelastic.root_cause.time"),
            }
        return outcomes[record]

    def plain(record: bool) -> Job:
        """The same job under plain torchrun (no bridge, no receiver)."""
        if record not in plain_jobs:
            plain_jobs[record] = start("torch.distributed.run", record, plain_env())
        return plain_jobs[record]

    run.plain = plain  # type: ignore[attr-defined]

    try:
        yield run
    finally:
        for job in started:
            job.kill()


@pytest.mark.solo  # which rank torch's agent sees die first is a race that a loaded machine tilts: run it alone
@pytest.mark.parametrize("record", [False, True], ids=["plain-script", "torch-record"])
def test_the_job_ends_as_under_plain_torchrun(failed_jobs: Any, record: bool) -> None:
    """Same exit code and the same failed ranks in torch's failure report as plain torchrun's job; rank 1 exits 1
    in both -- or aborts (SIGABRT) while the interpreter tears down a live gloo group, which torch does now and then
    with or without the bridge (seen under plain torchrun too) -- and rank 0 ends in gloo's error or by the agent's
    SIGTERM, in either job."""
    bridged, plain = failed_jobs(record)["job"], failed_jobs.plain(record)
    assert bridged.returncode == plain.returncode == 1, (bridged.tail(), plain.tail())
    ours, theirs = failure_report(bridged.output()), failure_report(plain.output())
    assert set(ours) == set(theirs) == {0, 1}, (bridged.tail(), plain.tail())
    assert {ours[1][0], theirs[1][0]} <= {1, -signal.SIGABRT}, (ours, theirs)


def _worker_pid(outcome: dict[str, Any], rank: int) -> int:
    """The pid of the worker itself (its exception record; output records come from a helper process of it)."""
    pids = {log["resource"].get("process.pid") for log in outcome["logs"]
            if is_worker(log) and log["resource"]["torchelastic.rank"] == rank
            and log["event_name"] == "torchelastic.worker.exception"}  # fmt: skip
    pids.discard(None)
    assert len(pids) == 1, pids
    return pids.pop()


@pytest.mark.parametrize("record", [False, True], ids=["plain-script", "torch-record"])
def test_agent_reports_the_rank_that_raised_first_with_its_traceback(failed_jobs: Any, record: bool) -> None:
    outcome = failed_jobs(record)
    job = outcome["job"]
    assert job.returncode == 1, job.tail()
    records = [log for log in outcome["logs"] if log["event_name"] == ROOT_CAUSE]
    assert len(records) == 1, job.tail()
    rec = records[0]
    assert not is_worker(rec)
    attrs = rec["attributes"]
    assert rec["severity_number"] == SEVERITY_ERROR and rec["severity_text"] == "ERROR"
    assert attrs["torchelastic.root_cause.rank"] == 1
    assert attrs["torchelastic.root_cause.local_rank"] == 1
    assert attrs["torchelastic.root_cause.consequences"] == [0]
    assert attrs["exception.type"] == "ValueError"
    assert attrs["exception.message"] == "corrupt batch 7"
    stack = attrs["exception.stacktrace"]
    assert "load_batch" in stack and "_root_cause_worker.py" in stack and stack.rstrip().endswith("corrupt batch 7")
    assert attrs["torchelastic.root_cause.time_source"] == "exception"
    assert attrs["torchelastic.root_cause.reason"] == "ValueError"
    assert attrs["process.pid"] == _worker_pid(outcome, 1)
    # Known when rank 1 had exited by the time the agent saw the failure; a rank still exiting (an abort writing a
    # core, a slow teardown) is ranked by its failure file and has no exit code yet.
    assert attrs.get("process.exit.code") in (1, None)
    assert attrs["host.name"]
    assert attrs["torchelastic.run_id"] == rec["resource"]["torchelastic.run_id"]
    assert attrs["torchelastic.restart_count"] == 0
    # The record is timestamped when rank 1 raised, before the agent noticed it.
    assert rec["time_unix_nano"] == attrs["torchelastic.root_cause.time_unix_nano"] // 1_000_000 * 1_000_000
    assert rec["time_unix_nano"] < rec["observed_time_unix_nano"]


def test_attempt_and_run_spans_carry_the_root_cause(failed_jobs: Any) -> None:
    outcome = failed_jobs(False)
    for name in ("torchelastic.attempt", "torchelastic.run"):
        spans = [s for s in outcome["spans"] if s["name"] == name]
        assert len(spans) == 1, name
        attrs = spans[0]["attributes"]
        assert attrs["torchelastic.root_cause.rank"] == 1, name
        assert attrs["exception.type"] == "ValueError", name
        assert attrs["torchelastic.root_cause.consequences"] == [0], name


def test_root_cause_gauge_names_the_rank(failed_jobs: Any) -> None:
    outcome = failed_jobs(False)
    rec = next(log for log in outcome["logs"] if log["event_name"] == ROOT_CAUSE)
    points = outcome["points"]
    assert points, "no torchelastic.root_cause.time point"
    attrs = points[-1]["attributes"]
    assert attrs["torchelastic.root_cause.rank"] == 1
    assert attrs["torchelastic.root_cause.reason"] == "ValueError"
    assert attrs["torchelastic.run_id"] == rec["attributes"]["torchelastic.run_id"]
    assert points[-1]["value"] == pytest.approx(rec["attributes"]["torchelastic.root_cause.time_unix_nano"] / 1e9)


def test_failure_files_are_removed_with_the_agent(failed_jobs: Any) -> None:
    """The agent's failure directory is a temporary one: nothing of it is left once the job ended."""
    outcome = failed_jobs(False)
    rec = next(log for log in outcome["logs"] if log["event_name"] == ROOT_CAUSE)
    pid = rec["attributes"]["process.pid"]
    import glob
    import tempfile

    left = glob.glob(os.path.join(tempfile.gettempdir(), "torchelastic-otel-failures-*", f"{pid}.json"))
    assert left == []


# ---- root_cause.find over torch's own ProcessFailure ----------------------------------------------------------


def _torch_error_file(path: Path, exc: BaseException) -> None:
    """What ``@record`` writes: torch's ``ErrorHandler.record_exception`` (inside an ``except``, as torch calls it)."""
    from torch.distributed.elastic.multiprocessing.errors.error_handler import ErrorHandler

    os.environ["TORCHELASTIC_ERROR_FILE"] = str(path)
    try:
        try:
            raise exc
        except BaseException as raised:
            ErrorHandler().record_exception(raised)
    finally:
        del os.environ["TORCHELASTIC_ERROR_FILE"]


def _process_failure(local_rank: int, pid: int, exitcode: int, error_file: Path | str) -> Any:
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    return ProcessFailure(local_rank=local_rank, pid=pid, exitcode=exitcode, error_file=str(error_file))


def _write_own_failure(directory: Path, pid: int, exc: BaseException, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(root_cause.FAILURE_DIR_ENV, str(directory))
    monkeypatch.setattr(os, "getpid", lambda: pid)
    try:
        raise exc
    except BaseException as raised:
        root_cause.write_failure(type(raised), raised, raised.__traceback__)
    monkeypatch.undo()


def test_error_file_ranks_and_explains_when_there_is_no_failure_file(tmp_path: Path) -> None:
    """A script with ``@record`` under an agent without the bridge's files: torch's error file is used."""
    error_file = tmp_path / "error.json"
    _torch_error_file(error_file, KeyError("missing shard"))
    first = _process_failure(0, 100, 1, error_file)
    later = _process_failure(1, 101, 1, tmp_path / "absent.json")  # no file: now, when the agent noticed
    cause = root_cause.find({3: later, 2: first}, running_ranks=[], failure_dir=None)
    assert cause is not None
    assert (cause.rank, cause.time_source, cause.exception_type) == (2, "error_file", "KeyError")
    assert cause.exception_message == "'missing shard'"
    assert "KeyError" in (cause.exception_stacktrace or "")
    assert cause.consequences == [3]
    assert cause.time_unix_nano == int(json.loads(error_file.read_text())["message"]["extraInfo"]["timestamp"]) * 10**9


def test_failure_files_are_more_precise_than_torchs_seconds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ranks fail within the same second: torch's whole-second timestamps tie; the bridge's files do not."""
    failures = tmp_path / "failures"
    failures.mkdir()
    _write_own_failure(failures, 201, RuntimeError("first"), monkeypatch)
    time.sleep(0.002)  # a real gap between the two exceptions (what is asserted is their order, not a duration)
    _write_own_failure(failures, 200, RuntimeError("second"), monkeypatch)
    error_files = []
    for name in ("a.json", "b.json"):
        _torch_error_file(tmp_path / name, RuntimeError("torch's copy"))
        error_files.append(tmp_path / name)
    second = _process_failure(0, 200, 1, error_files[0])
    first = _process_failure(1, 201, 1, error_files[1])
    cause = root_cause.find({0: second, 1: first}, running_ranks=[2, 3], failure_dir=str(failures))
    assert cause is not None
    assert (cause.rank, cause.time_source, cause.exception_message) == (1, "exception", "first")
    assert cause.consequences == [0, 2, 3]


def test_a_signal_death_is_named(tmp_path: Path) -> None:
    cause = root_cause.find({5: _process_failure(1, 300, -signal.SIGSEGV, tmp_path / "none.json")}, [4], str(tmp_path))
    assert cause is not None
    assert (cause.signal, cause.exit_code, cause.reason, cause.time_source) == (
        "SIGSEGV",
        None,
        "SIGSEGV",
        "exit_observed",
    )
    attrs = root_cause.attributes(cause)
    assert attrs["torchelastic.root_cause.signal"] == "SIGSEGV" and "process.exit.code" not in attrs
    assert attrs["torchelastic.root_cause.consequences"] == [4]


def test_bad_failure_files_are_ignored_and_huge_ones_cut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "400.json").write_text("{not json")
    (tmp_path / "401.json").write_text(json.dumps({"time_unix_nano": "yesterday"}))
    _write_own_failure(tmp_path, 402, ValueError("x" * 100_000), monkeypatch)
    failures = {r: _process_failure(r, 400 + r, 1, tmp_path / "none.json") for r in range(3)}
    cause = root_cause.find(failures, [], str(tmp_path))
    assert cause is not None and cause.rank == 2 and cause.time_source == "exception"
    assert len(cause.exception_message or "") <= root_cause.MAX_TEXT
    assert len(cause.exception_stacktrace or "") <= root_cause.MAX_TEXT
    assert (cause.exception_stacktrace or "").rstrip().endswith("x")  # the end of a traceback is kept


def test_write_failure_outside_a_bridged_worker_does_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(root_cause.FAILURE_DIR_ENV, raising=False)
    try:
        raise RuntimeError("x")
    except RuntimeError as exc:
        root_cause.write_failure(RuntimeError, exc, exc.__traceback__)
    monkeypatch.setenv(root_cause.FAILURE_DIR_ENV, str(tmp_path / "gone"))
    try:
        raise RuntimeError("x")
    except RuntimeError as exc:
        root_cause.write_failure(RuntimeError, exc, exc.__traceback__)
    assert list(tmp_path.iterdir()) == []


def _worker(rank: int, local_rank: int, pid: int) -> Any:
    from torch.distributed.elastic.agent.server.api import Worker

    worker = Worker(local_rank=local_rank, global_rank=rank)
    worker.id = pid
    return worker


def test_a_rank_still_exiting_after_it_raised_is_the_root_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 raised (its failure file is written) and is still flushing and tearing down when rank 0, which lost
    it in a collective, has already exited: the agent sees rank 0 failed and rank 1 running; rank 1 is the cause."""
    _write_own_failure(tmp_path, 501, ValueError("corrupt batch 7"), monkeypatch)
    time.sleep(0.002)
    _write_own_failure(tmp_path, 500, RuntimeError("Connection closed by peer [127.0.0.1]:1234"), monkeypatch)
    failures = {0: _process_failure(0, 500, 1, tmp_path / "none.json")}
    running = {1: _worker(1, 1, 501), 2: _worker(2, 0, 502)}
    cause = root_cause.find(failures, sorted(running), str(tmp_path), running)
    assert cause is not None
    assert (cause.rank, cause.local_rank, cause.pid, cause.exception_type) == (1, 1, 501, "ValueError")
    assert cause.exit_code is None and cause.reason == "ValueError"
    assert cause.consequences == [0, 2]


@pytest.mark.parametrize("lost", ["DistBackendError", "RuntimeError"])
def test_a_lost_peer_gives_way_to_the_failure_it_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lost: str
) -> None:
    """A script that destroys its process group on the way out closes its connections before its excepthook runs: the
    peer blocked in ``all_reduce`` raises gloo's error (torch's ``DistBackendError``; plain ``RuntimeError`` before
    torch 2.2) and writes its time first. The rank whose own failure came within the window is the cause."""
    import torch.distributed as dist

    error = dist.DistBackendError if lost == "DistBackendError" else RuntimeError
    _write_own_failure(
        tmp_path, 600, error("[gloo/pair.cc:534] Connection closed by peer [127.0.0.1]:29500"), monkeypatch
    )
    time.sleep(0.002)
    _write_own_failure(tmp_path, 601, ValueError("corrupt batch 7"), monkeypatch)
    failures = {r: _process_failure(r, 600 + r, 1, tmp_path / "none.json") for r in (0, 1)}
    cause = root_cause.find(failures, [], str(tmp_path))
    assert cause is not None
    assert (cause.rank, cause.exception_type, cause.consequences) == (1, "ValueError", [0])


def test_a_lost_peer_long_before_any_other_failure_stays_first(tmp_path: Path) -> None:
    """Outside the window the communication error is the first failure known (its peer may have been killed)."""
    for pid, kind, offset in ((700, "DistBackendError", 0), (701, "ValueError", root_cause.PEER_LOSS_WINDOW_NS + 1)):
        data = {"time_unix_nano": 10**18 + offset, "pid": pid, "type": kind, "message": "m", "stacktrace": "s"}
        (tmp_path / f"{pid}.json").write_text(json.dumps(data))
    failures = {r: _process_failure(r, 700 + r, 1, tmp_path / "none.json") for r in (0, 1)}
    cause = root_cause.find(failures, [], str(tmp_path))
    assert cause is not None and (cause.rank, cause.exception_type) == (0, "DistBackendError")
