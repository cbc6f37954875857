"""What the report says about a job's training: stragglers, stalled ranks, and the ranks missing from a collective.

From the workers' own telemetry (``torchelastic_otel._torch.worker.steps`` / ``collectives`` / ``stalls``):

- **stragglers**: each worker's *arrival* (``torchelastic.worker.step.arrival``: from the start of a step to its
  enqueueing of the step's last collective) against the median rank of the same attempt, on every node whose
  files are read. ``ratio`` is its mean arrival over the median rank's mean, the figure of the alert
  ``TorchElasticStraggler``. A rank is a *straggler* when a delay that matters is seen in most of its steps,
  measured so that a few slow steps (a descheduled process, a first step's warm-up) decide nothing:

  - its median arrival (``torchelastic.worker.step.arrival.median``, over its most recent steps; in files without
    that gauge the median interpolated in the histogram's buckets) is ``STRAGGLER_RATIO`` (1.2) times the median
    rank's or more,
  - and later than it by ``STRAGGLER_DELAY`` (10 %) of the attempt's median step or more (a ratio of two
    sub-millisecond arrivals is no delay: the step is what a straggler slows),
  - in more than ``STRAGGLER_MOST`` (two thirds) of its steps: the steps it arrived later than the median rank's
    median plus that delay, estimated in its histogram's buckets (a slow node is late in nearly every step; a rank
    that the OS deschedules now and then on a busy machine, in about half of them),
  - over ``STRAGGLER_MIN_STEPS`` (10) steps at least.

  Step time (``torchelastic.worker.step.duration``) is shown beside it: it is the same for every rank of a
  synchronous job, which is why it cannot name the slow one;
- **stalls**: the ``torchelastic.worker.stalled`` records, one stall per rank and start (its repeats counted), with
  the innermost frame of the main thread (``stack_top``) and the line of the user's code (``code``);
- **missing ranks**: per attempt and process group, the latest summary of each rank's collectives (from its
  stalled, terminated and exception records: ``torchelastic.collectives.<group>.*``); where some ranks enqueued
  collective #N and had not completed it, the ranks whose last one is below N are missing from it:
  "rank 1 is missing from collective #11, gloo:all_reduce, default_pg";
- **phases**: each rank's median seconds per step of each phase of the step (``goodput.anatomies``), in its row
  of the steps table, with the clock they were timed on (the GPU's, where the worker timed its steps with CUDA
  events) and then the GPU's idle share of its step time.

:func:`summary` is the machine-readable form (``torchelastic-otel report --json``).
"""

from __future__ import annotations

import collections
import datetime
import statistics
from dataclasses import dataclass, field

from torchelastic_otel import _names as names
from torchelastic_otel.report import goodput as goodput_mod
from torchelastic_otel.report import groups as groups_mod
from torchelastic_otel.report import hosts as hosts_mod
from torchelastic_otel.report import memory as memory_mod
from torchelastic_otel.report import nodes as nodes_mod
from torchelastic_otel.report.model import EXCEPTION_EVENT, TERMINATED_EVENT, Job, RootCause
from torchelastic_otel.report.records import Point, Proc
from torchelastic_otel.report.stalls import STALLED_EVENT, Group, Stall, collectives_of, stalls
from torchelastic_otel.report.stalls import rank_of as _rank_of
from torchelastic_otel.report.stalls import restart_of as _restart_of

__all__ = [
    "Training",
    "RankSteps",
    "Stall",
    "Group",
    "Missing",
    "analyze",
    "stalls",
    "summary",
    "step_rates",
    "RATE_WINDOW",
    "STRAGGLER_RATIO",
    "STRAGGLER_DELAY",
    "STRAGGLER_MOST",
    "STRAGGLER_MIN_STEPS",
]

STRAGGLER_RATIO = 1.2
#: A straggler's median arrival is this share of the attempt's median step or more behind the median rank's ...
STRAGGLER_DELAY = 0.10
#: ... in more than this share of its steps ...
STRAGGLER_MOST = 2 / 3
#: ... over this many steps at least.
STRAGGLER_MIN_STEPS = 10
ARRIVAL = names.WORKER_STEP_ARRIVAL
DURATION = names.WORKER_STEP_DURATION
_SUMMARY_EVENTS = (STALLED_EVENT, TERMINATED_EVENT, EXCEPTION_EVENT)


@dataclass
class RankSteps:
    """One rank's steps in one attempt."""

    rank: int
    restart: int
    host: str
    arrival: float | None  # mean seconds to the step's last collective
    arrival_steps: int
    step: float | None  # mean step time, seconds
    steps: int
    ratio: float | None = None  # mean arrival / the attempt's median rank's
    phases: dict[str, float | None] = field(default_factory=dict)  # phase -> median seconds per step (goodput.PHASES)
    clock: str = goodput_mod.CLOCK_HOST  # what the phases were timed on: "device" (the GPU's) or "host"
    gpu_idle: float | None = None  # device clock: the GPU's idle share of its step time
    arrival_median: float | None = None  # seconds
    step_median: float | None = None  # seconds
    median_ratio: float | None = None  # median arrival / the attempt's median rank's
    delay_share: float | None = None  # (median arrival - the median rank's) / the attempt's median step
    late_steps: float | None = None  # the steps it arrived that much later (estimated in the buckets)
    straggler: bool = False  # the rule of the module's docstring holds

    @property
    def straggler_reason(self) -> str:
        """What the verdict says of a straggler: ``rank R arrives at its steps' last collective D ms (P % of the
        step) later than the median rank in L of N steps (its median X.XXx the median rank's; attempt A)``; ""
        where not measured."""
        if self.delay_share is None or self.arrival_median is None or self.step_median is None:
            return ""
        late = min(self.arrival_steps, round(self.late_steps or 0.0))
        ratio = f"{self.median_ratio:.2f}x" if self.median_ratio is not None else "?"
        return (
            f"rank {self.rank} arrives at its steps' last collective {ms(self.delay_share * self.step_median)} "
            f"({round(self.delay_share * 100)} % of the step) later than the median rank in {late:,} of "
            f"{self.arrival_steps:,} steps (its median {ratio} the median rank's; attempt {self.restart})"
        )


@dataclass
class Missing:
    restart: int
    process_group: str
    seq: int
    collective: str
    ranks: list[int]  # behind: their last collective is below ``seq``
    waiting: list[int]  # enqueued ``seq`` and did not complete it

    @property
    def sentence(self) -> str:
        who = f"rank{'s' if len(self.ranks) > 1 else ''} {', '.join(map(str, self.ranks))}"
        verb = "are" if len(self.ranks) > 1 else "is"
        what = ", ".join(part for part in (self.collective, self.process_group) if part)
        return f"{who} {verb} missing from collective #{self.seq}, {what}"


@dataclass
class Series:
    label: str
    rank: int
    restart: int
    points: list[tuple[int, float]]


@dataclass
class Training:
    ranks: list[RankSteps]
    stalls: list[Stall]
    missing: list[Missing]
    arrival_series: list[Series]
    #: ``goodput.phases(job)``, computed once: the steps' phases are each rank's, and ``goodput.assess`` uses them too
    phases: dict[tuple[int, int], dict[str, float | None]] | None = None
    #: ``goodput.anatomies(job)``, of which ``phases`` are the medians: each rank's clock, steps and GPU idle share
    anatomy: dict[tuple[int, int], goodput_mod.Anatomy] | None = None

    @property
    def stragglers(self) -> list[RankSteps]:
        return [r for r in self.ranks if r.straggler]

    def table_ranks(self, limit: int) -> tuple[list[RankSteps], int]:
        """The rows of a per-rank table: every rank when they fit, else the stragglers and then the slowest
        arrivals (in table order), and how many were left out."""
        if len(self.ranks) <= limit:
            return self.ranks, 0
        keep = sorted(self.ranks, key=lambda r: (not r.straggler, -(r.ratio or 0.0)))[:limit]
        chosen = {id(r) for r in keep}
        return [r for r in self.ranks if id(r) in chosen], len(self.ranks) - limit

    def __bool__(self) -> bool:
        return bool(self.ranks or self.stalls or self.missing)


def analyze(job: Job) -> Training:
    anatomy = goodput_mod.anatomies(job)
    phases = {key: found.medians for key, found in anatomy.items()}
    return Training(_rank_steps(job, anatomy), stalls(job), _missing(job), _arrival_series(job), phases, anatomy)


@dataclass
class Study:
    """A job's training as every view shows it (the terminal, the HTML, ``--json``), computed once: ``analyze``'s
    steps, stragglers, stalls and missing ranks, and ``goodput.assess``'s goodput, phases, memory creep and verdict,
    which reads them."""

    training: Training
    assessment: goodput_mod.Assessment


def study(job: Job) -> Study:
    """``analyze``, then ``goodput.assess`` of what it found: the one composition of the two."""
    found = analyze(job)
    return Study(found, goodput_mod.assess(job, found))


# ---- steps and stragglers -------------------------------------------------------------------------------------


def _worker_points(job: Job, name: str) -> dict[tuple[int, int], list[Point]]:
    """The points of ``name`` per (restart, rank), from the workers' own processes."""
    out: dict[tuple[int, int], list[Point]] = collections.defaultdict(list)
    for point in job.named(name):
        proc = point.proc
        if point.name == name and proc.kind == "worker" and proc.rank is not None and point.count:
            out[(proc.restart or 0, proc.rank)].append(point)
    return out


def _last(points: list[Point]) -> Point:
    """The cumulative point that saw the most (a histogram's points are cumulative)."""
    return max(points, key=lambda p: (p.count or 0, p.time))


def _rank_steps(job: Job, anatomy: dict[tuple[int, int], goodput_mod.Anatomy]) -> list[RankSteps]:
    arrivals = _worker_points(job, ARRIVAL)
    durations = _worker_points(job, DURATION)
    medians = _latest_values(job, names.WORKER_STEP_ARRIVAL_MEDIAN)
    counted = _latest_values(job, names.WORKER_STEPS)  # exact: a fast loop's duration histogram is a sample
    hosts = {(p.restart or 0, p.rank): p.host for p in job.point_procs() if p.kind == "worker"}
    out = []
    last_arrival: dict[tuple[int, int], Point] = {}
    for key in sorted(set(arrivals) | set(durations) | set(anatomy)):
        arrival = _last(arrivals[key]) if key in arrivals else None
        duration = _last(durations[key]) if key in durations else None
        found = anatomy.get(key)
        if arrival is not None:
            last_arrival[key] = arrival
        out.append(
            RankSteps(
                rank=key[1],
                restart=key[0],
                host=hosts.get(key, ""),
                arrival=arrival.value if arrival is not None else None,
                arrival_steps=(arrival.count or 0) if arrival is not None else 0,
                step=duration.value if duration is not None else None,
                steps=_steps(counted.get(key), duration),
                phases=found.medians if found is not None else dict.fromkeys(goodput_mod.PHASES),
                clock=found.clock if found is not None else goodput_mod.CLOCK_HOST,
                gpu_idle=found.gpu_idle if found is not None else None,
                arrival_median=_median(medians.get(key), arrival),
                step_median=_median(None, duration),
            )
        )
    for restart in {r.restart for r in out}:
        attempt = [r for r in out if r.restart == restart]
        same = [(r, r.arrival) for r in attempt if r.arrival is not None]
        if len(same) >= 2:
            median = statistics.median(seconds for _, seconds in same)
            for r, seconds in same:
                r.ratio = seconds / median if median > 0 else None
        _judge(attempt, last_arrival)
    return out


def _steps(counted: float | None, duration: Point | None) -> int:
    """A worker's steps: its steps counter, else (files without it) its duration histogram's count and the first."""
    if counted is not None and counted >= 0:
        return int(counted)
    return (duration.count or 0) + 1 if duration is not None else 0


def _latest_values(job: Job, name: str) -> dict[tuple[int, int], float]:
    """The latest value (by time) of gauge or cumulative sum ``name`` per worker process (restart, rank)."""
    latest: dict[tuple[int, int], Point] = {}
    for point in job.named(name):
        proc = point.proc
        if point.name != name or proc.kind != "worker" or proc.rank is None or point.value is None:
            continue
        key = (proc.restart or 0, proc.rank)
        if key not in latest or point.time >= latest[key].time:
            latest[key] = point
    return {key: point.value for key, point in latest.items() if point.value is not None}


def _median(exact: float | None, histogram: Point | None) -> float | None:
    """The worker's own median, else its histogram's interpolated one (its mean without buckets)."""
    if exact is not None:
        return exact
    return histogram.quantile(0.5) if histogram is not None else None


def _judge(attempt: list[RankSteps], arrivals: dict[tuple[int, int], Point]) -> None:
    """The straggler rule (the module's docstring) over the ranks of one attempt."""
    timed = [r for r in attempt if r.arrival_median is not None]
    if len(timed) < 2:
        return
    reference = statistics.median(r.arrival_median for r in timed if r.arrival_median is not None)
    steps = [r.step_median for r in attempt if r.step_median is not None and r.step_median > 0]
    step = statistics.median(steps) if steps else None
    for r in timed:
        arrival, histogram = r.arrival_median, arrivals.get((r.restart, r.rank))
        if arrival is None:
            continue
        r.median_ratio = arrival / reference if reference > 0 else None
        if step is None:
            continue
        r.delay_share = (arrival - reference) / step
        r.late_steps = histogram.count_above(reference + STRAGGLER_DELAY * step) if histogram is not None else None
        r.straggler = (
            r.median_ratio is not None
            and r.median_ratio >= STRAGGLER_RATIO
            and r.delay_share >= STRAGGLER_DELAY
            and r.arrival_steps >= STRAGGLER_MIN_STEPS
            and r.late_steps is not None
            and r.late_steps > STRAGGLER_MOST * r.arrival_steps
        )


def _arrival_series(job: Job, max_points: int = 150) -> list[Series]:
    """Each worker's arrival over time: the mean of the steps between two exports (the points are cumulative)."""
    out = []
    for (restart, rank), points in sorted(_worker_points(job, ARRIVAL).items()):
        line: list[tuple[int, float]] = []
        previous: Point | None = None
        for point in sorted(points, key=lambda p: (p.count or 0, p.time)):
            if point.value is None:
                continue
            if previous is None:
                line.append((point.time, point.value))
            elif (point.count or 0) > (previous.count or 0):
                added = point.value * (point.count or 0) - (previous.value or 0.0) * (previous.count or 0)
                line.append((point.time, added / ((point.count or 0) - (previous.count or 0))))
            previous = point
        if len(line) >= 2:
            out.append(Series(f"rank {rank}, restart {restart}", rank, restart, _thin(line, max_points)))
    return out


def _thin(points: list[tuple[int, float]], limit: int) -> list[tuple[int, float]]:
    if len(points) <= limit:
        return points
    step = (len(points) - 1) / (limit - 1)
    return [points[round(i * step)] for i in range(limit)]


#: The seconds a rank's step rate is taken over (``step_rates``).
RATE_WINDOW = 30.0


def step_rates(job: Job, window: float = RATE_WINDOW) -> dict[tuple[int, int], float]:
    """Per worker (restart, rank): its steps a second over its last ``window`` seconds, from its own steps counter
    (``torchelastic.worker.steps``, cumulative): the rise from its first point in the window (its point before the
    last when the window holds only the last) to its last point, over the time between them. A worker with fewer
    than two points has no rate; of a rank's processes, the one that counted the most steps."""
    by_proc: dict[Proc, list[Point]] = collections.defaultdict(list)
    for point in job.named(names.WORKER_STEPS):
        proc = point.proc
        if proc.kind == "worker" and proc.rank is not None and point.value is not None and point.time:
            by_proc[proc].append(point)
    rates: dict[tuple[int, int], tuple[float, float]] = {}  # -> (steps counted, rate)
    for proc, points in by_proc.items():
        points.sort(key=lambda p: p.time)
        last = points[-1]
        since = last.time - window * 1e9
        first = next((p for p in points[:-1] if p.time >= since), points[-2] if len(points) > 1 else None)
        if first is None or last.time <= first.time or last.value is None or first.value is None:
            continue
        rate = (last.value - first.value) / ((last.time - first.time) / 1e9)
        key = (proc.restart or 0, proc.rank or 0)  # (a worker's: its rank is known)
        if rate >= 0 and (key not in rates or last.value > rates[key][0]):
            rates[key] = (last.value, rate)
    return {key: rate for key, (_, rate) in sorted(rates.items())}


# ---- missing ranks ---------------------------------------------------------------------------------------------


def _missing(job: Job) -> list[Missing]:
    """Per attempt and process group (see the module's docstring)."""
    latest: dict[tuple[int, str, int], tuple[int, Group]] = {}  # (restart, group, rank) -> its last enqueued, summary
    names: dict[tuple[int, str, int], str] = {}  # (restart, group, seq) -> the pending collective's name
    records = sorted((r for name in _SUMMARY_EVENTS for r in job.logs_named(name)), key=lambda r: r.time)
    for rec in records:
        rank = _rank_of(rec)
        if rank is None:
            continue
        restart = _restart_of(rec)
        for group, fields in collectives_of(rec.attrs).items():
            if fields.last_enqueued is None:
                continue
            latest[(restart, group, rank)] = (fields.last_enqueued, fields)
            seq = fields.pending_seq
            if fields.pending and seq is not None:
                names[(restart, group, seq)] = fields.pending
    by_group: dict[tuple[int, str], dict[int, tuple[int, Group]]] = collections.defaultdict(dict)
    for (restart, group, rank), summary in latest.items():
        by_group[(restart, group)][rank] = summary
    out = []
    for (restart, group), ranks in sorted(by_group.items()):
        seq = max(enqueued for enqueued, _ in ranks.values())
        waiting = sorted(r for r, (enqueued, _) in ranks.items() if enqueued == seq)
        stuck = [r for r in waiting if _below(ranks[r][1].last_completed, seq) or (restart, group, seq) in names]
        behind = sorted(r for r, (enqueued, _) in ranks.items() if enqueued < seq)
        if len(ranks) < 2 or not behind or not stuck:
            continue
        out.append(Missing(restart, group, seq, names.get((restart, group, seq), ""), behind, waiting))
    return out


def _below(completed: int | None, seq: int) -> bool:
    return completed is None or completed < seq


# ---- the machine-readable summary ---------------------------------------------------------------------------


def _iso(ns: int) -> str | None:
    if not ns:
        return None
    moment = datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def summary(jobs: list[Job], problems: dict[str, int] | None = None) -> dict[str, object]:
    """What ``torchelastic-otel report --json`` prints: per run its outcome, attempts, root causes, restarts,
    stragglers, steps (with each rank's ``phases``: median seconds per step), stalls, missing ranks, ``goodput``
    (``ratio`` and ``seconds`` by cause, the mean over ranks; ``goodput_attempts`` the same per attempt), the
    ``verdict`` (``goodput``) and the memory that creeps, with a CUDA device's forecast (``memory_creep``:
    ``memory.creep_json``); a root cause's ``cuda_memory`` holds a CUDA OOM's figures (``memory.cuda_memory_json``);
    ``groups``: the deviating nodes grouped by what happened to them (``groups.Group.as_json``)."""
    return {"runs": [_run_summary(job) for job in jobs], "skipped": dict(problems or {})}


def _run_summary(job: Job) -> dict[str, object]:
    studied = study(job)
    training, found = studied.training, studied.assessment
    gp = found.goodput
    counts = hosts_mod.counts(job)
    # one root cause per restart count, not one per agent
    causes = [_cause_json(a.restart, a.root_cause) for a in hosts_mod.failed_attempts(job) if a.root_cause is not None]
    return {
        "run_id": job.run_id,
        "outcome": job.outcome,
        "start": _iso(job.start),
        "seconds": round((job.end - job.start) / 1e9, 3),
        "ranks": job.ranks,
        "attempts": len({a.restart for a in job.attempts}),  # an attempt of a job on several nodes: one per agent
        "agents": len(job.agents),
        "nodes": counts.nodes,  # hosts.counts: the terminal and HTML state the same counts
        "failures": counts.failures,
        "hosts": hosts_mod.summarize(hosts_mod.node_hosts(job)),
        "root_cause": causes[-1] if causes else None,
        "root_causes": causes,
        "restarts": [
            {"restart": r.restart, "reason": r.reason or None, "time": _iso(r.time), "host": r.host}
            for r in job.restarts
        ],
        "stragglers": [_rank_json(r) for r in training.stragglers],
        "steps": [_rank_json(r) for r in training.ranks],
        "stalls": [_stall_json(s) for s in training.stalls],
        "missing_ranks": [_missing_json(m) for m in training.missing],
        "goodput": {"ratio": gp.ratio, "seconds": _seconds(gp.seconds)},
        "goodput_attempts": [
            {"attempt": restart, "ratio": gp.attempt_ratio(restart), "seconds": _seconds(seconds)}
            for restart, seconds in gp.attempts.items()
        ],
        "verdict": {"verdict": found.verdict.verdict, "reason": found.verdict.reason, "steps": found.verdict.steps},
        "memory_creep": memory_mod.creep_json(found.creep),  # the verdict's memory-creep, each with its forecast
        # the deviating nodes grouped by what happened to them, the root cause's group first (groups.Group.as_json)
        "groups": [g.as_json() for g in groups_mod.of(nodes_mod.overview(job, training))],
    }


# The objects of the JSON, one function each: their keys are the output's format (a schema, alike by nature).


def _cause_json(restart: int, cause: RootCause) -> dict[str, object]:
    return {
        "attempt": restart,
        "rank": cause.rank,
        "local_rank": cause.local_rank,
        "host": cause.host,
        "exit_code": cause.exit_code,
        "signal": cause.signal or None,
        "exception_type": cause.exc_type or None,
        "exception_message": cause.exc_message or None,
        "consequences": cause.consequences,
        "headline": cause.headline,
        "cuda_memory": memory_mod.cuda_memory_json(cause.cuda_memory),
    }


def _stall_json(s: Stall) -> dict[str, object]:
    return {
        "rank": s.rank,
        "restart": s.restart,
        "host": s.host,
        "since": _iso(s.since),
        "seconds": _round(s.seconds, 3),
        "records": s.records,
        "stack_top": s.stack_top,
        "code": s.code,
    }


def _missing_json(m: Missing) -> dict[str, object]:
    return {
        "process_group": m.process_group,
        "seq": m.seq,
        "collective": m.collective or None,
        "ranks": m.ranks,
        "waiting": m.waiting,
        "restart": m.restart,
        "text": m.sentence,
    }


def _rank_json(r: RankSteps) -> dict[str, object]:
    return {
        "rank": r.rank,
        "ratio": _round(r.ratio, 3),
        "restart": r.restart,
        "host": r.host,
        "arrival_seconds": _round(r.arrival),
        "step_seconds": _round(r.step),
        "steps": r.steps,
        "phases": {phase: _round(r.phases.get(phase), 6) for phase in goodput_mod.PHASES},
        "clock": r.clock,
        "gpu_idle": r.gpu_idle,  # goodput.fraction: rounded as every share
    }


def ms(seconds: float | None) -> str:
    """``12.5 ms``, as the tables and the verdict show seconds ("" for none)."""
    return "" if seconds is None else f"{seconds * 1000:,.1f} ms"


def _seconds(by_cause: dict[str, float]) -> dict[str, float]:
    return {cause: round(by_cause.get(cause, 0.0), 3) for cause in goodput_mod.CAUSES}
