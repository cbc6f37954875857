"""Framework logs in a real job: each library log line arrives once, as a logging record at its level, and the console
is plain torchrun's.

The worker (``tests/support/workers/logs_framework_worker.py``, 2 ranks under torchrun, never importing the bridge)
logs as framework jobs do: ``transformers``' and Lightning's library loggers, which print through a ``StreamHandler``
of their own and do not propagate to the root logger, and a ``logging.basicConfig`` root record; it builds a Lightning
``Trainer`` (rank 0's "GPU available: ..." lines), and writes lines that are no logging (``print``, fd 2 as native code
writes, a progress bar). The job runs bridged (``torchelastic_otel.run``, OTLP JSON Lines files) and under plain
torchrun:

- every library log line of each rank is exactly one log record with its level, its logger's name as scope,
  ``code.*``, and ``exception.*`` for the one logged with an exception;
- no line record (scope ``torchelastic_otel.worker.output``) repeats a line a logging handler printed -- the
  traceback of the exception included -- while the lines that are no logging are line records, once each;
- the console holds the same lines as plain torchrun's, each as many times (the ranks' interleaving aside), and each
  rank's own lines on stderr in the same order.
"""

from __future__ import annotations

import collections
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import WORKERS
from tests.support.env import clean_env, files_env
from tests.support.jobs import SEVERITY_ERROR, SEVERITY_INFO, SEVERITY_WARN, launcher, unique_id
from tests.support.lazy import require
from tests.support.procs import run_job

require("transformers", "lightning")

RANKS = 2
WORKER = WORKERS / "logs_framework_worker.py"
OUTPUT_SCOPE = "torchelastic_otel.worker.output"
JOB_TIMEOUT = 240.0
#: How long the records of the output processes may take to reach the files once the job ended (they flush last).
WAIT = 30.0
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
#: The worker's library log lines: (what, logger, severity number, severity text).
LOGGED = [
    ("transformers info", "transformers.logs_worker", SEVERITY_INFO, "INFO"),
    ("transformers warning", "transformers.logs_worker", SEVERITY_WARN, "WARN"),
    ("transformers error", "transformers.logs_worker", SEVERITY_ERROR, "ERROR"),
    ("root info", "logs_worker.script", SEVERITY_INFO, "INFO"),
    ("lightning info", "lightning.pytorch.logs_worker", SEVERITY_INFO, "INFO"),
]
#: The worker's lines that are no logging: (what, stream).
PRINTED = [("print", "stdout"), ("native stderr", "stderr"), ("progress 100%", "stderr")]
#: torchrun's own log lines ("W1127 05:20:01.123000 4242 torch/distributed/run.py:...] ..."): timing, pids.
_TORCH_LOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ")


def text(rank: int, what: str) -> str:
    return f"logs_worker rank {rank}: {what}"


def _launch(bridged: bool, base: Path) -> tuple[int | None, str]:
    """Run the worker on 2 ranks; (exit code, console). The bridged job's OTLP JSON Lines files go to ``base/files``."""
    job_settings = dict(OMP_NUM_THREADS="1", HF_HOME=str(base / "hf-home"), **OFFLINE)
    env = (files_env(base / "files", {}, OTEL_SERVICE_NAME="framework-logs-test", **job_settings) if bridged
           else clean_env(**job_settings))  # fmt: skip
    env.pop("CI", None)  # transformers' logger propagates to the root logger under CI
    cmd = [*launcher(bridged), "--standalone", "--nproc-per-node", str(RANKS), "--max-restarts", "0",
           "--rdzv-id", unique_id("framework-logs"), "--monitor-interval", "0.1", str(WORKER)]  # fmt: skip
    base.mkdir(parents=True, exist_ok=True)
    job = run_job(cmd, env, base, base / "job.log", timeout=JOB_TIMEOUT)
    return job.proc.returncode, job.output()


def worker_records(files: Path) -> list[dict[str, Any]]:
    """Every log record of the workers in the OTLP JSON Lines files: scope, severity, body, attributes, rank."""
    out = []
    for path in sorted(files.glob("logs-*.jsonl")):
        for raw in path.read_text(errors="replace").splitlines():
            try:
                request = json.loads(raw)
            except ValueError:
                continue  # a line being written
            for resource_logs in request.get("resourceLogs", []):
                resource = _attributes(resource_logs.get("resource", {}).get("attributes", []))
                if resource.get("torchelastic.process.kind") != "worker":
                    continue
                for scope_logs in resource_logs.get("scopeLogs", []):
                    scope = scope_logs.get("scope", {}).get("name", "")
                    for record in scope_logs.get("logRecords", []):
                        out.append({
                            "scope": scope,
                            "rank": int(resource["torchelastic.rank"]),
                            "severity_number": record.get("severityNumber"),
                            "severity_text": record.get("severityText"),
                            "body": record.get("body", {}).get("stringValue", ""),
                            "attributes": _attributes(record.get("attributes", [])),
                        })  # fmt: skip
    return out


def _attributes(items: list[dict[str, Any]]) -> dict[str, Any]:
    def value(v: dict[str, Any]) -> Any:
        if "intValue" in v:
            return int(v["intValue"])
        return next(iter(v.values()), None)

    return {item["key"]: value(item.get("value", {})) for item in items}


def console_lines(console: str) -> list[str]:
    """The console's lines but torchrun's own log lines (their time and pids differ from run to run)."""
    return [line for line in console.replace("\r\n", "\n").split("\n") if line and not _TORCH_LOG.match(line)]


def stderr_lines(lines: list[str], rank: int) -> list[str]:
    """The rank's own lines on stderr (all but its ``print``: two pipes carry no order between them)."""
    return [line for line in lines if f"logs_worker rank {rank}:" in line and line != text(rank, "print")]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("framework-logs")
    code, console = _launch(True, base / "bridged")
    plain_code, plain_console = _launch(False, base / "plain")
    files = base / "bridged" / "files"
    last = {(rank, text(rank, "progress 100%")) for rank in range(RANKS)}
    records: list[dict[str, Any]] = []
    deadline = time.monotonic() + WAIT
    while code == 0 and time.monotonic() < deadline:  # the output processes export the last lines last
        records = worker_records(files)
        if last <= {(r["rank"], r["body"]) for r in records if r["scope"] == OUTPUT_SCOPE}:
            break
        time.sleep(0.2)
    return {"code": code, "console": console, "plain_code": plain_code, "plain_console": plain_console,
            "records": records}  # fmt: skip


def test_both_jobs_end_as_plain_torchrun(jobs: dict[str, Any]) -> None:
    assert jobs["code"] == 0, jobs["console"][-4000:]
    assert jobs["plain_code"] == 0, jobs["plain_console"][-4000:]
    for rank in range(RANKS):
        assert text(rank, "progress 100%") in {r["body"] for r in jobs["records"] if r["rank"] == rank}, (
            f"rank {rank}'s last line never arrived"
        )


def test_each_library_log_line_is_one_logging_record_at_its_level(jobs: dict[str, Any]) -> None:
    assert jobs["code"] == 0, jobs["console"][-4000:]
    records = jobs["records"]
    for rank in range(RANKS):
        for what, logger, severity_number, severity_text in LOGGED:
            found = [r for r in records if r["rank"] == rank and r["body"] == text(rank, what)]
            assert len(found) == 1, (rank, what, found)
            (record,) = found
            assert record["scope"] == logger, record
            assert (record["severity_number"], record["severity_text"]) == (severity_number, severity_text), record
            assert record["attributes"]["code.file.path"].endswith("logs_framework_worker.py"), record
            assert record["attributes"]["code.function.name"] == "main", record
            if what == "transformers error":
                assert record["attributes"]["exception.type"] == "ValueError", record
                assert record["attributes"]["exception.message"] == "bad shard", record
                assert 'raise ValueError("bad shard")' in record["attributes"]["exception.stacktrace"], record
    # Lightning's own lines, through its non-propagating logger, on rank 0 only (``rank_zero_info``)
    gpu = [r for r in records if r["body"] == "GPU available: False, used: False"]
    assert [(r["rank"], r["scope"], r["severity_text"]) for r in gpu] == [
        (0, "lightning.pytorch.utilities.rank_zero", "INFO")
    ], gpu


def test_no_line_record_repeats_a_line_a_logging_handler_printed(jobs: dict[str, Any]) -> None:
    assert jobs["code"] == 0, jobs["console"][-4000:]
    lines = [r for r in jobs["records"] if r["scope"] == OUTPUT_SCOPE]
    logged = [what for what, *_ in LOGGED]
    repeated = [r["body"] for r in lines if any(what in r["body"] for what in logged)]
    repeated += [r["body"] for r in lines if "bad shard" in r["body"] or "GPU available" in r["body"]]
    assert repeated == [], repeated
    for rank in range(RANKS):
        for what, stream in PRINTED:
            found = [r for r in lines if r["rank"] == rank and r["body"] == text(rank, what)]
            assert [r["attributes"].get("log.iostream") for r in found] == [stream], (rank, what, found)
    # the handlers' lines were on the console all the same
    console = console_lines(jobs["console"])
    for rank in range(RANKS):
        assert f"[transformers] {text(rank, 'transformers warning')}" in console
        assert f"INFO logs_worker.script: {text(rank, 'root info')}" in console
        assert text(rank, "lightning info") in console


def test_the_console_is_plain_torchruns(jobs: dict[str, Any]) -> None:
    assert jobs["code"] == jobs["plain_code"] == 0, jobs["console"][-4000:]
    bridged, plain = console_lines(jobs["console"]), console_lines(jobs["plain_console"])
    only_bridged = collections.Counter(bridged) - collections.Counter(plain)
    only_plain = collections.Counter(plain) - collections.Counter(bridged)
    assert (dict(only_bridged), dict(only_plain)) == ({}, {}), (jobs["console"], jobs["plain_console"])
    for rank in range(RANKS):
        assert stderr_lines(bridged, rank) == stderr_lines(plain, rank), rank
