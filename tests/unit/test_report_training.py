"""The report's training part on files of known content: stragglers, stalls, missing ranks, ``--json``.

The files are written by the real exporter package (``tests/support/report_files.py``): a synthetic job of the bridge's
shape, plus what the training telemetry exports -- each rank's step-arrival and step-time histograms, stalled
records, a terminated and an exception record with the collectives' summary -- with chosen values, so the verdicts
are known exactly. Also bad input in those records (numbers that are not, odd group names, markup in stacks): it is
read, never an exception, and stays text in the HTML. The real jobs are ``tests/stack/test_straggler.py`` and
``tests/stack/test_stall_missing_rank.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.json.file")

from opentelemetry._logs import SeverityNumber

from tests.support.report_files import MS, Process, S, Shape, write_job
from torchelastic_otel.report import html, model, otlpjson, terminal, training

RUN = "training-run"
HOSTILE = '<script>alert("x")</script>'
ARRIVALS = {0: 0.20, 1: 0.21, 2: 0.36, 3: 0.19}  # rank 0's last export 1.5x: its mean 0.2333
MEDIAN = (0.21 + 0.7 / 3) / 2  # of the ranks' means: rank 2 is at 0.36 / MEDIAN = 1.62x
STEP = 0.40


def _worker(directory: Path, rank: int, host: str) -> Process:
    return Process(directory, f"rank{rank}-restart0", {
        "torchelastic.run_id": RUN, "torchelastic.process.kind": "worker", "torchelastic.rank": rank,
        "torchelastic.local_rank": rank % 2, "torchelastic.restart_count": 0, "host.name": host,
        "process.pid": 2000 + rank,
    })  # fmt: skip


def _summary(group: str, enqueued: Any, completed: Any, pending: str = "") -> dict[str, Any]:
    out = {f"torchelastic.collectives.{group}.last_enqueued": enqueued,
           f"torchelastic.collectives.{group}.last_completed": completed}  # fmt: skip
    if pending:
        out.update({f"torchelastic.collectives.{group}.pending": pending,
                    f"torchelastic.collectives.{group}.pending_seq": enqueued})  # fmt: skip
    return out


def _stalled(proc: Process, time: int, since: int, count: int, stack: str, code_line: int, **summary: Any) -> None:
    proc.record("torchelastic.worker.stalled", time, SeverityNumber.WARN, **{
        "torchelastic.state": "STALLED", "torchelastic.stalled.seconds": (time - since) / S,
        "torchelastic.stalled.since_unix_nano": str(since), "torchelastic.stalled.threshold_seconds": 3.0,
        "torchelastic.stalled.steps": "5", "torchelastic.stalled.count": str(count), "torchelastic.stack": stack,
        "code.file.path": "train.py", "code.line.number": code_line, "code.function.name": "main", **summary,
    })  # fmt: skip


def _stack(function: str) -> str:
    return (
        f'Thread 1 "MainThread" (most recent call last):\n  File "train.py", line 57, in main\n    x()\n'
        f'  File "torch/distributed/distributed_c10d.py", line 3252, in {function}\n    work.wait()\n'
        f'Thread 2 "loader" (most recent call last):\n  File "threading.py", line 331, in wait\n'
    )


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four ranks on two hosts; rank 2 arrives late (a straggler); then rank 1 stops coming: ranks 0, 2, 3 stall in
    collective #11 (their stalled records, twice), rank 1 stalls one collective behind; rank 1 raises, the others
    are stopped (terminated records with the summary)."""
    directory = tmp_path_factory.mktemp("training") / "files"
    facts = write_job(directory, Shape(ranks=0, attempts=1, run_id=RUN))
    t0 = facts.start + 500 * MS
    for rank, arrival in ARRIVALS.items():
        proc = _worker(directory, rank, "node-a" if rank < 2 else "node-b")
        arrivals = proc.meter.create_histogram("torchelastic.worker.step.arrival", unit="s")
        steps = proc.meter.create_histogram("torchelastic.worker.step.duration", unit="s")
        for export in range(3):
            for _ in range(10):
                arrivals.record(arrival * (1.5 if export == 2 and rank == 0 else 1.0))
                steps.record(STEP)
            proc.reader.collect()
        hang = t0 + 2 * S
        if rank == 1:
            _stalled(proc, hang + 3 * S, hang, 1, _stack("sleep"), 40, **_summary("default_pg", 10, 10))
            proc.record(
                "torchelastic.worker.exception",
                hang + 8 * S,
                SeverityNumber.ERROR,
                **{"exception.type": "RuntimeError", "exception.message": "gave up", **_summary("default_pg", 10, 10)},
            )
        else:
            for count, after in ((1, 3), (2, 6)):
                _stalled(proc, hang + after * S, hang, count, _stack("all_reduce"), 57,
                         **_summary("default_pg", 11, 10, "gloo:all_reduce"))  # fmt: skip
            proc.record(
                "torchelastic.worker.terminated",
                hang + 9 * S,
                SeverityNumber.WARN,
                **{"torchelastic.signal": "SIGTERM", **_summary("default_pg", 11, 10, "gloo:all_reduce")},
            )
        proc.close()
    return directory


@pytest.fixture(scope="module")
def job(files: Path) -> model.Job:
    (built,) = model.build(otlpjson.read([files]))
    return built


def test_the_straggler_is_the_rank_far_from_the_median(job: model.Job) -> None:
    found = training.analyze(job)
    assert [r.rank for r in found.stragglers] == [2]
    ratios = {r.rank: r.ratio for r in found.ranks}
    assert ratios[2] == pytest.approx(0.36 / MEDIAN)
    assert all(ratios[r] < 1.2 for r in (0, 1, 3))
    assert {r.rank: r.step for r in found.ranks} == {r: pytest.approx(STEP) for r in ARRIVALS}
    assert {r.rank: r.host for r in found.ranks} == {0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"}


def test_the_arrival_chart_is_per_export_not_cumulative(job: model.Job) -> None:
    series = {s.rank: [v for _, v in s.points] for s in training.analyze(job).arrival_series}
    assert series[0] == [pytest.approx(0.2), pytest.approx(0.2), pytest.approx(0.3)]  # the last export alone
    assert series[2] == [pytest.approx(0.36)] * 3


def test_the_stalls_one_per_rank_and_start(job: model.Job) -> None:
    stalls = {s.rank: s for s in training.analyze(job).stalls}
    assert sorted(stalls) == [0, 1, 2, 3]
    assert stalls[0].records == 2 and stalls[0].seconds == pytest.approx(6.0)
    assert stalls[0].stack_top == "torch/distributed/distributed_c10d.py:3252 in all_reduce"
    assert stalls[1].stack_top.endswith(" in sleep") and stalls[1].code == "train.py:40 in main"
    group = training.Group(last_enqueued=11, last_completed=10, pending="gloo:all_reduce", pending_seq=11)
    assert stalls[3].collectives == {"default_pg": group}
    assert group.text == "last enqueued #11, completed #10, pending #11 gloo:all_reduce"


def test_the_rank_missing_from_the_collective(job: model.Job) -> None:
    (missing,) = training.analyze(job).missing
    assert (missing.process_group, missing.seq, missing.collective, missing.ranks, missing.waiting) == (
        "default_pg", 11, "gloo:all_reduce", [1], [0, 2, 3])  # fmt: skip
    assert missing.sentence == "rank 1 is missing from collective #11, gloo:all_reduce, default_pg"


@pytest.mark.jobs
def test_report_json_on_the_command_line(files: Path, tmp_path: Path) -> None:
    """``--json``: the summary alone on stdout (parseable as a whole); no HTML file unless ``--html`` names one."""
    result = subprocess.run([sys.executable, "-m", "torchelastic_otel.report", str(files), "--json"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert not list(tmp_path.glob("*.html"))
    (run,) = summary["runs"]
    assert run["run_id"] == RUN and run["outcome"] == "FAILED" and run["attempts"] == 1
    assert [(s["rank"], s["ratio"]) for s in run["stragglers"]] == [(2, round(0.36 / MEDIAN, 3))]
    assert [(m["process_group"], m["seq"], m["collective"], m["ranks"]) for m in run["missing_ranks"]] == [
        ("default_pg", 11, "gloo:all_reduce", [1])]  # fmt: skip
    stalls = {s["rank"]: s for s in run["stalls"]}
    assert stalls[0]["since"].endswith("Z") and stalls[0]["stack_top"].endswith(" in all_reduce")
    assert summary["skipped"] == {}
    out = tmp_path / "r.html"
    result = subprocess.run([sys.executable, "-m", "torchelastic_otel.report", str(files), "--json", "--html",
                             str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert json.loads(result.stdout)["runs"][0]["run_id"] == RUN and out.exists()
    assert result.stderr.strip().endswith(f"report: {out}")


def test_report_json_of_a_job_without_training_telemetry(tmp_path: Path) -> None:
    write_job(tmp_path / "plain", Shape())
    (run,) = training.summary(model.build(otlpjson.read([tmp_path / "plain"])))["runs"]
    assert (run["stragglers"], run["stalls"], run["missing_ranks"], run["steps"]) == ([], [], [], [])
    assert run["root_cause"]["rank"] == 1 and run["root_cause"]["exception_type"] == "ValueError"
    assert [(r["restart"], r["reason"]) for r in run["restarts"]] == [(1, "failure")]
    text = terminal.render(otlpjson.read([tmp_path / "plain"]), model.build(otlpjson.read([tmp_path / "plain"])))
    assert "STRAGGLERS" not in text and "STALLS" not in text and "MISSING FROM" not in text


def test_bad_values_in_the_records_are_read_never_raised(tmp_path: Path) -> None:
    directory = tmp_path / "bad"
    write_job(directory, Shape(ranks=0, attempts=1, run_id=RUN))
    for rank, enqueued in ((0, "eleven"), (1, None), (2, 11)):
        proc = _worker(directory, rank, "h")
        summary = _summary("a.b/c d", enqueued, "?") if enqueued is not None else {}
        proc.record("torchelastic.worker.stalled", 10 * S, SeverityNumber.WARN, **{
            "torchelastic.stalled.seconds": "long", "torchelastic.stalled.since_unix_nano": "yesterday",
            "torchelastic.stack": HOSTILE, "code.file.path": HOSTILE, **summary})  # fmt: skip
        arrivals = proc.meter.create_histogram("torchelastic.worker.step.arrival", unit="s")
        arrivals.record(0.0)  # a median of 0: no ratio
        proc.reader.collect()
        proc.close()
    tel = otlpjson.read([directory])
    (job,) = model.build(tel)
    found = training.analyze(job)
    assert len(found.stalls) == 3 and all(s.seconds == 0.0 for s in found.stalls)
    assert found.missing == [] and found.stragglers == [] and all(r.ratio is None for r in found.ranks)
    page = html.render(tel, [job])
    assert HOSTILE not in page and html.e(HOSTILE) in page
    assert json.dumps(training.summary([job]))
    assert "STALLS" in terminal.render(tel, [job])
