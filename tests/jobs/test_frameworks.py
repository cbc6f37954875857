"""Real framework jobs, bridged with no code change: a tiny Hugging Face ``Trainer`` and a tiny Lightning ``Trainer``.

Each job (``tests/support/workers/hf_trainer_worker.py``, ``lightning_worker.py``: 2 ranks under torchrun, CPU,
gloo, a model built from a small config, random data, never importing the bridge) trains ``STEPS`` optimizer steps
with a checkpoint every ``SAVE_EVERY`` steps, and writes its own ground truth through the framework's callbacks: the
steps it ran on each rank, the ``global_step`` of each checkpoint, whether the rank wrote checkpoint files and
their sizes. The expected figures come from those files, never from the bridge's code. Each job runs bridged
(``torchelastic_otel.run``, OTLP JSON Lines files) and under plain torchrun, which must end the same way with the
same steps; the bridged job's files are read with the report's reader (``report.otlpjson.read``) and its
``report --json``: every rank's step count, step phases, checkpoint spans in the attempt, and productive time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support import WORKERS
from tests.support.env import clean_env, files_env
from tests.support.jobs import launcher, report_run, unique_id
from tests.support.lazy import require
from tests.support.procs import run_job
from torchelastic_otel import _names as names
from torchelastic_otel.report import otlpjson
from torchelastic_otel.report.records import Point, Span, Telemetry

require("transformers", "lightning")

RANKS = 2
STEPS, SAVE_EVERY = 20, 10
SAVES = list(range(SAVE_EVERY, STEPS + 1, SAVE_EVERY))
#: The phases a step of each framework goes through (``collective_wait`` and ``other`` depend on the timing).
PHASES = ("input", "forward", "backward", "optimizer")
JOB_TIMEOUT = 240.0
#: No network: the models come from configs, the data is random.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip


def _launch(worker: Path, bridged: bool, base: Path) -> tuple[int, float, str]:
    """Run ``worker`` on 2 ranks; (exit code, wall seconds, output). Its ground truth goes to ``base/out``, the
    bridged job's OTLP JSON Lines files to ``base/files``."""
    out, files = base / "out", base / "files"
    out.mkdir(parents=True)
    job_settings = dict(OMP_NUM_THREADS="1", FRAMEWORK_OUT=str(out), FRAMEWORK_STEPS=str(STEPS),
                        FRAMEWORK_SAVE_EVERY=str(SAVE_EVERY), HF_HOME=str(base / "hf-home"), **OFFLINE)  # fmt: skip
    env = (
        files_env(files, OTEL_SERVICE_NAME="frameworks-test", **job_settings) if bridged else clean_env(**job_settings)
    )
    cmd = [*launcher(bridged), "--standalone", "--nproc-per-node", str(RANKS), "--max-restarts", "0",
           "--rdzv-id", unique_id(worker.stem), "--monitor-interval", "0.1", str(worker)]  # fmt: skip
    job = run_job(cmd, env, base, base / "job.log", timeout=JOB_TIMEOUT)
    return job.proc.returncode, job.seconds, job.output()


def _truth(out: Path) -> dict[int, dict[str, Any]]:
    found = {r["rank"]: r for r in (json.loads(p.read_text()) for p in sorted(out.glob("rank*.json")))}
    assert sorted(found) == list(range(RANKS)), f"ground truth missing: {sorted(found)}"
    return found


def _run(worker: Path, base: Path) -> dict[str, Any]:
    code, wall, output = _launch(worker, True, base / "bridged")
    plain_code, plain_wall, plain_output = _launch(worker, False, base / "plain")
    job: dict[str, Any] = {"code": code, "wall": wall, "output": output, "plain_code": plain_code,
                           "plain_wall": plain_wall, "plain_output": plain_output}  # fmt: skip
    if code == 0 and plain_code == 0:
        files = base / "bridged" / "files"
        job.update(truth=_truth(base / "bridged" / "out"), plain_truth=_truth(base / "plain" / "out"),
                   telemetry=otlpjson.read([files]), report=report_run(files))  # fmt: skip
    return job


@pytest.fixture(scope="module")
def hf_trainer(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run(WORKERS / "hf_trainer_worker.py", tmp_path_factory.mktemp("hf-trainer"))


@pytest.fixture(scope="module")
def lightning_trainer(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run(WORKERS / "lightning_worker.py", tmp_path_factory.mktemp("lightning"))


@pytest.fixture(params=["hf_trainer", "lightning_trainer"])
def job(request: pytest.FixtureRequest) -> dict[str, Any]:
    found: dict[str, Any] = request.getfixturevalue(request.param)
    return found


# ---- reading the bridged job's telemetry ---------------------------------------------------------------------------


def _last(points: list[Point]) -> Point:
    return max(points, key=lambda p: p.time)


def _worker_points(tel: Telemetry, name: str, rank: int, **attrs: str) -> list[Point]:
    return [
        p for p in tel.points
        if p.name == name and p.proc.kind == "worker" and p.proc.rank == rank
        and all(p.attrs.get(k) == v for k, v in attrs.items())
    ]  # fmt: skip


def _attempt(tel: Telemetry) -> Span:
    (attempt,) = [s for s in tel.spans if s.name == names.ATTEMPT and s.proc.kind == "agent"]
    return attempt


def _saves(tel: Telemetry, rank: int) -> list[Span]:
    found = [s for s in tel.spans if s.name == names.CHECKPOINT_SAVE and s.proc.rank == rank]
    return sorted(found, key=lambda s: s.start)


# ---- the tests -------------------------------------------------------------------------------------------------------


def test_the_job_ends_as_under_plain_torchrun_with_the_same_steps(job: dict[str, Any]) -> None:
    assert job["code"] == 0, job["output"][-4000:]
    assert job["plain_code"] == 0, job["plain_output"][-4000:]
    for truth in (job["truth"], job["plain_truth"]):
        assert all(t["steps"] == t["global_step"] == STEPS and t["saves"] == SAVES for t in truth.values()), truth
    assert {r: t["steps"] for r, t in job["truth"].items()} == {r: t["steps"] for r, t in job["plain_truth"].items()}
    assert job["report"]["outcome"] == "SUCCEEDED" and job["report"]["attempts"] == 1


def test_every_ranks_steps_are_the_steps_the_framework_ran(job: dict[str, Any]) -> None:
    assert job["code"] == job["plain_code"] == 0, job["output"][-4000:]
    tel = job["telemetry"]
    for rank, truth in job["truth"].items():
        counted = _worker_points(tel, names.WORKER_STEPS, rank)
        assert counted, f"rank {rank}: no {names.WORKER_STEPS}"
        assert _last(counted).value == truth["steps"], (rank, _last(counted), truth)
    by_rank = {entry["rank"]: entry["steps"] for entry in job["report"]["steps"]}
    assert by_rank == {rank: truth["steps"] for rank, truth in job["truth"].items()}


def test_every_step_has_its_phases(job: dict[str, Any]) -> None:
    """Each rank's phase histogram holds a point a step (the first step aside) for each phase, with time in it."""
    assert job["code"] == job["plain_code"] == 0, job["output"][-4000:]
    tel = job["telemetry"]
    for rank, truth in job["truth"].items():
        for phase in PHASES:
            points = _worker_points(tel, names.WORKER_STEP_PHASE_DURATION, rank, **{names.PHASE: phase})
            assert points, f"rank {rank}: no {phase} phase"
            last = _last(points)
            assert last.count is not None and truth["steps"] - 1 <= last.count <= truth["steps"], (rank, phase, last)
            assert last.total is not None and last.total > 0, (rank, phase, last)
    for entry in job["report"]["steps"]:
        assert set(entry["phases"]) == {*PHASES, "collective_wait", "other"}, entry
        assert entry["phases"]["forward"] > 0 and entry["phases"]["backward"] > 0, entry


def test_the_frameworks_checkpoints_are_spans_of_the_attempt_at_their_steps(job: dict[str, Any]) -> None:
    """Every rank that wrote checkpoint files (the framework says which) has save spans at each step the framework
    saved at, from its worker process, children of the agent's attempt; a rank that wrote none has none."""
    assert job["code"] == job["plain_code"] == 0, job["output"][-4000:]
    tel = job["telemetry"]
    attempt = _attempt(tel)
    writers = [rank for rank, truth in job["truth"].items() if truth["writes"]]
    assert writers, job["truth"]
    for rank, truth in job["truth"].items():
        saves = _saves(tel, rank)
        if not truth["writes"]:
            assert saves == [], (rank, [s.attrs for s in saves])
            continue
        assert saves, f"rank {rank}: no {names.CHECKPOINT_SAVE} span; the framework saved at steps {truth['saves']}"
        assert sorted({s.attrs.get(names.CHECKPOINT_STEP) for s in saves}) == truth["saves"], (
            rank,
            [s.attrs for s in saves],
        )
        for span in saves:
            assert span.proc.kind == "worker" and span.proc.restart == 0, span.proc
            assert (span.trace_id, span.parent_id) == (attempt.trace_id, attempt.span_id), span
            assert attempt.start <= span.start <= span.end <= attempt.end, span
            assert not span.failed, span
            assert span.attrs.get(names.CHECKPOINT_ASYNC) is False, span.attrs
            # the size of a file the framework wrote for that checkpoint
            sizes = truth["files"][str(span.attrs[names.CHECKPOINT_STEP])]
            assert span.attrs.get(names.CHECKPOINT_BYTES) in sizes.values(), (span.attrs, sizes)
        saved = _worker_points(tel, names.WORKER_CHECKPOINT_STEP, rank)
        assert saved and _last(saved).value == truth["saves"][-1], (rank, saved)
    assert job["report"]["goodput"]["seconds"]["checkpoint_save"] > 0, job["report"]["goodput"]


def test_the_steps_time_is_productive(job: dict[str, Any]) -> None:
    assert job["code"] == job["plain_code"] == 0, job["output"][-4000:]
    tel = job["telemetry"]
    for rank in job["truth"]:
        productive = _worker_points(tel, names.GOODPUT_TIME, rank, **{names.CAUSE: "productive"})
        assert productive and _last(productive).value > 0, (rank, productive)
    goodput = job["report"]["goodput"]
    assert goodput["seconds"]["productive"] > 0 and goodput["ratio"] > 0, goodput
    assert goodput["seconds"]["lost_progress"] == 0 and goodput["seconds"]["restart"] == 0, goodput
    assert sum(goodput["seconds"].values()) == pytest.approx(job["report"]["seconds"], rel=0.01), goodput
