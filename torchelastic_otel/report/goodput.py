"""Where a job's time went: goodput by cause, the anatomy of a step, and the one-line verdict.

Pure functions over a built ``model.Job``, from what the agents and the workers emit (``_names`` spells it):

**Goodput** (:func:`goodput`). For each rank, every second from the run's start to its end goes to exactly one
cause (``CAUSES``), so a rank's figures sum to the run's wall time; the run's figures are the mean over its ranks,
and so is each attempt's. Per rank, walking its worker processes (one per attempt, ``WorkerRun`` [S, E]) in time:

- *before its first process*: ``rendezvous`` where the agent's rendezvous spans (of the rank's host, else of every
  agent) cover it, ``startup`` for the rest (the launcher starting before any rendezvous began, the agent starting
  its workers after it);
- *between two processes*: ``rendezvous`` where the agent's rendezvous spans cover the gap, ``restart`` for the
  rest (failure detected, workers stopped and started again);
- *after its last process* to the run's end: ``startup`` (the agent's shut-down: overhead, not progress);
- *inside a process*: the latest value (by time) of each cause of the worker's cumulative counter
  ``torchelastic.goodput.time`` (startup, productive, input_wait, checkpoint_save, checkpoint_load, stalled); they
  account for [S, L] with L = S + their sum (should they add up to more than E - S -- a clock step, a start clipped
  to its predecessor's end -- they are scaled down to fit). The *tail* [L, E] is the part the worker never
  accounted: where a stall record of that worker (``torchelastic.worker.stalled``) was still stalled after L, the
  tail from ``max(L, since)`` is ``stalled``; the rest of it is ``startup`` (shut-down) when the process ended well;
  when it did not, ``lost_progress`` up to the attempt's first failure (the root cause's time: the unfinished step)
  and ``restart`` from it on (the failure is detected: exception handling, teardown, the agent's SIGTERM -- under
  plain torchrun too, gloo's teardown keeps a failed rank alive for seconds). A process *did not end well* when its
  attempt is not the run's last (a restart followed), or it failed, was terminated or was stopped by the agent:
  then the worker's last
  ``torchelastic.worker.progress.at_risk`` gauge values (time since its last completed checkpoint, by cause) are
  moved out of ``productive`` / ``input_wait`` / ``stalled`` into ``lost_progress`` as well (never more than was
  there). A process without a single goodput point (a silent script, killed before its first export, the bridge
  off) is all tail: ``startup`` if it ended well, ``lost_progress`` if not. A worker's own ``lost_progress``
  counter (its last words) is not used: the report's tail reaches to when the agent saw it end, which is later.

The ratio is ``productive`` over the wall time (the share of it spent on progress that was kept).

**Phases** (:func:`anatomies`, :func:`phases`): per (restart, rank), the median seconds per step of each phase: the
worker's own (``torchelastic.worker.step.phase.median``, over its most recent steps) where it sent one, else
interpolated in the buckets of its latest (cumulative) ``torchelastic.worker.step.phase.duration`` point, its mean
without buckets. Each on one clock (attribute ``clock``): where the worker has points on the GPU's clock (CUDA
events, from CUDA's initialisation on), those alone -- the host's of its first steps would mix two clocks -- else the
host's (a point without the attribute is the host's). On the GPU's clock, ``gpu_idle`` is the share of
the GPU's step time it waited for the host: the sum of ``torchelastic.worker.step.gpu_idle.duration`` over the sum of
the worker's device-clock phase histograms (both cumulative, over the same steps).

**Verdict** (:func:`verdict`): see its docstring for the order and the thresholds.
"""

from __future__ import annotations

import collections
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from torchelastic_otel import _names as names
from torchelastic_otel.report import memory
from torchelastic_otel.report.model import Job, WorkerRun, as_str
from torchelastic_otel.report.records import Point
from torchelastic_otel.report.stalls import Stall
from torchelastic_otel.report.stalls import stalls as find_stalls


class Rank(Protocol):
    """What the verdict reads of a rank's steps in an attempt (``training.RankSteps``)."""

    rank: int
    restart: int
    steps: int
    ratio: float | None
    delay_share: float | None
    arrival_steps: int

    @property
    def straggler_reason(self) -> str: ...


class Training(Protocol):
    """What the verdict reads of ``training.analyze``'s result (a protocol: ``training`` builds on this module)."""

    @property
    def stragglers(self) -> Sequence[Rank]: ...

    #: every rank's steps
    @property
    def ranks(self) -> Sequence[Rank]: ...

    #: ``phases(job)``, when it computed them (else they are computed here)
    phases: dict[tuple[int, int], dict[str, float | None]] | None
    #: ``anatomies(job)``, when it computed them: each rank's clock and step count (else: the host's, no counts)
    anatomy: dict[tuple[int, int], Anatomy] | None


__all__ = [
    "CAUSES",
    "PHASES",
    "VERDICTS",
    "Goodput",
    "Anatomy",
    "Verdict",
    "Assessment",
    "goodput",
    "phases",
    "anatomies",
    "step_shares",
    "verdict",
    "memory_creep",
    "assess",
    "fraction",
]

#: The causes of a rank's wall time, in the order the report shows them (``report --json`` keys).
CAUSES = (
    "productive",
    "startup",
    "rendezvous",
    "restart",
    "checkpoint_save",
    "checkpoint_load",
    "lost_progress",
    "input_wait",
    "stalled",
)
#: The phases of a step (``torchelastic.worker.step.phase.duration``, attribute ``phase``).
PHASES = names.STEP_PHASES
VERDICTS = ("memory-creep", "straggler", "input-bound", "communication-bound", "compute-bound", "healthy")
#: The clocks a step's phases are timed on (attribute ``clock``; a point without it is the host's).
CLOCK_DEVICE, CLOCK_HOST = "device", "host"

#: What a worker process's counter accounts for (the rest of its causes come from the agent or the report).
_WORKER_CAUSES = ("startup", "productive", "input_wait", "checkpoint_save", "checkpoint_load", "stalled")
#: The causes of step time a failure throws away (the at-risk gauge's causes).
_AT_RISK = ("productive", "input_wait", "stalled")
_ENDED_BADLY = ("failed", "terminated", "stopped")

#: Verdict thresholds: shares of the median step (see ``verdict``).
INPUT_BOUND = 0.30
COMMUNICATION_BOUND = 0.40
COMPUTE_BOUND = 0.30


def fraction(value: float, total: float) -> float:
    """``value / total`` rounded to 3 digits (0 when there is no total): the one rounding the JSON ratio and every
    percentage shown (``fraction * 100`` with one decimal) share, so that they agree."""
    return round(value / total, 3) if total > 0 else 0.0


def _zero() -> dict[str, float]:
    return dict.fromkeys(CAUSES, 0.0)


@dataclass
class Goodput:
    """A run's wall time by cause: the mean over ranks (``seconds``), per rank, and per attempt (by restart).

    ``attempts[k]`` is the mean over the run's ranks of the time each rank spent in attempt ``k``: the gap before
    its process of that attempt (rendezvous, restart), the process itself, and for the last one the run's end; so
    the attempts' figures add up to the run's.
    """

    wall: float
    seconds: dict[str, float] = field(default_factory=_zero)
    ranks: dict[int, dict[str, float]] = field(default_factory=dict)
    attempts: dict[int, dict[str, float]] = field(default_factory=dict)
    measured: bool = False  # some worker process exported goodput counters

    @property
    def ratio(self) -> float | None:
        """Productive over the wall time, rounded as shown; ``None`` without a rank or a wall time."""
        return fraction(self.seconds["productive"], self.wall) if self.ranks and self.wall > 0 else None

    def attempt_wall(self, restart: int) -> float:
        return sum(self.attempts.get(restart, {}).values())

    def attempt_ratio(self, restart: int) -> float | None:
        wall = self.attempt_wall(restart)
        return fraction(self.attempts[restart]["productive"], wall) if wall > 0 else None


# ---- goodput ------------------------------------------------------------------------------------------------------


def _latest(job: Job, name: str) -> dict[tuple[int, int], dict[str, float]]:
    """The latest value (by time) of each ``cause`` of metric ``name`` per worker process (restart, rank)."""
    best: dict[tuple[int, int, str], tuple[int, float]] = {}
    for point in job.named(name):
        proc = point.proc
        if point.name != name or proc.kind != "worker" or proc.rank is None or point.value is None:
            continue
        key = (proc.restart or 0, proc.rank, as_str(point.attrs.get(names.CAUSE)))
        seen = best.get(key)
        if seen is None or (point.time, point.value) > seen:
            best[key] = (point.time, point.value)
    out: dict[tuple[int, int], dict[str, float]] = collections.defaultdict(dict)
    for (restart, rank, cause), (_, number) in best.items():
        out[(restart, rank)][cause] = number
    return out


def _covered(intervals: Iterable[tuple[int, int]], start: int, end: int) -> int:
    """Nanoseconds of [start, end] covered by the union of ``intervals``."""
    total, cursor = 0, start
    for a, b in sorted(intervals):
        a, b = max(a, cursor), min(b, end)
        if b > a:
            total += b - a
            cursor = b
    return total


class _Ledger:
    """One rank's seconds by attempt and cause."""

    def __init__(self) -> None:
        self.by_attempt: dict[int, dict[str, float]] = collections.defaultdict(_zero)

    def add(self, restart: int, cause: str, seconds: float) -> None:
        if seconds > 0:
            self.by_attempt[restart][cause] += seconds


def goodput(job: Job) -> Goodput:
    """The run's wall time by cause (see the module's docstring)."""
    wall_ns = max(0, job.end - job.start)
    out = Goodput(wall=wall_ns / 1e9)
    by_rank: dict[int, list[WorkerRun]] = collections.defaultdict(list)
    for run in job.workers:
        if run.rank is not None:
            by_rank[run.rank].append(run)
    if not by_rank or wall_ns <= 0:
        return out
    counters = _latest(job, names.GOODPUT_TIME)
    at_risk = _latest(job, names.WORKER_PROGRESS_AT_RISK)
    out.measured = any(cause in _WORKER_CAUSES for values in counters.values() for cause in values)
    stalls: dict[tuple[int, int], list[Stall]] = collections.defaultdict(list)
    for stall in find_stalls(job):
        if stall.rank is not None:
            stalls[(stall.restart, stall.rank)].append(stall)
    rendezvous: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for attempt in job.attempts:
        rendezvous[attempt.host].extend(attempt.rendezvous)
    every_rendezvous = [r for spans in rendezvous.values() for r in spans]
    last_restart = max(w.restart for runs in by_rank.values() for w in runs)
    failed_at = _failure_times(job)
    for rank, runs in sorted(by_rank.items()):
        ledger = _Ledger()
        runs.sort(key=lambda w: (w.start, w.restart))
        cursor = job.start
        for i, run in enumerate(runs):
            start = min(max(run.start, cursor), job.end)
            end = min(max(run.end, start), job.end)
            gap = start - cursor
            if gap > 0:  # rendezvous where the agent's spans cover it; the rest start-up (first) or restart
                covered = _covered(rendezvous.get(run.host) or every_rendezvous, cursor, start)
                ledger.add(run.restart, "rendezvous", covered / 1e9)
                ledger.add(run.restart, "startup" if i == 0 else "restart", (gap - covered) / 1e9)
            ended_badly = run.state in _ENDED_BADLY or run.restart < last_restart
            key = (run.restart, rank)
            _process(
                ledger,
                run.restart,
                start,
                end,
                counters.get(key, {}),
                at_risk.get(key, {}),
                stalls[key],
                ended_badly,
                failed_at.get(run.restart),
            )
            cursor = end
        ledger.add(runs[-1].restart, "startup", (job.end - cursor) / 1e9)
        out.ranks[rank] = _zero()
        for restart, seconds in ledger.by_attempt.items():
            share = out.attempts.setdefault(restart, _zero())
            for cause, value in seconds.items():
                out.ranks[rank][cause] += value
                share[cause] += value / len(by_rank)
    for cause in CAUSES:
        out.seconds[cause] = sum(r[cause] for r in out.ranks.values()) / len(out.ranks)
    out.attempts = dict(sorted(out.attempts.items()))
    return out


def _failure_times(job: Job) -> dict[int, int]:
    """Per attempt, when its first failure happened: the root cause's time, else the first failure seen (a rank's
    own exception record, the agent's failure record). From then on the attempt's processes only end."""
    out: dict[int, int] = {}
    for attempt in job.attempts:
        times = [attempt.root_cause.time] if attempt.root_cause is not None and attempt.root_cause.time else []
        times += [f.time for f in attempt.failures if f.time]
        times += [w.failed_at for w in attempt.workers if w.failed_at]
        if times:
            out[attempt.restart] = min(min(times), out.get(attempt.restart, min(times)))
    return out


def _process(
    ledger: _Ledger,
    restart: int,
    start: int,
    end: int,
    counters: dict[str, float],
    at_risk: dict[str, float],
    stalls: Sequence[Stall],
    ended_badly: bool,
    failed_at: int | None = None,
) -> None:
    """One worker process's [start, end]: its counters, the tail after them, what a failure throws away."""
    duration = (end - start) / 1e9
    accounted = {cause: max(0.0, counters.get(cause, 0.0)) for cause in _WORKER_CAUSES}
    total = sum(accounted.values())
    if total > duration:  # more than the process lasted: scaled to fit
        accounted = {cause: value * duration / total for cause, value in accounted.items()}
        total = duration
    tail = max(0.0, duration - total)
    accounted_end = start + int(total * 1e9)
    stalled = 0.0
    for stall in stalls:
        if stall.since + stall.seconds * 1e9 > accounted_end and stall.since < end:  # still stalled after L
            stalled = max(stalled, (end - max(accounted_end, stall.since)) / 1e9)
    stalled = min(stalled, tail)
    accounted["stalled"] += stalled
    rest = tail - stalled
    if ended_badly:
        # the unfinished step up to the attempt's first failure is lost; from the failure on, the process is only
        # ending (a failed rank's exception handling, gloo's teardown, the agent's SIGTERM): restart
        ending = 0.0
        if failed_at is not None:
            ending = min(rest, max(0.0, (end - max(failed_at, accounted_end)) / 1e9))
            ledger.add(restart, "restart", ending)
        lost = rest - ending
        for cause in _AT_RISK:
            moved = min(accounted[cause], max(0.0, at_risk.get(cause, 0.0)))
            accounted[cause] -= moved
            lost += moved
        ledger.add(restart, "lost_progress", lost)
    else:
        accounted["startup"] += rest
    for cause, value in accounted.items():
        ledger.add(restart, cause, value)


# ---- the anatomy of a step ---------------------------------------------------------------------------------------


@dataclass
class Anatomy:
    """One worker process's steps by phase (see the module's docstring)."""

    clock: str  # "device" (the GPU's, CUDA events) or "host"
    medians: dict[str, float | None]  # phase -> median seconds a step (``None``: the worker recorded none)
    steps: int  # the steps the phases are of (the most any phase's histogram counted)
    #: device clock: the share of the GPU's step time it waited for the host (``WORKER_STEP_GPU_IDLE``)
    gpu_idle: float | None = None
    #: whether its ``collective_wait`` was measured: it arrived at collectives (``WORKER_STEP_ARRIVAL``), or it is
    #: its attempt's only rank. Without the Flight Recorder's entries the wait stays in the phase it fell in.
    waits_measured: bool = True


def _clock(point: Point) -> str:
    return CLOCK_DEVICE if as_str(point.attrs.get(names.CLOCK)) == CLOCK_DEVICE else CLOCK_HOST


def _worker_key(point: Point, name: str) -> tuple[int, int] | None:
    proc = point.proc
    if point.name != name or proc.kind != "worker" or proc.rank is None:
        return None
    return (proc.restart or 0, proc.rank)


def _most_counted(job: Job, name: str) -> dict[tuple[int, int, str, str], Point]:
    """Per (restart, rank, clock, phase), the cumulative point of histogram ``name`` that saw the most steps."""
    latest: dict[tuple[int, int, str, str], Point] = {}
    for point in job.named(name):
        key = _worker_key(point, name)
        if key is None or not point.count:
            continue
        phase = as_str(point.attrs.get(names.PHASE)) if name == names.WORKER_STEP_PHASE_DURATION else ""
        if name == names.WORKER_STEP_PHASE_DURATION and phase not in PHASES:
            continue
        full = (*key, _clock(point), phase)
        seen = latest.get(full)
        if seen is None or ((point.count or 0), point.time) > ((seen.count or 0), seen.time):
            latest[full] = point
    return latest


def anatomies(job: Job) -> dict[tuple[int, int], Anatomy]:
    """Per (restart, rank): its steps by phase, on the device's clock where it has device-clock points."""
    latest = _most_counted(job, names.WORKER_STEP_PHASE_DURATION)
    exact = _phase_medians(job)
    device = {(restart, rank) for restart, rank, clock, _ in [*latest, *exact] if clock == CLOCK_DEVICE}
    idle = {
        (restart, rank): point
        for (restart, rank, _, _), point in _most_counted(job, names.WORKER_STEP_GPU_IDLE).items()
    }
    arrived = {
        key
        for point in job.named(names.WORKER_STEP_ARRIVAL)
        if (key := _worker_key(point, names.WORKER_STEP_ARRIVAL)) is not None and point.count
    }
    out: dict[tuple[int, int], Anatomy] = {}
    totals: dict[tuple[int, int], float] = collections.defaultdict(float)
    for (restart, rank, clock, phase), point in sorted(latest.items()):
        key = (restart, rank)
        if clock != (CLOCK_DEVICE if key in device else CLOCK_HOST):
            continue
        median = exact.get((restart, rank, clock, phase))
        if median is None:
            median = point.quantile(0.5)
        found = out.setdefault(key, Anatomy(clock, dict.fromkeys(PHASES), 0))
        found.medians[phase] = None if median is None else max(0.0, median)
        found.steps = max(found.steps, point.count or 0)
        totals[key] += point.total or 0.0
    ranks = collections.Counter(restart for restart, _ in out)
    for key, found in out.items():
        found.waits_measured = key in arrived or ranks[key[0]] < 2
        waited = idle.get(key)
        if found.clock == CLOCK_DEVICE and waited is not None and waited.total is not None and totals[key] > 0:
            found.gpu_idle = min(1.0, fraction(waited.total, totals[key]))
    return out


def phases(job: Job) -> dict[tuple[int, int], dict[str, float | None]]:
    """Per (restart, rank): the median seconds per step of every phase (``None`` where the worker recorded none),
    on the device's clock where the worker has device-clock points (``anatomies``)."""
    return {key: found.medians for key, found in anatomies(job).items()}


def _phase_medians(job: Job) -> dict[tuple[int, int, str, str], float]:
    """The workers' own medians (``torchelastic.worker.step.phase.median``: the last 1,001 steps), latest by time,
    per (restart, rank, clock, phase)."""
    latest: dict[tuple[int, int, str, str], Point] = {}
    for point in job.named(names.WORKER_STEP_PHASE_MEDIAN):
        key = _worker_key(point, names.WORKER_STEP_PHASE_MEDIAN)
        if key is None or point.value is None:
            continue
        full = (*key, _clock(point), as_str(point.attrs.get(names.PHASE)))
        if full not in latest or point.time >= latest[full].time:
            latest[full] = point
    return {key: point.value for key, point in latest.items() if point.value is not None}


def step_shares(
    found: dict[tuple[int, int], dict[str, float | None]], leave_out: Iterable[tuple[int, int]] = ()
) -> dict[str, float] | None:
    """The job's median step by phase, as shares of it: each phase's median over the workers (every restart and
    rank alike, less those in ``leave_out`` unless that is all of them), over the sum of those medians; ``None``
    without phases."""
    skipped = set(leave_out)
    kept = [v for key, v in found.items() if key not in skipped] or list(found.values())
    medians = {}
    for phase in PHASES:
        values = [v[phase] for v in kept if v.get(phase) is not None]
        medians[phase] = statistics.median(v for v in values if v is not None) if values else 0.0
    step = sum(medians.values())
    return {phase: value / step for phase, value in medians.items()} if step > 0 else None


# ---- the verdict --------------------------------------------------------------------------------------------------


@dataclass
class Verdict:
    verdict: str  # one of VERDICTS
    reason: str  # the figure that decided it, and on how many steps
    steps: int = 0  # the steps it rests on (a rank's, per attempt; 0: none measured)


def memory_creep(job: Job) -> list[memory.Creep]:
    """The ranks whose memory grows steadily (``memory.creep``)."""
    return memory.creep(job)


def _percent(share: float) -> str:
    return f"{round(share * 100)} %" if math.isfinite(share) else "? %"


def _creep_reason(creep: memory.Creep) -> str:
    return creep.text or f"rank {creep.rank}'s memory grows by {creep.growth_bytes_per_s / 2**20:.2f} MiB/s"


def verdict(
    job: Job,
    training: Training,
    goodput: Goodput,
    phases: dict[tuple[int, int], dict[str, float | None]],
    creep: Sequence[memory.Creep],
) -> Verdict:
    """The one line: what bounds this job, with the figure that decided it and the steps it rests on (``steps``).
    The first rule that holds wins:

    1. ``memory-creep``: a rank's memory grows steadily (``report.memory.creep``). First because it ends the job
       (an OOM) whatever else is true, and the other figures are of a job that will not finish.
    2. ``straggler``: a rank arrives at its steps' last collective later than the attempt's median rank by a
       delay that matters, in most of its steps (``training``'s rule: medians, a share of the step, 10 steps
       at least). Before the phases: a straggler makes every *other* rank wait in the collective, so its
       job looks communication-bound while the cause is one rank (fix the rank, not the network).
    3. ``input-bound``: the input phase (waiting in the DataLoader) is 30 % or more of the median step. Before
       communication: ranks waiting on their input arrive late at the collective, so input wait shows up as
       collective wait on the others; the input is the cause. 30 %: at that share a faster loader (workers,
       prefetch, pinned memory) gives at least 1.4x, well beyond noise; a healthy loop's input is a few %.
    4. ``communication-bound``: ``collective_wait`` is 40 % or more of the median step. DDP overlaps most of its
       all-reduce with the backward, so a healthy step blocks in collectives for a small share; but the wait the
       host measures also holds the skew of the ranks' arrivals (a rank descheduled for a moment) and, on CPU,
       gloo's own reduction: the README's healthy quickstart job (2 ranks, gloo, a 9 ms step on 2 cores) measures
       25-30 % run after run. 40 % is clear of that: a network, a bucket size or a world size problem worth
       acting on.
    5. ``compute-bound``: the compute *outside* the model -- the optimizer and the loop's other host work
       (``optimizer`` + ``other``: a CPU-offloaded or unfused optimizer, per-step metrics, logging, a Python-heavy
       loop) -- is 30 % or more of the median step. A step that is the model's own forward and backward is what a
       training job should be: that is ``healthy``, not a finding; compute around the model is the compute a
       fused optimizer, fewer syncs or less logging takes away. On the device's clock ``other`` is the GPU's time
       outside the model's phases: waiting for the host (logging, syncs, Python).
    6. ``healthy``: none of these (the reason gives the shares, or says there were no step phases).

    The median step is each phase's median seconds per step, the median over the workers, as shares of their sum
    (``step_shares``); workers whose collective wait was not measured (no Flight Recorder entries: the wait stayed
    in another phase) are left out of it where others were measured. Where every worker's phases are on the
    device's clock, the step is the GPU's ("of the GPU's step"). Without phases, the goodput counters decide
    input-bound alone: ``input_wait`` over ``input_wait + productive`` at 30 % or more.
    """
    del job  # the figures come in already computed; kept for the signature's sake (and for future rules)
    anatomy = training.anatomy or {}
    steps = _steps(anatomy, training.ranks)
    if creep:
        return Verdict("memory-creep", _creep_reason(creep[0]), steps)
    stragglers = training.stragglers
    if stragglers:
        worst = max(stragglers, key=lambda r: (r.delay_share or 0.0, r.ratio or 0.0))
        return Verdict("straggler", _straggler_reason(worst), worst.arrival_steps)
    unmeasured = {key for key, found in anatomy.items() if not found.waits_measured}
    shares = step_shares(phases, unmeasured)
    over = f" over {steps:,} step{'s' if steps != 1 else ''}" if steps else ""
    if shares is None:
        kept = goodput.seconds["input_wait"] + goodput.seconds["productive"]
        if goodput.measured and kept > 0 and goodput.seconds["input_wait"] / kept >= INPUT_BOUND:
            return Verdict(
                "input-bound",
                f"input wait is {_percent(goodput.seconds['input_wait'] / kept)} of the step time{over}",
                steps,
            )
        ratio = goodput.ratio
        note = f"goodput {ratio * 100:.1f} %; " if ratio is not None and goodput.measured else ""
        return Verdict("healthy", f"{note}no step phases in these files", steps)
    gpu = bool(phases) and all(key in anatomy and anatomy[key].clock == CLOCK_DEVICE for key in phases)
    step = "the GPU's step" if gpu else "the step"
    compute = shares["forward"] + shares["backward"] + shares["optimizer"]
    if shares["input"] >= INPUT_BOUND:
        return Verdict("input-bound", f"input wait is {_percent(shares['input'])} of {step}{over}", steps)
    if shares["collective_wait"] >= COMMUNICATION_BOUND:
        return Verdict(
            "communication-bound", f"collective wait is {_percent(shares['collective_wait'])} of {step}{over}", steps
        )
    around = shares["optimizer"] + shares["other"]
    if around >= COMPUTE_BOUND:
        what = (
            "the optimizer and the GPU's time outside the model's phases (waiting for the host: logging, syncs, "
            "Python) are"
            if gpu
            else "optimizer and other host work are"
        )
        return Verdict("compute-bound", f"{what} {_percent(around)} of {step}{over}", steps)
    unseen = (
        "; collective wait not measured (no Flight Recorder entries)"
        if phases and not (set(phases) - unmeasured)
        else ""
    )
    return Verdict(
        "healthy",
        f"no phase dominates {step}{over}: input {_percent(shares['input'])}, collective wait "
        f"{_percent(shares['collective_wait'])}, compute {_percent(compute)}{unseen}",
        steps,
    )


def _steps(anatomy: dict[tuple[int, int], Anatomy], ranks: Sequence[Rank]) -> int:
    """The steps a verdict rests on: per attempt, its ranks' most steps with phases (else their most steps), summed
    over the attempts."""
    counts: dict[int, int] = collections.defaultdict(int)
    if anatomy:
        for (restart, _), found in anatomy.items():
            counts[restart] = max(counts[restart], found.steps)
    else:
        for r in ranks:
            counts[r.restart] = max(counts[r.restart], r.steps)
    return sum(counts.values())


def _straggler_reason(worst: Rank) -> str:
    """``training.RankSteps.straggler_reason`` where it says one (else the ratio alone)."""
    if worst.straggler_reason:
        return worst.straggler_reason
    return (
        f"rank {worst.rank} arrives at its steps' last collective {worst.ratio or 0.0:.2f}x later than the median "
        f"rank (attempt {worst.restart})"
    )


@dataclass
class Assessment:
    """Everything this module says about a job, computed once for the JSON, the terminal and the HTML."""

    goodput: Goodput
    phases: dict[tuple[int, int], dict[str, float | None]]
    creep: list[memory.Creep]
    verdict: Verdict


def assess(job: Job, training: Training) -> Assessment:
    """Goodput, phases, memory creep and the verdict of ``job`` (``training``: its ``training.analyze``)."""
    if training.anatomy is None:  # a ``Training`` made without it: computed here, once
        training.anatomy = anatomies(job)
    found_phases = training.phases
    if found_phases is None:
        found_phases = {key: found.medians for key, found in training.anatomy.items()}
    found_goodput, creep = goodput(job), memory_creep(job)
    return Assessment(found_goodput, found_phases, creep, verdict(job, training, found_goodput, found_phases, creep))
