"""``accelerate launch`` bridged end to end: ``torchelastic-otel accelerate launch ...`` and ``opentelemetry-instrument
accelerate launch ...`` against plain ``accelerate launch``.

The job (``tests/support/workers/accelerate_worker.py``: ``Accelerator()``, a tiny model, ``accelerator.backward``,
2 ranks on CPU through ``--multi_gpu`` with ``ACCELERATE_USE_CPU=1``, never importing the bridge) fails on rank 1 in
its first attempt (a marker file makes it fail once) and succeeds in the second (``--max_restarts 1``). accelerate
runs torch's launcher in its own process (``torch.distributed.run.run``).

The launches take accelerate's port-in-use route (the test holds ``--main_process_port``): accelerate then asks torch
for a standalone rendezvous. Its default single-machine rendezvous is torch's static one, whose store outlives an
attempt, and a restarted attempt's ``init_process_group`` there hung in at least 2 of 5 runs, plain and bridged alike.

Each route must end as plain ``accelerate launch`` does (exit code, console lines), leave no process behind, and
its OTLP JSON Lines files must hold the run, both attempts, both ranks' worker spans in each, and rank 1's failure
as the root cause. The ``torchelastic-otel`` route and plain accelerate run in a child that compares its
``os.environ`` before and after: the bridge must leave what plain accelerate leaves.
"""

from __future__ import annotations

import collections
import json
import os
import re
import socket
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support import WORKERS
from tests.support.env import clean_env, files_env
from tests.support.jobs import BIN, OTEL_INSTRUMENT, failure_report, report_run
from tests.support.lazy import require
from tests.support.procs import run_job
from tests.support.waiting import wait_for
from torchelastic_otel import _names as names
from torchelastic_otel.report import otlpjson
from torchelastic_otel.report.records import Telemetry

require("accelerate")

ACCELERATE = BIN / "accelerate"
WORKER = WORKERS / "accelerate_worker.py"
RANKS = 2
JOB_TIMEOUT = 300.0
ROUTES = ("torchelastic-otel", "opentelemetry-instrument")
#: The ``torchelastic-otel`` route as its console script runs it (``run.main``), and plain ``accelerate`` as its
#: console script does, in a child that compares its ``os.environ`` before and after (the names whose value changed
#: go to ``ACCEL_ENV_CHECK``); an exception propagates as it would.
CHILD = """
import json, os, sys
before = dict(os.environ)
try:
    if sys.argv[1] == "bridged":
        from torchelastic_otel.run import main
        main(["accelerate", *sys.argv[2:]])
    else:
        from accelerate.commands.accelerate_cli import main
        sys.argv = ["accelerate", *sys.argv[2:]]
        main()
finally:
    after = dict(os.environ)
    with open(before["ACCEL_ENV_CHECK"], "w") as fh:
        json.dump(sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k)), fh)
"""
#: torch's agent log lines (``W1127 05:25:18.599000 <pid> <file>:<line>] ...``): their timing differs run to run.
AGENT_LINE = re.compile(r"^(\[[^\]]*\]:)?[IWE]\d{4} \d\d:\d\d:\d\d\.\d+ \d+ ")


def _held_port() -> socket.socket:
    """A listening socket on 127.0.0.1: accelerate finds its port in use and launches standalone. One a launch: a
    connection accelerate made to check it stays in the backlog, never accepted."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    return sock


def _token_processes(token: str) -> list[int]:
    """Pids of live processes whose environment carries ``token`` (the job's processes: agent, workers, their
    output processes, anything they started)."""
    found = []
    needle = f"ACCEL_TEST_TOKEN={token}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _launch(route: str, base: Path, max_restarts: int = 1) -> dict[str, Any]:
    """Run the job under ``route`` (``plain`` or one of ``ROUTES``); its exit code, output, leftovers and files."""
    base.mkdir(parents=True)
    token = uuid.uuid4().hex
    job_settings = dict(OMP_NUM_THREADS="1", ACCELERATE_USE_CPU="1", HF_HOME=str(base / "hf-home"),
                        ACCEL_FAIL_RANK="1", ACCEL_FAIL_MARKER=str(base / "failed-once"),
                        ACCEL_ENV_CHECK=str(base / "env-changed.json"), ACCEL_TEST_TOKEN=token)  # fmt: skip
    env = (clean_env(**job_settings) if route == "plain"
           else files_env(base / "files", OTEL_SERVICE_NAME="accelerate-test", **job_settings))  # fmt: skip
    args = ["launch", "--multi_gpu", "--num_processes", str(RANKS), "--num_machines", "1", "--mixed_precision", "no",
            "--dynamo_backend", "no", "--max_restarts", str(max_restarts), "--monitor_interval", "0.1",
            "--main_process_port", "<held>", str(WORKER)]  # fmt: skip
    prefix = {"plain": [sys.executable, "-c", CHILD, "plain"],
              "torchelastic-otel": [sys.executable, "-c", CHILD, "bridged"],
              "opentelemetry-instrument": [str(OTEL_INSTRUMENT), str(ACCELERATE)]}[route]  # fmt: skip
    held = _held_port()
    try:
        args = [str(held.getsockname()[1]) if a == "<held>" else a for a in args]
        job = run_job([*prefix, *args], env, base, base / "job.log", timeout=JOB_TIMEOUT)
    finally:
        held.close()
    left: list[int] = []
    try:
        wait_for(lambda: not _token_processes(token), timeout=20, what="the job's processes to be gone")
    except AssertionError:
        left = _token_processes(token)
    found: dict[str, Any] = {"code": job.proc.returncode, "output": job.output(), "left": left}
    if route != "plain" and (base / "files").is_dir():
        found.update(telemetry=otlpjson.read([base / "files"]), report=report_run(base / "files"))
    if (base / "env-changed.json").exists():
        found["env_changed"] = json.loads((base / "env-changed.json").read_text())
    return found


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    base = tmp_path_factory.mktemp("accelerate")
    return {route: _launch(route, base / route) for route in ("plain", *ROUTES)}


@pytest.fixture(scope="module")
def failed_jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The same job without a restart (``--max_restarts 0``): rank 1's failure fails it."""
    base = tmp_path_factory.mktemp("accelerate-failed")
    return {route: _launch(route, base / route, max_restarts=0) for route in ("plain", "torchelastic-otel")}


@pytest.fixture(params=ROUTES)
def route(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _console(output: str) -> collections.Counter[str]:
    """The job's console lines but torch's agent log lines, pids and addresses masked."""
    lines = (line.rstrip() for line in output.splitlines())
    kept = (re.sub(r"\b\d{3,}\b", "N", line) for line in lines if line and not AGENT_LINE.match(line))
    return collections.Counter(kept)


def _agent_failures(output: str) -> list[str]:
    """torch's agent lines reporting a failed rank, pids masked."""
    return sorted(re.sub(r"pid: \d+", "pid: N", m) for m in re.findall(r"failed \(exitcode: .*", output))


# ---- the tests -------------------------------------------------------------------------------------------------------


def test_the_plain_job_restarts_once_and_succeeds(jobs: dict[str, dict[str, Any]]) -> None:
    plain = jobs["plain"]
    assert plain["code"] == 0, plain["output"][-4000:]
    assert "accelerate_worker rank 1 failed on purpose (restart 0)" in plain["output"]
    for rank in range(RANKS):
        assert f"accelerate_worker rank {rank} of {RANKS} on cpu starts" in plain["output"], plain["output"][-4000:]
        assert f"accelerate_worker rank {rank} done" in plain["output"]


def test_the_bridged_job_ends_as_plain_accelerate_launch(jobs: dict[str, dict[str, Any]], route: str) -> None:
    """Same exit code, same console lines (ignoring interleaving and torch's agent log lines, whose timing
    differs), the same failure reported by torch's agent, and no process left behind by either."""
    plain, bridged = jobs["plain"], jobs[route]
    assert bridged["code"] == plain["code"] == 0, bridged["output"][-4000:]
    assert _console(bridged["output"]) == _console(plain["output"]), (bridged["output"], plain["output"])
    assert _agent_failures(bridged["output"]) == _agent_failures(plain["output"]) != []
    assert bridged["left"] == [] and plain["left"] == [], (bridged["left"], plain["left"])


def test_the_launching_process_keeps_its_environment(jobs: dict[str, dict[str, Any]]) -> None:
    """What the launch leaves changed in its process's ``os.environ`` is what plain accelerate leaves (torch's
    ``run`` sets ``TORCHELASTIC_SIGNALS_TO_HANDLE`` for good): nothing of the bridge's."""
    bridged, plain = jobs["torchelastic-otel"]["env_changed"], jobs["plain"]["env_changed"]
    assert bridged == plain, (bridged, plain)
    assert (
        not [k for k in bridged if k.startswith(("OTEL_", "TRACE", "PYTHONPATH"))]
        and "TORCHELASTIC_RUN_ID" not in bridged
    )


def test_the_run_its_attempts_and_both_ranks_arrive(jobs: dict[str, dict[str, Any]], route: str) -> None:
    job = jobs[route]
    assert job["code"] == 0, job["output"][-4000:]
    tel: Telemetry = job["telemetry"]
    (run,) = [s for s in tel.spans if s.name == names.RUN]
    attempts = sorted((s for s in tel.spans if s.name == names.ATTEMPT), key=lambda s: s.start)
    assert [s.attrs.get(names.RESTART_COUNT) for s in attempts] == [0, 1], [s.attrs for s in attempts]
    run_id = run.attrs.get(names.RUN_ID)
    assert run_id and run_id != "none" and uuid.UUID(str(run_id)), run.attrs
    assert attempts[0].parent_id == run.span_id, attempts[0]  # the next attempt is a child of its restart's span
    assert {s.trace_id for s in tel.spans} == {run.trace_id}, {s.trace_id for s in tel.spans}
    for restart, attempt in enumerate(attempts):
        workers = [s for s in tel.spans if s.name == names.WORKER_START and s.proc.restart == restart]
        assert sorted(s.proc.rank for s in workers) == list(range(RANKS)), [s.proc for s in workers]
        for span in workers:
            assert span.proc.run_id == run_id, span.proc
            assert (span.trace_id, span.parent_id) == (attempt.trace_id, attempt.span_id), span
    assert {s.name for s in tel.spans} >= {names.RENDEZVOUS, names.WORKERS_FAILURE, names.RESTART}
    restarts = [p for p in tel.points if p.name == names.WORKERS_RESTARTS]
    assert restarts and max(p.value for p in restarts) == 1, restarts
    steps = [p for p in tel.points if p.name == names.WORKER_STEPS and p.proc.kind == "worker"]
    assert {p.proc.rank for p in steps} == set(range(RANKS)), steps
    if route == "torchelastic-otel":  # the agent's resource carries the run id (settled before the bridge starts)
        assert run.proc.kind == "agent" and run.proc.run_id == run_id, run.proc


def test_rank_1_is_the_root_cause(jobs: dict[str, dict[str, Any]], route: str) -> None:
    job = jobs[route]
    assert job["code"] == 0, job["output"][-4000:]
    report = job["report"]
    assert report["outcome"] == "SUCCEEDED" and report["attempts"] == 2, report
    cause = report["root_cause"]
    assert cause["rank"] == 1 and cause["attempt"] == 0 and cause["exit_code"] == 1, cause
    assert cause["exception_type"] == "RuntimeError", cause
    assert cause["exception_message"] == "accelerate_worker rank 1 failed on purpose (restart 0)", cause
    tel: Telemetry = job["telemetry"]
    records = [r for r in tel.logs if r.name == names.ROOT_CAUSE]
    assert [r.attrs.get(names.ROOT_CAUSE_RANK) for r in records] == [1], [r.attrs for r in records]


def test_a_failed_job_exits_as_under_plain_accelerate_launch(failed_jobs: dict[str, dict[str, Any]]) -> None:
    """The exit code, torch's failure report and the exception accelerate's process ends with are plain accelerate's
    (the tracebacks' frames differ by the bridge's wrappers); the report names rank 1 as the root cause."""
    plain, bridged = failed_jobs["plain"], failed_jobs["torchelastic-otel"]
    assert bridged["code"] == plain["code"] == 1, (bridged["output"][-4000:], plain["output"][-4000:])
    # rank 1's entry; rank 0 is in the report too where it still ran when rank 1 failed (stopped: SIGTERM)
    reports = failure_report(bridged["output"]), failure_report(plain["output"])
    assert [r[1][0::2] for r in reports] == [(1, ""), (1, "")] and all(set(r) <= {0, 1} for r in reports), reports
    root = [re.search(r"Root Cause \(first observed failure\):\s*\[0\]:.*?rank\s*:\s*(\d+)", job["output"], re.S)
            for job in (bridged, plain)]  # fmt: skip
    assert [m.group(1) if m else None for m in root] == ["1", "1"], root
    ending = [line for line in bridged["output"].splitlines() if line.startswith("torch.distributed.elastic")]
    assert ending == [line for line in plain["output"].splitlines() if line.startswith("torch.distributed.elastic")]
    assert ending and "ChildFailedError" in ending[-1], ending
    assert _agent_failures(bridged["output"]) == _agent_failures(plain["output"]) != []
    assert bridged["left"] == [] and plain["left"] == [], (bridged["left"], plain["left"])
    assert bridged["env_changed"] == plain["env_changed"], (bridged["env_changed"], plain["env_changed"])
    report = bridged["report"]
    assert report["outcome"] == "FAILED" and report["attempts"] == 1, report
    assert report["root_cause"]["rank"] == 1 and report["root_cause"]["exit_code"] == 1, report["root_cause"]


# ---- the run id the bridge's route settles (no process) -------------------------------------------------------------


def _torch_args(*argv: str) -> Any:
    """torch's arguments as accelerate builds them for one machine: its parser's defaults, ``--master_port`` set."""
    from torch.distributed.run import get_args_parser

    return get_args_parser().parse_args([*argv, "train.py"])


def test_a_single_machine_static_run_gets_a_fresh_run_id() -> None:
    """accelerate's default: static rendezvous with ``--master_port``; torch would name the run ``none``."""
    from torchelastic_otel.accelerate import settle_run_id

    first, second = _torch_args("--nproc_per_node", "2", "--master_port", "29500"), _torch_args("--master_port", "1")
    run_ids = settle_run_id(first), settle_run_id(second)
    assert run_ids[0] != run_ids[1] and all(uuid.UUID(str(r)) for r in run_ids), run_ids
    assert (first.rdzv_backend, first.master_port, first.rdzv_endpoint) == ("static", 29500, ""), first
    assert first.rdzv_id == run_ids[0]


def test_a_static_run_across_machines_keeps_torchs_run_id() -> None:
    from torchelastic_otel.accelerate import settle_run_id

    args = _torch_args("--nnodes", "2", "--node_rank", "0", "--master_port", "29500")
    assert settle_run_id(args) is None and args.rdzv_id == "none" and args.rdzv_backend == "static"


def test_a_standalone_run_is_settled_as_torchrun_would() -> None:
    from torchelastic_otel.accelerate import settle_run_id

    args = _torch_args("--standalone", "--master_port", "29500")
    run_id = settle_run_id(args)
    assert run_id and uuid.UUID(run_id) and args.rdzv_id == run_id, vars(args)
    assert (args.standalone, args.rdzv_backend, args.rdzv_endpoint) == (False, "c10d", "localhost:0")
