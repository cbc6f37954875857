"""What a Hugging Face ``Trainer`` and a Lightning ``Trainer`` log arrives as instrument values of the right rank
and attempt, and their train / evaluate / save phases as spans of the attempt's trace, with no code change.

Real 2-rank torchrun jobs (``tests/support/workers/hf_trainer_worker.py``, ``lightning_worker.py``: CPU, gloo, a
model built from a small config, random data, never importing the bridge), ``--max-restarts 1``, evaluating every
``SAVE_EVERY`` steps, and rank 1 raising once at step ``FAIL_AT`` of the first attempt (a marker file keeps the
second from failing). Each worker writes what it logged, per rank and attempt (the ``Trainer``'s own
``state.log_history``; the Lightning module's own ``self.log`` values): the expected figures come from there, never
from the bridge's code. The bridged job exports OTLP JSON Lines files, read with the report's reader; the same job
runs under plain torchrun, which must end with the same exit code.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import WORKERS
from tests.support.env import clean_env, files_env
from tests.support.jobs import launcher, unique_id
from tests.support.lazy import require
from tests.support.procs import run_job
from torchelastic_otel import _names as names
from torchelastic_otel.report import otlpjson
from torchelastic_otel.report.records import Point, Span, Telemetry

require("transformers", "lightning")

RANKS = 2
STEPS, SAVE_EVERY, FAIL_AT = 20, 10, 7
JOB_TIMEOUT = 300.0
#: How long the job's processes may take to be gone once the launcher returned.
GONE_SECONDS = 10.0
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
#: The key each worker logs its training loss under.
LOSS_KEY = {"hf_trainer_worker": "loss", "lightning_worker": "train_loss"}
FRAMEWORK = {"hf_trainer_worker": "hf", "lightning_worker": "lightning"}


def _launch(worker: Path, bridged: bool, base: Path) -> dict[str, Any]:
    out, files = base / "out", base / "files"
    out.mkdir(parents=True)
    job_settings = dict(OMP_NUM_THREADS="1", FRAMEWORK_OUT=str(out), FRAMEWORK_STEPS=str(STEPS),
                        FRAMEWORK_SAVE_EVERY=str(SAVE_EVERY), FRAMEWORK_EVAL="1", FRAMEWORK_FAIL_AT=str(FAIL_AT),
                        FRAMEWORK_FAIL_ONCE=str(base / "failed-once"), HF_HOME=str(base / "hf-home"),
                        **OFFLINE)  # fmt: skip
    env = (files_env(files, OTEL_SERVICE_NAME="framework-metrics-test", **job_settings) if bridged
           else clean_env(**job_settings))  # fmt: skip
    cmd = [*launcher(bridged), "--standalone", "--nproc-per-node", str(RANKS), "--max-restarts", "1",
           "--rdzv-id", unique_id(worker.stem), "--monitor-interval", "0.1", str(worker)]  # fmt: skip
    job = run_job(cmd, env, base, base / "job.log", timeout=JOB_TIMEOUT)
    return {"code": job.proc.returncode, "output": job.output(), "left": _left_behind(str(out)), "out": out,
            "files": files}  # fmt: skip


def _left_behind(marker: str) -> list[int]:
    """Pids of processes whose environment holds ``marker`` (the job's own output directory), once they had
    ``GONE_SECONDS`` to go."""
    deadline = time.monotonic() + GONE_SECONDS
    while True:
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != os.getpid():
                try:
                    with open(f"/proc/{entry}/environ", "rb") as fh:
                        if marker.encode() in fh.read():
                            found.append(int(entry))
                except OSError:
                    continue
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.2)  # poll interval while a process is still exiting; bounded by the deadline


def _logged(out: Path, worker: str) -> dict[tuple[int, int], list[tuple[int, float]]]:
    """(rank, attempt) -> the (step, loss) pairs the worker logged, from its own files."""
    found: dict[tuple[int, int], list[tuple[int, float]]] = {}
    for path in out.glob("logged-rank*-attempt*.json"):
        rank, attempt = (int(part) for part in path.stem.removeprefix("logged-rank").split("-attempt"))
        record = json.loads(path.read_text())
        if worker == "hf_trainer_worker":
            pairs = [(e["step"], e["loss"]) for e in record["log_history"] if "loss" in e]
        else:
            pairs = [(step, value) for step, value in record["train_loss"]]
        found[(rank, attempt)] = pairs
    return found


def _run(worker: str, base: Path) -> dict[str, Any]:
    path = WORKERS / f"{worker}.py"
    bridged, plain = _launch(path, True, base / "bridged"), _launch(path, False, base / "plain")
    job: dict[str, Any] = {"worker": worker, "bridged": bridged, "plain": plain}
    if bridged["code"] == 0:
        job["telemetry"] = otlpjson.read([bridged["files"]])
        job["logged"] = _logged(bridged["out"], worker)
    return job


@pytest.fixture(scope="module")
def hf_job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run("hf_trainer_worker", tmp_path_factory.mktemp("hf-metrics"))


@pytest.fixture(scope="module")
def lightning_job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run("lightning_worker", tmp_path_factory.mktemp("lightning-metrics"))


@pytest.fixture(params=["hf_job", "lightning_job"])
def job(request: pytest.FixtureRequest) -> dict[str, Any]:
    found: dict[str, Any] = request.getfixturevalue(request.param)
    return found


def _points(tel: Telemetry, name: str, rank: int, attempt: int) -> list[Point]:
    found = [p for p in tel.points if p.name == name and p.proc.kind == "worker" and p.proc.rank == rank
             and p.proc.restart == attempt]  # fmt: skip
    return sorted(found, key=lambda p: p.time)


def _attempts(tel: Telemetry) -> dict[int, Span]:
    spans = [s for s in tel.spans if s.name == names.ATTEMPT and s.proc.kind == "agent"]
    return {s.attrs[names.RESTART_COUNT]: s for s in spans}


def _spans(tel: Telemetry, name: str, rank: int, attempt: int) -> list[Span]:
    found = [s for s in tel.spans if s.name == name and s.proc.rank == rank and s.proc.restart == attempt]
    return sorted(found, key=lambda s: s.start)


def _succeeded(job: dict[str, Any]) -> None:
    assert job["bridged"]["code"] == 0, job["bridged"]["output"][-4000:]


# ---- the tests ------------------------------------------------------------------------------------------------------


def test_the_job_restarts_once_and_ends_as_under_plain_torchrun_leaving_no_process(job: dict[str, Any]) -> None:
    assert job["bridged"]["code"] == job["plain"]["code"] == 0, (job["bridged"]["output"][-3000:],
                                                                 job["plain"]["output"][-3000:])  # fmt: skip
    assert "injected failure" in job["bridged"]["output"] and "injected failure" in job["plain"]["output"]
    assert job["bridged"]["left"] == [] and job["plain"]["left"] == []
    assert sorted(_attempts(job["telemetry"])) == [0, 1]


def test_the_logged_losses_arrive_for_their_rank_and_attempt(job: dict[str, Any]) -> None:
    """Every exported loss value is one the framework logged on that rank in that attempt; the last one of the
    second attempt is its last logged loss, at the last step. The first attempt (until rank 1 raised at step 7)
    has its step-5 loss on the ranks that exported it."""
    _succeeded(job)
    tel, logged = job["telemetry"], job["logged"]
    name = names.FRAMEWORK_METRIC_PREFIX + LOSS_KEY[job["worker"]]
    first_attempt = 0
    for rank in range(RANKS):
        for attempt in (0, 1):
            points = _points(tel, name, rank, attempt)
            values = {value for _, value in logged[(rank, attempt)]}
            assert all(p.value in values for p in points), (rank, attempt, [p.value for p in points], values)
            assert all(p.attrs == {names.FRAMEWORK: FRAMEWORK[job["worker"]], names.SPLIT: "train"} for p in points)
            first_attempt += bool(points) and attempt == 0
        final = _points(tel, name, rank, 1)
        assert final, f"rank {rank}: no {name} in the second attempt"
        last_step = max(step for step, _ in logged[(rank, 1)])
        expected = [value for step, value in logged[(rank, 1)] if step == last_step][-1]
        if job["worker"] == "lightning_worker":  # its module logs every step; the loggers get every 5th batch
            expected = [value for step, value in logged[(rank, 1)] if step == STEPS - 1][-1]
        assert final[-1].value == expected, (rank, final[-1], logged[(rank, 1)])
        steps = _points(tel, names.FRAMEWORK_STEP, rank, 1)
        assert steps and steps[-1].value == STEPS, (rank, steps)
    assert first_attempt >= 1, "no loss of the first attempt from any rank"


def test_evaluation_values_arrive_with_their_split(job: dict[str, Any]) -> None:
    _succeeded(job)
    tel = job["telemetry"]
    name, split = {"hf_trainer_worker": ("eval_loss", "eval"), "lightning_worker": ("val_loss", "validate")}[
        job["worker"]
    ]
    for rank in range(RANKS):
        points = _points(tel, names.FRAMEWORK_METRIC_PREFIX + name, rank, 1)
        assert points and all(p.attrs[names.SPLIT] == split for p in points), (rank, points)
        assert all(p.value is not None and p.value > 0 for p in points)


def test_train_evaluate_and_save_spans_sit_in_the_attempts_trace(job: dict[str, Any]) -> None:
    """Per rank, in the second attempt: one train span, child of the agent's attempt span; evaluate spans at the
    evaluation steps and save spans at the save steps, children of the train span."""
    _succeeded(job)
    tel = job["telemetry"]
    attempt = _attempts(tel)[1]
    for rank in range(RANKS):
        (train,) = _spans(tel, names.FRAMEWORK_TRAIN, rank, 1)
        assert (train.trace_id, train.parent_id) == (attempt.trace_id, attempt.span_id), train
        assert attempt.start <= train.start <= train.end <= attempt.end
        assert not train.failed
        evaluations = _spans(tel, names.FRAMEWORK_EVALUATE, rank, 1)
        saves = _spans(tel, names.FRAMEWORK_SAVE, rank, 1)
        assert [s.attrs[names.FRAMEWORK_GLOBAL_STEP] for s in evaluations] == [SAVE_EVERY, STEPS], evaluations
        assert [s.attrs[names.FRAMEWORK_GLOBAL_STEP] for s in saves] == [SAVE_EVERY, STEPS], saves
        for span in [*evaluations, *saves]:
            assert (span.trace_id, span.parent_id) == (train.trace_id, train.span_id), span
            assert train.start <= span.start <= span.end <= train.end, span
            assert span.attrs[names.FRAMEWORK] == FRAMEWORK[job["worker"]]
    failed = _spans(tel, names.FRAMEWORK_TRAIN, 1, 0)
    first = _attempts(tel)[0]
    assert all(s.failed and s.trace_id == first.trace_id for s in failed), failed
