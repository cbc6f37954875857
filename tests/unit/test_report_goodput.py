"""The report's goodput, step anatomy and verdict (``report.goodput``) on jobs built from synthetic records.

The records are built directly (``records.Span`` / ``LogRecord`` / ``Point``) with chosen times and counter values,
so every figure of the partition is known by hand: the expected seconds below are worked out in the comments, not
by the code under test. One histogram goes through the OTLP JSON reader, to check that its buckets are kept.
"""

from __future__ import annotations

import dataclasses
import json
import re
from types import SimpleNamespace
from typing import Any

import pytest

from torchelastic_otel import _names as names
from torchelastic_otel.report import goodput, html, model, otlpjson, terminal, training
from torchelastic_otel.report.records import STATUS_ERROR, LogRecord, Point, Proc, Span, Telemetry

S = 1_000_000_000
T0 = 1_700_000_000 * S
RUN = "goodput-run"
HOST = "node"
AGENT = Proc("agent", HOST, 10, RUN, None, None, None, "torchelastic")


def _t(seconds: float) -> int:
    return T0 + int(round(seconds * S))


def _worker(rank: int, restart: int) -> Proc:
    return Proc("worker", HOST, 100 + 10 * restart + rank, RUN, rank, rank, restart, "torchelastic")


class Builder:
    """The records of one run: an agent with attempts (and their rendezvous), workers, counters, phases."""

    def __init__(self) -> None:
        self.tel = Telemetry()
        self._ids = 0

    def _id(self) -> str:
        self._ids += 1
        return f"{self._ids:016x}"

    def span(self, name: str, start: float, end: float, proc: Proc, parent: str = "", failed: bool = False,
             attrs: dict[str, Any] | None = None) -> str:  # fmt: skip
        span_id = self._id()
        self.tel.spans.append(Span("ab" * 16, span_id, parent, name, _t(start), _t(end), attrs or {},
                                   STATUS_ERROR if failed else 0, "", [], proc))  # fmt: skip
        return span_id

    def run(self, start: float, end: float, state: str = "SUCCEEDED") -> str:
        return self.span(names.RUN, start, end, AGENT, attrs={names.RUN_STATE: state})

    def attempt(self, restart: int, start: float, end: float, rendezvous: tuple[float, float] | None,
                failed: bool = False) -> str:  # fmt: skip
        span_id = self.span(names.ATTEMPT, start, end, AGENT, failed=failed, attrs={names.RESTART_COUNT: restart})
        if rendezvous is not None:
            self.span(names.RENDEZVOUS, *rendezvous, AGENT, parent=span_id)
        return span_id

    def worker(self, rank: int, restart: int, start: float, attempt: str) -> None:
        self.span(names.WORKER_START, start, start, _worker(rank, restart), parent=attempt)

    def failure(self, rank: int, restart: int, time: float, signal: str = "") -> None:
        attrs: dict[str, Any] = {names.GLOBAL_RANK: rank, names.RESTART_COUNT: restart,
                                 names.EXIT_CODE: -15 if signal else 1}  # fmt: skip
        if signal:
            attrs[names.SIGNAL] = signal
        self.log(names.WORKER_FAILURE, time, AGENT, attrs)

    def log(self, name: str, time: float, proc: Proc, attrs: dict[str, Any]) -> None:
        self.tel.logs.append(LogRecord(_t(time), 9, "INFO", name, name, attrs, "", "", proc))

    def stall(self, rank: int, restart: int, since: float, seen: float) -> None:
        self.log(names.WORKER_STALLED, seen, _worker(rank, restart), {
            names.STALLED_SINCE_UNIX_NANO: str(_t(since)), names.STALLED_SECONDS: seen - since})  # fmt: skip

    def counters(self, rank: int, restart: int, time: float, **by_cause: float) -> None:
        for cause, value in by_cause.items():
            self.tel.points.append(Point(names.GOODPUT_TIME, "sum", "s", _t(time), value, {names.CAUSE: cause},
                                         _worker(rank, restart), monotonic=True))  # fmt: skip

    def at_risk(self, rank: int, restart: int, time: float, **by_cause: float) -> None:
        for cause, value in by_cause.items():
            self.tel.points.append(Point(names.WORKER_PROGRESS_AT_RISK, "gauge", "s", _t(time), value,
                                         {names.CAUSE: cause}, _worker(rank, restart)))  # fmt: skip

    def phases(self, rank: int, restart: int, time: float, steps: int = 20, clock: str | None = None,
               **medians: float) -> None:  # fmt: skip
        """One cumulative histogram point per phase, ``steps`` steps all in the bucket [0.5 m, 1.5 m] of median m
        (in the bucket up to 0 when m is 0): its interpolated median is m. ``clock``: the attribute, if any."""
        attrs = {} if clock is None else {names.CLOCK: clock}
        for phase, median in medians.items():
            bounds = (0.5 * median, 1.5 * median) if median > 0 else (0.0, 1.0)  # zeros: in (-inf, 0]
            buckets = (0, steps, 0) if median > 0 else (steps, 0, 0)
            self.tel.points.append(Point(names.WORKER_STEP_PHASE_DURATION, "histogram", "s", _t(time), median,
                                         {names.PHASE: phase, **attrs}, _worker(rank, restart), count=steps,
                                         total=median * steps, bounds=bounds, buckets=buckets))  # fmt: skip

    def gpu_idle(self, rank: int, restart: int, time: float, steps: int, total: float) -> None:
        self.tel.points.append(Point(names.WORKER_STEP_GPU_IDLE, "histogram", "s", _t(time), total / steps, {},
                                     _worker(rank, restart), count=steps, total=total))  # fmt: skip

    def job(self) -> model.Job:
        (job,) = model.build(self.tel)
        return job


# ---- a run with a failed attempt ------------------------------------------------------------------------------


def _failed_then_succeeded() -> Builder:
    """Two ranks, two attempts. Attempt 0 (0-50 s, rendezvous 0-2 s) fails: rank 0 raises at 50 s, rank 1 (a silent
    process: no goodput point; stalled since 45 s) is stopped by the agent. Attempt 1 (55-100 s, rendezvous 55-57
    s) succeeds; the run's last record is at 101 s."""
    b = Builder()
    b.run(0, 101)
    first = b.attempt(0, 0, 50, (0, 2), failed=True)
    second = b.attempt(1, 55, 100, (55, 57))
    for rank in (0, 1):
        b.worker(rank, 0, 3, first)
        b.worker(rank, 1, 58, second)
    b.failure(0, 0, 50)
    b.failure(1, 0, 50, signal="SIGTERM")
    # rank 0, attempt 0: an earlier export, then the latest: 40 s accounted (L = 43 s), tail 7 s
    b.counters(0, 0, 20, startup=2, productive=10)
    b.counters(0, 0, 42, startup=2, productive=30, input_wait=5, checkpoint_save=3)
    b.at_risk(0, 0, 42, productive=10, input_wait=2)
    b.stall(1, 0, 45, 49)
    # attempt 1: 40 s accounted of 42 (L = 98 s), tail 2 s of shut-down
    for rank in (0, 1):
        b.counters(rank, 1, 97, startup=1.5, checkpoint_load=0.5, productive=38)
        b.at_risk(rank, 1, 97, productive=20)  # not lost: the attempt succeeded
    b.tel.points.append(Point(names.GOODPUT_TIME, "sum", "s", _t(57), 2.0, {names.CAUSE: "rendezvous"}, AGENT,
                              monotonic=True))  # the agent's own counter: not part of the partition  # fmt: skip
    return b


RANK0 = {  # worked out by hand
    "rendezvous": 2 + 2,  # the rendezvous 0-2 s of the 3 s before the first process; 55-57 s of the gap 50-58 s
    "restart": 6,  # the rest of the gap
    "startup": 1 + 2 + 1.5 + 2 + 1,  # 2-3 s (starting the workers), counters, attempt 1's tail, 100-101 s at the end
    "productive": 20 + 38,  # 30 - 10 at risk, + 38
    "input_wait": 3,  # 5 - 2 at risk
    "checkpoint_save": 3,
    "checkpoint_load": 0.5,
    "lost_progress": 7 + 10 + 2,  # the tail 43-50 s and what was at risk
    "stalled": 0,
}
RANK1 = {
    "rendezvous": 4, "restart": 6, "startup": 1 + 1.5 + 2 + 1, "productive": 38, "input_wait": 0, "checkpoint_save": 0,
    "checkpoint_load": 0.5,
    "lost_progress": 42,  # a silent process that did not end well: 3-45 s lost ...
    "stalled": 5,  # ... and 45-50 s stalled (its stall record)
}  # fmt: skip


def test_a_failed_attempt_loses_its_risk_and_tail() -> None:
    found = goodput.goodput(_failed_then_succeeded().job())
    assert found.wall == pytest.approx(101)
    assert found.ranks[0] == pytest.approx(RANK0)
    assert found.ranks[1] == pytest.approx(RANK1)
    assert found.seconds == pytest.approx({c: (RANK0[c] + RANK1[c]) / 2 for c in goodput.CAUSES})
    assert found.ratio == round(48 / 101, 3)
    assert found.measured
    # per attempt: attempt 0 holds 0-50 s of each rank; attempt 1 the gap, its process and the end
    assert found.attempts[0] == pytest.approx({**dict.fromkeys(goodput.CAUSES, 0.0), "rendezvous": 2, "startup": 2,
                                               "productive": 10, "input_wait": 1.5, "checkpoint_save": 1.5,
                                               "lost_progress": 30.5, "stalled": 2.5})  # fmt: skip
    assert found.attempt_wall(0) == pytest.approx(50) and found.attempt_wall(1) == pytest.approx(51)
    for seconds in found.attempts.values():
        assert seconds["lost_progress"] == 0 or seconds is found.attempts[0]


def test_the_seconds_sum_to_the_wall_time_on_every_rank() -> None:
    found = goodput.goodput(_failed_then_succeeded().job())
    for seconds in [found.seconds, *found.ranks.values()]:
        assert sum(seconds.values()) == pytest.approx(found.wall, abs=1e-6)
    assert sum(found.attempt_wall(r) for r in found.attempts) == pytest.approx(found.wall, abs=1e-6)
    assert all(v >= 0 for s in [found.seconds, *found.ranks.values()] for v in s.values())


def test_a_successful_run() -> None:
    """One attempt (0-60 s, rendezvous 0-1 s), two ranks from 2 s to 60 s; the last record at 60.5 s. Before the
    workers: the rendezvous, then 1 s of start-up (the agent starting them)."""
    b = Builder()
    b.run(0, 60.5)
    attempt = b.attempt(0, 0, 60, (0, 1))
    for rank in (0, 1):
        b.worker(rank, 0, 2, attempt)
        b.counters(rank, 0, 58, startup=3, productive=50, checkpoint_save=2)  # L = 57 s, tail 3 s
        b.at_risk(rank, 0, 58, productive=30)  # ended well: nothing lost
    found = goodput.goodput(b.job())
    expected = {**dict.fromkeys(goodput.CAUSES, 0.0), "rendezvous": 1, "startup": 1 + 3 + 3 + 0.5, "productive": 50,
                "checkpoint_save": 2}  # fmt: skip
    assert found.seconds == pytest.approx(expected)
    assert list(found.attempts) == [0] and found.attempts[0] == pytest.approx(expected)
    assert found.ratio == round(50 / 60.5, 3)


def test_gaps_without_a_rendezvous_span_are_restart() -> None:
    """A gap between two processes of a rank the agent's rendezvous spans do not cover is all restart (before the
    first, start-up); counters larger than the process's duration are scaled down to fit, negatives are none, at risk
    is at most what was there."""
    b = Builder()
    b.run(0, 30)
    first = b.attempt(0, 0, 10, None, failed=True)
    second = b.attempt(1, 14, 30, None)
    b.worker(0, 0, 1, first)
    b.worker(0, 1, 15, second)
    b.failure(0, 0, 10)
    b.counters(0, 0, 9, startup=-4, productive=18)  # 18 s in a process of 9 s: scaled to 9
    b.at_risk(0, 0, 9, productive=100)  # all of it lost, never more than there was
    b.counters(0, 1, 29, productive=15)
    found = goodput.goodput(b.job())
    assert found.seconds == pytest.approx({**dict.fromkeys(goodput.CAUSES, 0.0), "startup": 1, "restart": 5,
                                           "lost_progress": 9, "productive": 15})  # fmt: skip
    assert sum(found.seconds.values()) == pytest.approx(30, abs=1e-6)


def test_no_worker_no_figures() -> None:
    b = Builder()
    b.run(0, 5)
    found = goodput.goodput(b.job())
    assert found.ratio is None and set(found.seconds) == set(goodput.CAUSES) and not any(found.seconds.values())


# ---- phases ----------------------------------------------------------------------------------------------------


def test_the_median_is_interpolated_in_the_buckets() -> None:
    proc = _worker(0, 0)
    point = Point("p", "histogram", "s", 0, 0.2, {}, proc, count=10, total=2.0, bounds=(0.01, 0.1, 1.0),
                  buckets=(0, 8, 2, 0))  # fmt: skip
    assert point.quantile(0.5) == pytest.approx(0.01 + 0.09 * 5 / 8)
    point.low, point.high = 0.02, 0.5
    assert point.quantile(0.5) == pytest.approx(0.02 + 0.08 * 5 / 8)
    assert point.quantile(0.9) == pytest.approx(0.1 + 0.4 * 0.5)  # in (0.1, 1.0], capped at the max 0.5
    assert Point("p", "histogram", "s", 0, 0.3, {}, proc, count=3).quantile(0.5) == 0.3  # no buckets: the mean
    overflow = Point("p", "histogram", "s", 0, 7.0, {}, proc, count=2, bounds=(1.0,), buckets=(0, 2))
    assert overflow.quantile(0.5) == 7.0  # above the last bound, no max: the mean


def test_the_reader_keeps_a_histograms_buckets() -> None:
    attrs = [{"key": names.RANK, "value": {"intValue": "0"}}, {"key": names.RESTART_COUNT, "value": {"intValue": "1"}},
             {"key": names.RUN_ID, "value": {"stringValue": RUN}}]  # fmt: skip
    point = {"attributes": [{"key": names.PHASE, "value": {"stringValue": "input"}}], "timeUnixNano": str(T0),
             "count": "10", "sum": 0.5, "bucketCounts": ["0", "10", "0"], "explicitBounds": [0.02, 0.08],
             "min": 0.03, "max": 0.07}  # fmt: skip
    line = {"resourceMetrics": [{"resource": {"attributes": attrs}, "scopeMetrics": [{"metrics": [{
        "name": names.WORKER_STEP_PHASE_DURATION, "unit": "s",
        "histogram": {"dataPoints": [point], "aggregationTemporality": 2}}]}]}]}  # fmt: skip
    reader = otlpjson.Reader()
    reader.read_line(json.dumps(line), "x:1")
    (read,) = reader.telemetry.points
    assert (read.count, read.value, read.total, read.bounds, read.buckets, read.low, read.high) == (
        10, pytest.approx(0.05), 0.5, (0.02, 0.08), (0, 10, 0), 0.03, 0.07)  # fmt: skip
    (job,) = model.build(reader.telemetry)
    assert goodput.phases(job)[(1, 0)]["input"] == pytest.approx(0.05)


def test_phases_per_rank_from_the_latest_point() -> None:
    b = _failed_then_succeeded()
    b.phases(0, 1, 60, steps=5, input=0.9, forward=0.1)
    b.phases(0, 1, 90, steps=50, input=0.04, forward=0.1, backward=0.2, optimizer=0.05, collective_wait=0.01,
             other=0.0)  # fmt: skip
    found = goodput.phases(b.job())
    assert found[(1, 0)] == pytest.approx({"input": 0.04, "forward": 0.1, "backward": 0.2, "optimizer": 0.05,
                                           "collective_wait": 0.01, "other": 0.0})  # fmt: skip


# ---- verdicts ----------------------------------------------------------------------------------------------------


def _training(straggler: bool = False) -> training.Training:
    """Two ranks of 10 steps; rank 1 a straggler (as ``training``'s rule found it: 30 % of a 0.2 s step late in 9
    of its 10 steps) or not."""
    ranks = [training.RankSteps(0, 0, HOST, 0.1, 10, 0.2, 10, 1.0), training.RankSteps(1, 0, HOST, 0.1, 10, 0.2, 10,
                                                                                        1.0)]  # fmt: skip
    if straggler:
        ranks[1] = dataclasses.replace(ranks[1], arrival=0.16, ratio=1.23, arrival_median=0.16, step_median=0.2,
                                       median_ratio=1.6, delay_share=0.3, late_steps=9.4, straggler=True)  # fmt: skip
    return training.Training(ranks, [], [], [])


def _phases(**shares: float) -> dict[tuple[int, int], dict[str, float | None]]:
    values: dict[str, float | None] = {p: shares.get(p, 0.0) for p in goodput.PHASES}
    return {(0, 0): dict(values), (0, 1): dict(values)}


STRAGGLER = (
    "rank 1 arrives at its steps' last collective 60.0 ms (30 % of the step) later than the median rank in 9 "
    "of 10 steps (its median 1.60x the median rank's; attempt 0)"
)


@pytest.mark.parametrize(
    ("shares", "straggler", "creep", "expected", "reason", "steps"),
    [
        ({"input": 0.64, "forward": 0.36}, False, [], "input-bound", "input wait is 64 % of the step over 10 steps",
         10),
        ({"collective_wait": 0.4, "backward": 0.6}, False, [], "communication-bound",
         "collective wait is 40 % of the step over 10 steps", 10),
        ({"forward": 0.3, "backward": 0.3, "optimizer": 0.25, "other": 0.15}, False, [], "compute-bound",
         "optimizer and other host work are 40 % of the step over 10 steps", 10),
        # a step that is the model's own forward and backward is what training should be
        ({"forward": 0.45, "backward": 0.45, "optimizer": 0.05, "other": 0.05}, False, [], "healthy",
         "no phase dominates the step over 10 steps: input 0 %, collective wait 0 %, compute 95 %", 10),
        ({"forward": 0.3, "backward": 0.4, "input": 0.1, "collective_wait": 0.1, "other": 0.1}, False, [], "healthy",
         "no phase dominates the step over 10 steps: input 10 %, collective wait 10 %, compute 70 %", 10),
        ({"input": 0.64, "forward": 0.36}, True, [], "straggler", STRAGGLER, 10),
        ({"input": 0.64, "forward": 0.36}, True, [SimpleNamespace(rank=1, text="rank 1 grows by 5.0 MiB/s")],
         "memory-creep", "rank 1 grows by 5.0 MiB/s", 10),
        # input before collective wait (the others' collective wait is the slow input's symptom)
        ({"input": 0.35, "collective_wait": 0.35, "forward": 0.3}, False, [], "input-bound",
         "input wait is 35 % of the step over 10 steps", 10),
    ],
)  # fmt: skip
def test_verdicts(shares: dict[str, float], straggler: bool, creep: list[Any], expected: str, reason: str,
                  steps: int) -> None:  # fmt: skip
    job = _failed_then_succeeded().job()
    found = goodput.verdict(job, _training(straggler), goodput.goodput(job), _phases(**shares), creep)
    assert (found.verdict, found.reason, found.steps) == (expected, reason, steps)


def test_the_verdict_without_phases() -> None:
    b = Builder()
    b.run(0, 10)
    attempt = b.attempt(0, 0, 10, None)
    b.worker(0, 0, 0, attempt)
    b.counters(0, 0, 9, productive=5, input_wait=5)
    job = b.job()
    found = goodput.verdict(job, _training(), goodput.goodput(job), {}, [])
    assert (found.verdict, found.reason) == ("input-bound", "input wait is 50 % of the step time over 10 steps")
    job = _failed_then_succeeded().job()
    found = goodput.verdict(job, _training(), goodput.goodput(job), {}, [])
    assert found.verdict == "healthy" and found.reason.endswith("no step phases in these files")


def test_memory_creep_is_none_until_its_module_says() -> None:
    assert isinstance(goodput.memory_creep(_failed_then_succeeded().job()), list)
    assert set(goodput.VERDICTS) == {"input-bound", "compute-bound", "communication-bound", "straggler",
                                     "memory-creep", "healthy"}  # fmt: skip


# ---- JSON, terminal, HTML agree ---------------------------------------------------------------------------------


def _rendered() -> tuple[dict[str, Any], str, str]:
    b = _failed_then_succeeded()
    for rank in (0, 1):
        b.phases(rank, 1, 90, input=0.064, forward=0.012, backward=0.016, optimizer=0.004, collective_wait=0.002,
                 other=0.002)  # fmt: skip
    jobs = [b.job()]
    return training.summary(jobs)["runs"][0], terminal.render(b.tel, jobs, width=100), html.render(b.tel, jobs)


def test_report_json_keys_are_as_fixed() -> None:
    run, _, _ = _rendered()
    assert set(run["goodput"]) == {"ratio", "seconds"}
    assert list(run["goodput"]["seconds"]) == ["productive", "startup", "rendezvous", "restart", "checkpoint_save",
                                               "checkpoint_load", "lost_progress", "input_wait", "stalled"]  # fmt: skip
    assert run["goodput"]["seconds"] == {c: round((RANK0[c] + RANK1[c]) / 2, 3) for c in goodput.CAUSES}
    assert run["goodput"]["ratio"] == round(48 / 101, 3)
    assert run["verdict"] == {"verdict": "input-bound", "reason": "input wait is 64 % of the step over 20 steps",
                              "steps": 20}  # fmt: skip
    steps = {(s["restart"], s["rank"]): s for s in run["steps"]}
    assert set(steps) == {(1, 0), (1, 1)}
    assert all(list(s["phases"]) == list(goodput.PHASES) for s in run["steps"])
    assert steps[(1, 0)]["phases"]["input"] == pytest.approx(0.064)
    assert [a["attempt"] for a in run["goodput_attempts"]] == [0, 1]
    assert json.loads(json.dumps(run)) == run


def test_a_run_without_workers_has_every_key() -> None:
    b = Builder()
    b.run(0, 5)
    (run,) = training.summary([b.job()])["runs"]
    assert run["goodput"] == {"ratio": None, "seconds": dict.fromkeys(goodput.CAUSES, 0.0)}
    assert run["verdict"]["verdict"] == "healthy"


def _percents(run: dict[str, Any]) -> dict[str, str]:
    seconds, wall = run["goodput"]["seconds"], run["seconds"]
    return {c: f"{round(seconds[c] / wall, 3) * 100:.1f}" for c in goodput.CAUSES if seconds[c] > 0}


def test_terminal_shows_the_bar_verdict_and_the_same_percentages() -> None:
    run, text, _ = _rendered()
    assert "verdict: INPUT-BOUND: input wait is 64 % of the step" in text
    assert text.index("verdict:") < text.index("TIMELINE") < text.index("WHERE THE TIME WENT")
    lines = text.splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.startswith("run ") and "|" in line]
    assert len(lines[at]) == 100 and lines[at].count("x") > 0 and "█" in lines[at]
    legend = "\n".join(lines[at + 1 : next(i for i in range(at + 1, len(lines)) if lines[i].startswith("attempt 0"))])
    assert all(len(line) <= 100 for line in legend.splitlines()) and len(legend.splitlines()) > 1  # wrapped
    assert f"goodput {run['goodput']['ratio'] * 100:.1f} % of 101.0 s:" in legend
    shown = dict(re.findall(r"\S ([a-z ]+?) (\d+\.\d) %", legend.split(":", 1)[1]))
    assert {c.replace(" ", "_"): p for c, p in shown.items()} == _percents(run)
    assert sum(1 for line in lines if line.startswith("attempt ") and "|" in line) == 2
    assert "STEP PHASES" in text and "64.0 ms" in text


def test_html_shows_the_bar_verdict_and_the_same_percentages() -> None:
    run, _, page = _rendered()
    assert 'data-verdict="input-bound"' in page and "input wait is 64 % of the step" in page
    assert page.index('data-verdict="input-bound"') < page.index("<h3>Timeline</h3>")
    run_bar = page.split('data-scope="run"')[1].split('data-scope="attempt 0"')[0]
    found = dict(re.findall(r'<rect class="gp \w+"[^>]*data-cause="(\w+)" data-seconds="[\d.]+" '
                            r'data-percent="([\d.]+)"', run_bar))  # fmt: skip
    assert found == _percents(run)
    assert f"goodput {run['goodput']['ratio'] * 100:.1f} %" in run_bar
    assert page.count('class="goodput"') == 3  # the run and its two attempts
    assert 'data-phase="input">64.0 ms</td>' in page


# ---- the GPU's clock ----------------------------------------------------------------------------------------------


def _gpu_job(ranks: tuple[int, ...] = (0, 1), host_ranks: tuple[int, ...] = ()) -> Builder:
    """One attempt of 60 s. Each rank of ``ranks`` timed 3 steps on the host before CUDA was initialised (all
    input: they would make the job input-bound), then 40 on the GPU's clock: 50 ms a step, of which optimizer
    4 ms and other (the GPU's time outside the model's phases) 12 ms; the GPU waited 10 ms a step for the host.
    The ranks of ``host_ranks`` only ever timed theirs on the host (no CUDA), with the same phases."""
    b = Builder()
    b.run(0, 60)
    attempt = b.attempt(0, 0, 60, (0, 1))
    device = {"input": 0.002, "forward": 0.010, "backward": 0.020, "optimizer": 0.004, "collective_wait": 0.002,
              "other": 0.012}  # fmt: skip
    for rank in ranks + host_ranks:
        b.worker(rank, 0, 2, attempt)
        b.phases(rank, 0, 10, steps=3, input=0.5, forward=0.01)  # the host's, without the attribute (older files)
        if rank in ranks:
            b.phases(rank, 0, 50, steps=40, clock="device", **device)
            b.gpu_idle(rank, 0, 50, steps=40, total=40 * 0.010)
        else:
            b.phases(rank, 0, 50, steps=43, clock="host", **device)
    return b


def test_the_gpu_clock_decides_where_a_rank_has_it() -> None:
    job = _gpu_job().job()
    found = goodput.anatomies(job)
    assert {key: (a.clock, a.steps, a.gpu_idle) for key, a in found.items()} == {
        (0, 0): ("device", 40, 0.2), (0, 1): ("device", 40, 0.2)}  # 10 ms idle of a 50 ms step  # fmt: skip
    assert found[(0, 0)].medians == pytest.approx({
        "input": 0.002, "forward": 0.010, "backward": 0.020, "optimizer": 0.004, "collective_wait": 0.002,
        "other": 0.012})  # the device's, not the host's first 3 steps  # fmt: skip
    verdict = goodput.assess(job, training.analyze(job)).verdict
    assert (verdict.verdict, verdict.steps) == ("compute-bound", 40)
    assert verdict.reason == ("the optimizer and the GPU's time outside the model's phases (waiting for the host: "
                              "logging, syncs, Python) are 32 % of the GPU's step over 40 steps")  # fmt: skip


def test_a_rank_without_cuda_keeps_the_host_clock() -> None:
    """Rank 1 never timed on the GPU: its phases are the host's, its idle share none; the job's step is not all the
    GPU's, so the reason says "the step"."""
    job = _gpu_job(ranks=(0,), host_ranks=(1,)).job()
    (run,) = training.summary([job])["runs"]
    steps = {s["rank"]: s for s in run["steps"]}
    assert (steps[0]["clock"], steps[0]["gpu_idle"]) == ("device", 0.2)
    assert (steps[1]["clock"], steps[1]["gpu_idle"]) == ("host", None)
    assert steps[1]["phases"]["other"] == pytest.approx(0.012)  # the later host point (43 steps), not the first 3
    assert run["verdict"]["reason"].endswith("of the step over 43 steps") and "GPU" not in run["verdict"]["reason"]


def test_the_gpu_clock_in_the_json_terminal_and_html() -> None:
    b = _gpu_job()
    jobs = [b.job()]
    (run,) = training.summary(jobs)["runs"]
    assert [(s["rank"], s["clock"], s["gpu_idle"]) for s in run["steps"]] == [(0, "device", 0.2), (1, "device", 0.2)]
    assert run["verdict"]["steps"] == 40 and "of the GPU's step" in run["verdict"]["reason"]
    text = terminal.render(b.tel, jobs, width=120)
    phases = text[text.index("STEP PHASES") :].splitlines()
    assert "GPU idle" in phases[1] and all(line.rstrip().endswith("GPU    20.0 %") for line in phases[2:4]), phases
    page = html.render(b.tel, jobs)
    assert page.count('data-clock="device">GPU</td>') == 2 and page.count('data-gpu-idle="0.2">20.0 %</td>') == 2


def test_a_host_job_shows_no_clock() -> None:
    """Without a device-clock point (every CPU job, every older file) the steps say ``host``, with no idle share, and
    the terminal and HTML tables have no clock columns."""
    b = _failed_then_succeeded()
    for rank in (0, 1):
        b.phases(rank, 1, 90, input=0.064, forward=0.012, backward=0.016, optimizer=0.004, collective_wait=0.002,
                 other=0.002)  # fmt: skip
    jobs = [b.job()]
    (run,) = training.summary(jobs)["runs"]
    assert {(s["clock"], s["gpu_idle"]) for s in run["steps"]} == {("host", None)}
    assert "GPU" not in terminal.render(b.tel, jobs, width=120) and "GPU idle" not in html.render(b.tel, jobs)


# ---- collective wait not measured --------------------------------------------------------------------------------


def _arrival(b: Builder, rank: int, restart: int, time: float, steps: int, seconds: float) -> None:
    b.tel.points.append(Point(names.WORKER_STEP_ARRIVAL, "histogram", "s", _t(time), seconds, {},
                              _worker(rank, restart), count=steps, total=seconds * steps, bounds=(0.5 * seconds,
                              1.5 * seconds), buckets=(0, steps, 0)))  # fmt: skip


def test_a_rank_whose_collective_wait_was_not_measured_is_left_out_of_the_step() -> None:
    """Without the Flight Recorder's entries a rank's wait in the collective stays in its backward (a short job's
    read raced its end): rank 1's backward is 8 ms where rank 0 waited 7 ms of it in the collective. The step's
    shares are rank 0's: communication-bound, as it is. With no rank measured, the reason says so."""

    def two_ranks(measured: bool) -> model.Job:
        b = Builder()
        b.run(0, 30)
        attempt = b.attempt(0, 0, 30, (0, 1))
        for rank in (0, 1):
            b.worker(rank, 0, 2, attempt)
            if rank == 1 or not measured:  # its wait in its backward
                b.phases(rank, 0, 20, forward=0.001, backward=0.008, collective_wait=0.0, optimizer=0.001, input=0.0,
                         other=0.0)  # fmt: skip
            else:
                b.phases(rank, 0, 20, forward=0.001, backward=0.001, collective_wait=0.007, optimizer=0.001,
                         input=0.0, other=0.0)  # fmt: skip
                _arrival(b, rank, 0, 20, 19, 0.002)
        return b.job()

    job = two_ranks(measured=True)
    found = goodput.assess(job, training.analyze(job)).verdict
    assert (found.verdict, found.reason) == ("communication-bound", "collective wait is 70 % of the step over 20 steps")
    unmeasured = two_ranks(measured=False)
    found = goodput.assess(unmeasured, training.analyze(unmeasured)).verdict
    assert found.verdict == "healthy" and found.reason.endswith("; collective wait not measured (no Flight Recorder "
                                                                "entries)")  # fmt: skip


def test_the_launchers_start_up_before_the_rendezvous_is_startup() -> None:
    """The launcher starts at 0 s; its agent's rendezvous runs 1.5-2 s; the workers start at 2.5 s: 0-1.5 s and
    2-2.5 s are start-up, 0.5 s rendezvous."""
    b = Builder()
    b.run(0, 10)
    attempt = b.attempt(0, 0, 10, (1.5, 2))
    b.worker(0, 0, 2.5, attempt)
    b.counters(0, 0, 9.5, productive=7)
    found = goodput.goodput(b.job())
    assert found.seconds == pytest.approx({**dict.fromkeys(goodput.CAUSES, 0.0), "startup": 1.5 + 0.5 + 0.5,
                                           "rendezvous": 0.5, "productive": 7})  # fmt: skip
