"""A rank whose memory creeps, in a real torchrun job: the report names it, with the growth the job itself measured.

The job (``tests/support/workers/mem_worker.py``: DDP on gloo, CPU, 2 ranks, rendezvous on 127.0.0.1) takes 40 steps
of 0.1 s, each with its collectives (DDP's gradient all-reduce and one ``all_reduce`` of its own); rank 1 keeps 8 MiB
more each step, rank 0 nothing. Each rank writes its own ``VmRSS`` after every step: that is the ground truth, never
the bridge's code. Bridged by ``python -m torchelastic_otel.run``, every process exports OTLP JSON Lines files (a
metric export every 200 ms), read back with the report's reader (``torchelastic_otel.report``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT
from tests.support.env import PACE, clean_env, files_env
from tests.support.jobs import c10d_args, launcher, unique_id
from tests.support.procs import run_job
from torchelastic_otel import _names as names
from torchelastic_otel.report import build, memory, read
from torchelastic_otel.report.model import Job

pytest.importorskip("torch.distributed.elastic.agent.server.local_elastic_agent")
pytest.importorskip("opentelemetry.exporter.otlp.json.file")

WORKER = ROOT / "tests" / "support" / "workers" / "mem_worker.py"
LEAK_RANK, LEAK_MIB, STEPS, STEP_SECONDS = 1, 8, 40, 0.1
MIB = 1 << 20
S = 1e9


@dataclass
class Run:
    code: int
    seconds: float
    output: str
    out: Path
    files: Path

    def truth(self) -> dict[int, list[dict[str, Any]]]:
        """Per rank: the job's own readings, ``{"time_ns", "rss", "step"}``, in order."""
        return {int(p.name[4 : p.name.index("-")]): [json.loads(line) for line in p.read_text().splitlines()]
                for p in sorted(self.out.glob("rank*-restart0.jsonl"))}  # fmt: skip


def _launch(tmp: Path, bridged: bool) -> Run:
    out, files = tmp / "out", tmp / "files"
    pace = {**PACE, "OTEL_METRIC_EXPORT_INTERVAL": "200"}
    env = (
        files_env(files, pace, OTEL_SERVICE_NAME="memory-test", OMP_NUM_THREADS="1")
        if bridged
        else clean_env(OMP_NUM_THREADS="1")
    )
    cmd = [*launcher(bridged), "--nnodes", "1", "--nproc-per-node", "2", "--max-restarts", "0",
           *c10d_args(unique_id("memory")), str(WORKER), "--out", str(out), "--leak-rank", str(LEAK_RANK),
           "--leak-mib", str(LEAK_MIB), "--steps", str(STEPS), "--step-seconds", str(STEP_SECONDS)]  # fmt: skip
    job = run_job(cmd, env, ROOT, tmp / "job.log")
    return Run(job.proc.returncode, job.seconds, job.output(), out, files)


@pytest.fixture(scope="module")
def bridged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Job]:
    run = _launch(tmp_path_factory.mktemp("memory-bridged"), bridged=True)
    assert run.code == 0, run.output[-4000:]
    (job,) = build(read([run.files]))
    return run, job


def _slope(readings: list[tuple[int, float]]) -> float:
    slope, _, _ = memory.fit(readings)
    return slope


def _at(readings: list[tuple[int, float]], time_ns: int) -> float:
    """The job's own RSS at ``time_ns``, interpolated between its two readings around it."""
    before = max((r for r in readings if r[0] <= time_ns), default=readings[0])
    after = min((r for r in readings if r[0] >= time_ns), default=readings[-1])
    if after[0] == before[0]:
        return before[1]
    return before[1] + (after[1] - before[1]) * (time_ns - before[0]) / (after[0] - before[0])


def test_the_report_names_the_creeping_rank_only(bridged: tuple[Run, Job]) -> None:
    run, job = bridged
    print(f"job: {run.seconds:.1f} s wall")
    found = memory.creep(job)
    assert [(c.rank, c.restart) for c in found] == [(LEAK_RANK, 0)], [c.text for c in found]
    (creep,) = found
    assert creep.text.startswith(f"rank {LEAK_RANK} grew ") and "MiB/s" in creep.text, creep.text
    print(creep.text)


def test_the_growth_is_what_the_job_measured(bridged: tuple[Run, Job]) -> None:
    run, job = bridged
    (creep,) = memory.creep(job)
    truth = run.truth()[LEAK_RANK]
    steps = [(r["time_ns"], float(r["rss"])) for r in truth if r["step"] >= 1]
    rate = _slope(steps)  # the job's own bytes per second over its steps
    assert rate > 0.8 * LEAK_MIB * MIB / STEP_SECONDS, rate / MIB  # it did leak, about as planned
    assert creep.growth_bytes_per_s == pytest.approx(rate, rel=0.15), (creep.growth_bytes_per_s / MIB, rate / MIB)
    grown = _at(steps, creep.end) - _at(steps, creep.start)  # the job's own growth over the report's window
    assert creep.growth_bytes == pytest.approx(grown, rel=0.15), (creep.growth_bytes / MIB, grown / MIB)
    assert creep.first_bytes == pytest.approx(_at(steps, creep.start), rel=0.15)
    assert creep.seconds >= 0.5 * STEPS * STEP_SECONDS


def test_every_rank_reports_its_rss_as_the_job_reads_it(bridged: tuple[Run, Job]) -> None:
    run, job = bridged
    truth = run.truth()
    assert sorted(truth) == [0, 1]
    series = {s.rank: s for s in memory.memory_series(job)}
    assert sorted(series) == [0, 1], [s.label for s in series.values()]
    for rank, line in series.items():
        assert len(line.points) >= 15, (rank, len(line.points))  # a point every 200 ms
        assert all(p.unit == "By" and p.kind == "sum" for p in job.points if p.name == names.PROCESS_MEMORY_USAGE)
        readings = [(r["time_ns"], float(r["rss"])) for r in truth[rank]]
        compared = 0
        for time_ns, value in line.points:
            if readings[0][0] <= time_ns <= readings[-1][0]:
                expected = _at(readings, time_ns)
                assert value == pytest.approx(expected, rel=0.1), (rank, (time_ns - readings[0][0]) / S)
                compared += 1
        assert compared >= 10, (rank, compared)
    flat = [v for t, v in series[0].points if truth[0][1]["time_ns"] <= t <= truth[0][-1]["time_ns"]]
    assert max(flat) - min(flat) < 32 * MIB, (min(flat) / MIB, max(flat) / MIB)  # rank 0: no creep to see


def test_plain_torchrun_runs_the_same_job_to_the_same_end(tmp_path: Path) -> None:
    run = _launch(tmp_path, bridged=False)
    assert run.code == 0, run.output[-4000:]
    truth = run.truth()
    assert sorted(truth) == [0, 1] and all(rows[-1]["step"] == STEPS for rows in truth.values())
    assert not run.files.exists()


def test_report_json_gives_the_memory_creep_verdict(bridged: tuple[Run, Job]) -> None:
    run, _ = bridged
    done = subprocess.run([sys.executable, "-m", "torchelastic_otel.report", str(run.files), "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (report,) = json.loads(done.stdout)["runs"]
    assert report["verdict"]["verdict"] == "memory-creep", report["verdict"]
    assert report["verdict"]["reason"].startswith(f"rank {LEAK_RANK} grew "), report["verdict"]
