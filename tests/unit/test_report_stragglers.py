"""The report's straggler rule (``report.training``) on constructed points: a delay that matters, in most steps.

Each rank's arrivals are a list of seconds, one a step, turned into the cumulative histogram point the bridge
exports (its buckets, the SDK's bounds, count, sum, min and max), beside its step durations; so what the rule sees
is what a real job's files hold, and the verdict's figures can be worked out by hand. The real jobs are
``tests/jobs/test_short_job.py`` and ``tests/stack/test_straggler.py`` (named), and
``tests/jobs/test_quickstart_verdict.py`` (not named, run after run).
"""

from __future__ import annotations

import bisect

import pytest

from torchelastic_otel import _names as names
from torchelastic_otel.report import goodput, model, training
from torchelastic_otel.report.records import Point, Proc, Telemetry

S = 1_000_000_000
T0 = 1_700_000_000 * S
RUN = "straggler-run"
#: the bridge's duration buckets (``metrics.rules.DURATION_BUCKETS_S``)
BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0, 300.0,
          600.0, 1800.0, 3600.0)  # fmt: skip


def _histogram(name: str, rank: int, seconds: list[float]) -> Point:
    """The cumulative point of ``seconds`` (one observation a step), as the SDK exports it."""
    buckets = [0] * (len(BOUNDS) + 1)
    for value in seconds:
        buckets[bisect.bisect_left(BOUNDS, value)] += 1  # (lower, upper]: a value on a bound is in its bucket
    proc = Proc("worker", "node", 100 + rank, RUN, rank, rank, 0, "torchelastic")
    return Point(name, "histogram", "s", T0 + 60 * S, sum(seconds) / len(seconds), {}, proc, count=len(seconds),
                 total=sum(seconds), bounds=BOUNDS, buckets=tuple(buckets), low=min(seconds),
                 high=max(seconds))  # fmt: skip


def _job(arrivals: dict[int, list[float]], step: float, medians: dict[int, float] | None = None) -> model.Job:
    tel = Telemetry()
    for rank, seconds in arrivals.items():
        tel.points.append(_histogram(names.WORKER_STEP_ARRIVAL, rank, seconds))
        tel.points.append(_histogram(names.WORKER_STEP_DURATION, rank, [step] * (len(seconds))))
        if medians and rank in medians:
            proc = tel.points[-1].proc
            tel.points.append(Point(names.WORKER_STEP_ARRIVAL_MEDIAN, "gauge", "s", T0 + 60 * S, medians[rank], {},
                                    proc))  # fmt: skip
    (job,) = model.build(tel)
    return job


def _verdict(job: model.Job) -> goodput.Verdict:
    return goodput.assess(job, training.analyze(job)).verdict


def test_a_rank_late_by_30_percent_of_the_step_in_most_steps_is_named() -> None:
    """4 ranks, a 100 ms step: ranks arrive at 20-22 ms, rank 2 at 50-52 ms (30 ms later: 30 % of the step) in 18
    of its 20 steps, like the others in 2."""
    healthy = [0.020 + 0.0001 * i for i in range(20)]
    late = [0.050 + 0.0001 * i for i in range(18)] + [0.021, 0.0205]
    job = _job({0: healthy, 1: healthy, 2: late, 3: healthy}, step=0.1)
    found = training.analyze(job)
    assert [r.rank for r in found.stragglers] == [2]
    (rank2,) = found.stragglers
    assert rank2.delay_share == pytest.approx(0.3, abs=0.01) and rank2.median_ratio == pytest.approx(2.4, abs=0.1)
    assert round(rank2.late_steps or 0) == 18
    verdict = _verdict(job)
    assert verdict.verdict == "straggler" and verdict.steps == 20
    assert verdict.reason == (
        "rank 2 arrives at its steps' last collective 29.8 ms (30 % of the step) later than the "
        "median rank in 18 of 20 steps (its median 2.42x the median rank's; attempt 0)"
    )


def test_a_rank_late_in_a_two_rank_job_is_named() -> None:
    """2 ranks (the median rank is their midpoint): rank 1 arrives 30 ms later on a 60 ms step in all its steps."""
    job = _job({0: [0.010] * 20, 1: [0.040] * 20}, step=0.06)
    assert [r.rank for r in training.analyze(job).stragglers] == [1]
    assert _verdict(job).reason.endswith("in 20 of 20 steps (its median 1.60x the median rank's; attempt 0)")


def test_a_ratio_of_small_arrivals_on_a_long_step_is_no_straggler() -> None:
    """1.5x, but of 1 ms arrivals on a 30 ms step: 0.5 ms is no delay that matters (2 % of the step)."""
    job = _job({0: [0.001] * 20, 1: [0.0015] * 20, 2: [0.001] * 20, 3: [0.001] * 20}, step=0.03)
    found = training.analyze(job)
    rank1 = next(r for r in found.ranks if r.rank == 1)
    assert rank1.median_ratio == pytest.approx(1.5) and rank1.ratio == pytest.approx(1.5)
    assert found.stragglers == [] and _verdict(job).verdict != "straggler"


def test_outliers_in_2_of_20_steps_are_no_straggler() -> None:
    """Rank 1 is as fast as the others but for 2 steps of 60 ms (a descheduled process): its mean arrival is 2.5x
    the median rank's -- the old rule named it -- its median and most of its steps are the others'."""
    steady = [0.005] * 20
    job = _job({0: steady, 1: [0.005] * 18 + [0.060, 0.060], 2: steady, 3: steady}, step=0.03)
    found = training.analyze(job)
    rank1 = next(r for r in found.ranks if r.rank == 1)
    assert (rank1.ratio or 0) > 2.0, "the mean alone would call it a straggler"
    assert round(rank1.late_steps or 0) == 2 and rank1.median_ratio == pytest.approx(1.0)
    assert found.stragglers == [] and _verdict(job).verdict != "straggler"


def test_too_few_steps_name_no_straggler() -> None:
    job = _job({0: [0.010] * 5, 1: [0.040] * 5}, step=0.06)
    assert training.analyze(job).stragglers == []


def test_the_workers_own_median_is_preferred_to_the_buckets() -> None:
    """``torchelastic.worker.step.arrival.median`` (exact, over the last 1,001 steps) decides where it is sent: the
    buckets of 20-50 ms would put rank 1's interpolated median elsewhere."""
    arrivals = {0: [0.021] * 20, 1: [0.026] * 10 + [0.049] * 10}
    step = 0.1
    without = training.analyze(_job(arrivals, step))
    with_exact = training.analyze(_job(arrivals, step, medians={0: 0.021, 1: 0.049}))
    assert next(r for r in without.ranks if r.rank == 1).arrival_median != pytest.approx(0.049)
    assert next(r for r in with_exact.ranks if r.rank == 1).arrival_median == pytest.approx(0.049)


def test_count_above_follows_the_buckets() -> None:
    point = _histogram(names.WORKER_STEP_ARRIVAL, 0, [0.003] * 10 + [0.007] * 10)
    assert point.count_above(0.001) == 20
    assert point.count_above(0.008) == 0  # above the max
    assert point.count_above(0.006) == pytest.approx(10 * (0.007 - 0.006) / (0.007 - 0.005))  # (5 ms, max 7 ms]
    assert Point("p", "histogram", "s", 0, 1.0, {}, point.proc, count=3).count_above(0.5) is None  # no buckets


def test_the_terminal_and_html_say_the_straggler_with_its_figures() -> None:
    from torchelastic_otel.report import html, terminal

    tel = Telemetry()
    job = _job({0: [0.010] * 20, 1: [0.040] * 20, 2: [0.010] * 20}, step=0.06)
    tel.points = job.points
    text = terminal.render(tel, [job], width=120)
    reason = _verdict(job).reason
    assert f"verdict: STRAGGLER: {reason}" in text
    assert "attempt 0: rank 1 (node) is a straggler: 4.00x the median rank\n  " + reason in text
    flagged = [line for line in text.splitlines() if line.endswith("<- straggler")]
    assert len(flagged) == 1 and flagged[0].split()[:2] == ["0", "1"]
    page = html.render(tel, [job])
    assert 'data-verdict="straggler" data-steps="20"' in page and html.e(reason) in page
    assert page.count('<tr class="straggler" data-rank="1"') == 1
