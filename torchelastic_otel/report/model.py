"""A torchrun job as the report tells it, built from the records of its processes.

Per run id: the agents (one per node), each agent's attempts (one per restart count), each rank's worker in each
attempt with how it ended, the failures the agent saw, the root cause of each failed attempt, the restarts, and the
metric points of every process.

Only what the files hold is used, and every piece has a fallback, so a report also comes out of partial data (no
traces, no worker telemetry, files of a job still running):

- root cause: the agent's ``torchelastic.root_cause`` record (or the same attributes on the attempt span) when
  present; otherwise the failed rank that was not stopped by the agent (SIGTERM) and failed first, by its own
  ``torchelastic.worker.exception`` record or else by when the agent saw it (``torchelastic.worker.failure``);
- a worker's run: from its own process (``torchelastic.worker.start`` span, first and last record) and from the
  agent's records about it (status START, failure), ending when the agent saw it fail or its attempt ended;
- attempts: the agent's ``torchelastic.attempt`` spans, else one per restart count seen in the workers.
"""

from __future__ import annotations

import collections
import operator
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from torchelastic_otel import _names as names
from torchelastic_otel.report.records import Attrs, AttrValue, LogRecord, Point, Proc, Span, Telemetry

ROOT_CAUSE_EVENT = names.ROOT_CAUSE
FAILURE_EVENT = names.WORKER_FAILURE
EXCEPTION_EVENT = names.WORKER_EXCEPTION
TERMINATED_EVENT = names.WORKER_TERMINATED
RESTART_EVENT = names.RESTART
IOSTREAM = "log.iostream"
_PROC_OF = operator.attrgetter("proc")
MAX_OUTPUT_LINES = 40  # per worker: the last lines of its stdout/stderr kept for the report


def as_int(raw: AttrValue) -> int | None:
    """An integer from an attribute (the bridge writes some ints as strings); ``None`` when it is none."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def as_str(raw: AttrValue) -> str:
    return "" if raw is None or raw == "<NONE>" else str(raw)


@dataclass
class Failure:
    """A worker the agent saw fail (``torchelastic.worker.failure``), or a root-cause record's worker."""

    rank: int | None
    local_rank: int | None
    restart: int
    time: int
    exit_code: int | None = None
    signal: str = ""
    exc_type: str = ""
    exc_message: str = ""
    stacktrace: str = ""
    host: str = ""
    pid: int | None = None

    @property
    def stopped_by_agent(self) -> bool:
        """Ended by the agent's SIGTERM when it stopped the group: a consequence, not a cause."""
        return self.signal == "SIGTERM" or self.exit_code == -15

    @property
    def how(self) -> str:
        if self.signal:
            return f"was killed by {self.signal}"
        if self.exit_code is not None:
            return f"exited with code {self.exit_code}"
        return "failed"


@dataclass
class CudaMemory:
    """A CUDA out-of-memory error's figures for its device, as the rank recorded them when it died (bytes; ``None``
    where not recorded). ``invalid``: values the record held that were no size (left out)."""

    device: int
    allocated: int | None = None
    reserved: int | None = None
    peak: int | None = None  # torch.cuda.max_memory_allocated
    total: int | None = None  # the device's memory
    invalid: int = 0


_CUDA_MEMORY_FIELDS = ("device", "allocated", "reserved", "peak", "total")
_MAX_BYTES = 1 << 62


def cuda_memory_of(attrs: Attrs, keys: tuple[str, str, str, str, str]) -> CudaMemory | None:
    """The ``CudaMemory`` in ``attrs`` under ``keys`` (device, allocated, reserved, peak, total); ``None`` without
    a device. A value that is no non-negative integer is left out and counted in ``invalid``."""
    values: dict[str, int | None] = {}
    invalid = 0
    for name, key in zip(_CUDA_MEMORY_FIELDS, keys, strict=True):
        raw = attrs.get(key)
        number = _size(raw)
        if raw is not None and number is None:
            invalid += 1
        values[name] = number
    device = values.pop("device")
    if device is None:
        return None
    return CudaMemory(device, invalid=invalid, **values)


def _size(raw: AttrValue) -> int | None:
    """A non-negative integer (as written: an int, a whole float, a decimal string); ``None`` otherwise."""
    if isinstance(raw, bool) or raw is None:
        return None
    if isinstance(raw, float):
        raw = int(raw) if raw.is_integer() else None
    number = as_int(raw) if isinstance(raw, (int, str)) else None
    return number if number is not None and 0 <= number <= _MAX_BYTES else None


_WORKER_CUDA_KEYS = (
    names.CUDA_MEMORY_DEVICE,
    names.CUDA_MEMORY_ALLOCATED,
    names.CUDA_MEMORY_RESERVED,
    names.CUDA_MEMORY_PEAK,
    names.CUDA_MEMORY_TOTAL,
)
_ROOT_CAUSE_CUDA_KEYS = (
    names.ROOT_CAUSE_CUDA_DEVICE,
    names.ROOT_CAUSE_CUDA_ALLOCATED,
    names.ROOT_CAUSE_CUDA_RESERVED,
    names.ROOT_CAUSE_CUDA_PEAK,
    names.ROOT_CAUSE_CUDA_TOTAL,
)


@dataclass
class RootCause(Failure):
    consequences: list[int] = field(default_factory=list)
    source: str = "derived"  # "record": the agent's torchelastic.root_cause; "derived": chosen from the failures
    output: list[str] = field(default_factory=list)
    cuda_memory: CudaMemory | None = None  # a CUDA OOM's figures (the root-cause record's, else the rank's own)

    @property
    def headline(self) -> str:
        where = ", ".join(
            part
            for part in (
                f"local rank {self.local_rank}" if self.local_rank is not None else "",
                f"pid {self.pid}" if self.pid is not None else "",
                f"host {self.host}" if self.host else "",
            )
            if part
        )
        exc = f": {self.exc_type}: {self.exc_message}" if self.exc_type else ""
        return f"rank {self.rank}{f' ({where})' if where else ''} {self.how}{exc}"


@dataclass
class WorkerRun:
    """One rank's worker process in one attempt."""

    rank: int | None
    restart: int
    host: str = ""
    local_rank: int | None = None
    pid: int | None = None
    proc: Proc | None = None
    start: int = 0
    end: int = 0
    state: str = "unknown"  # succeeded | failed | terminated | stopped | running | unknown
    exit_code: int | None = None
    signal: str = ""
    exception: str = ""
    stacktrace: str = ""
    stack: str = ""
    root_cause: bool = False
    failed_at: int = 0  # when it raised (its own exception record)
    cuda_memory: CudaMemory | None = None  # its exception record's, for a CUDA OOM
    spans: list[Span] = field(default_factory=list)
    output: list[LogRecord] = field(default_factory=list)
    first_seen: int = 0
    last_seen: int = 0
    parent_span: str = ""


@dataclass
class Attempt:
    restart: int
    start: int
    end: int
    failed: bool = False
    ended: bool = True
    status: str = ""
    host: str = ""
    span_id: str = ""
    rendezvous: list[tuple[int, int]] = field(default_factory=list)
    workers: list[WorkerRun] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    root_cause: RootCause | None = None


@dataclass
class Restart:
    time: int
    restart: int | None
    reason: str
    host: str


@dataclass
class Agent:
    host: str
    proc: Proc | None
    attempts: list[Attempt] = field(default_factory=list)
    run_state: str = ""
    start: int = 0
    end: int = 0


_Named = TypeVar("_Named", Point, LogRecord)


class _ByName(Generic[_Named]):
    """Records by their ``name``, indexed on first use and again if records were added: each look-up was a pass
    over every record of the run, millions on a large run."""

    def __init__(self) -> None:
        self._index: dict[str, list[_Named]] = {}
        self._indexed = -1

    def get(self, records: list[_Named], name: str) -> list[_Named]:
        if self._indexed != len(records):
            index: dict[str, list[_Named]] = collections.defaultdict(list)
            for record in records:
                index[record.name].append(record)
            self._index, self._indexed = index, len(records)
        return self._index.get(name, [])


@dataclass
class Job:
    run_id: str | None
    spans: list[Span]
    logs: list[LogRecord]
    points: list[Point]
    agents: list[Agent] = field(default_factory=list)
    restarts: list[Restart] = field(default_factory=list)
    outcome: str = "UNKNOWN"  # SUCCEEDED | FAILED | UNFINISHED | UNKNOWN
    start: int = 0
    end: int = 0
    _points_by_name: _ByName[Point] = field(default_factory=_ByName, repr=False, compare=False)
    _logs_by_name: _ByName[LogRecord] = field(default_factory=_ByName, repr=False, compare=False)

    def named(self, name: str) -> list[Point]:
        """The points of metric ``name``, in order: the views ask for a few names among millions of points."""
        return self._points_by_name.get(self.points, name)

    def logs_named(self, name: str) -> list[LogRecord]:
        """The log records named ``name`` (``LogRecord.name``), in order: the model and the views look for a few
        events (failures, verdicts, restarts, stalls) among every output line of the run."""
        return self._logs_by_name.get(self.logs, name)

    def point_procs(self) -> list[Proc]:
        """Every process that wrote a point, once each, in the order of their first point."""
        return list(dict.fromkeys(map(_PROC_OF, self.points)))  # at C speed: a large run has millions of points

    @property
    def attempts(self) -> list[Attempt]:
        return [a for agent in self.agents for a in agent.attempts]

    @property
    def workers(self) -> list[WorkerRun]:
        return [w for a in self.attempts for w in a.workers]

    @property
    def ranks(self) -> list[int]:
        return sorted({w.rank for w in self.workers if w.rank is not None})

    @property
    def root_causes(self) -> list[RootCause]:
        return [a.root_cause for a in self.attempts if a.root_cause is not None]

    @property
    def restart_count(self) -> int:
        return max([a.restart for a in self.attempts], default=0)


# ---- grouping the records by run ---------------------------------------------------------------------------


def _run_of(proc: Proc, attrs: Attrs) -> str | None:
    """The record's own run id before its resource's: a process that launched several runs (``run.main`` called
    again) may hold records of a later run on an earlier run's resource."""
    return _run(attrs.get(names.RUN_ID), proc.run_id)


def _run(own: AttrValue, resource: str | None) -> str | None:
    """A record's run id from its own attribute and its resource's (``_run_of``)."""
    run = own or resource
    return None if run is None else str(run)


def split_runs(tel: Telemetry) -> list[Job]:
    """One ``Job`` per run id; records without one join the run of their trace, or the only run there is."""
    if not (tel.spans or tel.logs or tel.points):
        return []
    runs = _run_ids(tel)
    if len(runs) <= 1:  # one run (most files): every record is its; no record-by-record sorting, no copy
        return [Job(next(iter(runs), None), tel.spans, tel.logs, tel.points)]
    return _split_runs(tel)


def _run_ids(tel: Telemetry) -> set[str]:
    """Every run id the records name (a span's when it has one, a log record's or a point's when not empty; those
    ``_split_runs`` counts are among them), from the distinct pairs of a record's own run id and its resource's: a
    few, where the records are millions. One or none: every record is that run's."""
    spans = {_run(own, resource) for own, resource in {(s.attrs.get(names.RUN_ID), s.proc.run_id) for s in tel.spans}}
    logs = {_run(own, resource) for own, resource in {(r.attrs.get(names.RUN_ID), r.proc.run_id) for r in tel.logs}}
    runs = {run for run in spans if run is not None} | {run for run in logs if run}
    return runs | {p.run_id for p in {p.proc for p in tel.points} if p.run_id}


def _split_runs(tel: Telemetry) -> list[Job]:
    by_trace: dict[str, str] = {}
    for span in tel.spans:
        run = _run_of(span.proc, span.attrs)
        if run is not None:
            by_trace.setdefault(span.trace_id, run)
    runs = {r for r in by_trace.values()} | {p.proc.run_id for p in tel.points if p.proc.run_id}
    runs |= {r for r in (_run_of(rec.proc, rec.attrs) for rec in tel.logs) if r}
    only = next(iter(runs)) if len(runs) == 1 else None
    jobs: dict[str | None, Job] = {}

    def job(run: str | None) -> Job:
        if run not in jobs:
            jobs[run] = Job(run, [], [], [])
        return jobs[run]

    for span in tel.spans:
        job(_run_of(span.proc, span.attrs) or by_trace.get(span.trace_id) or only).spans.append(span)
    for rec in tel.logs:
        job(_run_of(rec.proc, rec.attrs) or by_trace.get(rec.trace_id) or only).logs.append(rec)
    for point in tel.points:
        job(point.proc.run_id or only).points.append(point)
    return sorted(jobs.values(), key=lambda j: (j.run_id is None, _first_time(j)))


def _first_time(job: Job) -> int:
    times = [s.start for s in job.spans if s.start] + [r.time for r in job.logs if r.time]
    return min(times, default=0)


# ---- building one job ---------------------------------------------------------------------------------------


def build(tel: Telemetry) -> list[Job]:
    """Every run in ``tel``, built."""
    jobs = split_runs(tel)
    for job in jobs:
        _build_job(job)
    return jobs


def _build_job(job: Job) -> None:
    times = [t for s in job.spans for t in (s.start, s.end) if t] + [r.time for r in job.logs if r.time]
    times += [p.time for p in job.points if p.time]
    job.start, job.end = (min(times), max(times)) if times else (0, 0)
    job.agents = _agents(job)
    _attach_workers(job)
    verdicts = _Verdicts(job)
    alive = _last_points(job) if not all(a.ended for a in job.attempts) else {}
    for attempt in job.attempts:
        _finish_attempt(job, attempt, verdicts, alive)
    _consequences(job)
    job.restarts = _restarts(job)
    job.outcome = _outcome(job)


def _agent_procs(job: Job) -> list[Proc]:
    procs = {s.proc for s in job.spans if s.name in (names.RUN, names.ATTEMPT)}
    procs |= {r.proc for r in job.logs if r.proc.kind == "agent"}
    procs |= {s.proc for s in job.spans if s.proc.kind == "agent"}
    return sorted(procs, key=lambda p: (p.host, p.pid or 0))


def _agents(job: Job) -> list[Agent]:
    agents = []
    by_proc: dict[Proc, list[Span]] = collections.defaultdict(list)
    for span in job.spans:
        by_proc[span.proc].append(span)
    for proc in _agent_procs(job):
        spans = by_proc[proc]
        agent = Agent(proc.host, proc)
        for run in (s for s in spans if s.name == names.RUN):
            agent.run_state = as_str(run.attrs.get(names.RUN_STATE)) or agent.run_state
        attempts = sorted((s for s in spans if s.name == names.ATTEMPT), key=lambda s: s.start)
        agent.attempts = [_attempt(s, spans) for s in attempts]
        times = [t for s in spans for t in (s.start, s.end)]
        agent.start, agent.end = (min(times), max(times)) if times else (job.start, job.end)
        agents.append(agent)
    if not any(a.attempts for a in agents):
        agents = [Agent(_only_host(job), agents[0].proc if agents else None, _attempts_from_workers(job))]
    return agents


def _only_host(job: Job) -> str:
    hosts = {s.proc.host for s in job.spans} | {r.proc.host for r in job.logs}
    return hosts.pop() if len(hosts) == 1 else ""


def _attempt(span: Span, agent_spans: list[Span]) -> Attempt:
    attempt = Attempt(
        restart=as_int(span.attrs.get(names.RESTART_COUNT)) or 0,
        start=span.start,
        end=span.end,
        failed=span.failed,
        status=span.status_message,
        host=span.proc.host,
        span_id=span.span_id,
    )
    attempt.rendezvous = [
        (s.start, s.end) for s in agent_spans if s.parent_id == span.span_id and s.name == names.RENDEZVOUS
    ]
    return attempt


def _attempts_from_workers(job: Job) -> list[Attempt]:
    """Without the agent's spans: one attempt per restart count the workers (or the agent's records) tell."""
    restarts: dict[int, list[int]] = collections.defaultdict(list)
    for proc, time in [(s.proc, s.start) for s in job.spans] + [(r.proc, r.time) for r in job.logs]:
        if proc.kind == "worker" and proc.restart is not None:
            restarts[proc.restart].append(time)
    for rec in job.logs_named(FAILURE_EVENT):
        restarts[as_int(rec.attrs.get(names.RESTART_COUNT)) or 0].append(rec.time)
    return [Attempt(restart=r, start=min(ts), end=max(ts), ended=False) for r, ts in sorted(restarts.items())] or [
        Attempt(restart=0, start=job.start, end=job.end, ended=False)
    ]


# ---- workers --------------------------------------------------------------------------------------------------


_RunKey = tuple[str, int, "int | None"]


class _Runs(dict[_RunKey, WorkerRun]):
    """The worker runs by (host, restart, rank), with an index by (restart, rank): a record that names its worker
    only by rank and restart (the agent's, whose host name may differ) finds it without a scan of every run."""

    def __init__(self) -> None:
        super().__init__()
        self._by_rank: dict[tuple[int, int | None], _RunKey] = {}

    def add(self, key: _RunKey, run: WorkerRun) -> WorkerRun:
        """``setdefault`` that keeps the index (the first run of a (restart, rank) is the one found by it)."""
        found = self.setdefault(key, run)
        self._by_rank.setdefault(key[1:], key)
        return found

    def key_for_rank(self, host: str, restart: int, rank: int | None) -> _RunKey:
        """The first run's key with this restart and rank (whatever its host), else (host, restart, rank)."""
        return self._by_rank.get((restart, rank), (host, restart, rank))

    def key_for(self, host: str, restart: int, rank: int | None) -> _RunKey:
        """(host, restart, rank) when known, else the first run's key with this restart and rank, else new."""
        key = (host, restart, rank)
        return key if key in self else self._by_rank.get((restart, rank), key)


class _Attempts:
    """The job's attempts by span id and by (restart, host), so that finding a worker's attempt is one look-up."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.by_span: dict[str, Attempt] = {}
        self.by_restart: dict[int, list[Attempt]] = collections.defaultdict(list)
        self.by_host: dict[tuple[int, str], Attempt] = {}
        for attempt in job.attempts:
            self._index(attempt)

    def _index(self, attempt: Attempt) -> None:
        if attempt.span_id:
            self.by_span.setdefault(attempt.span_id, attempt)
        self.by_restart[attempt.restart].append(attempt)
        self.by_host.setdefault((attempt.restart, attempt.host), attempt)

    def of(self, run: WorkerRun) -> Attempt:
        """The worker's attempt: the one its start span hangs under, else its node's of its restart, else the first
        of its restart; else a new one (no attempt of that restart is known)."""
        if run.parent_span and run.parent_span in self.by_span:
            return self.by_span[run.parent_span]
        same = self.by_restart.get(run.restart)
        if same:
            return self.by_host.get((run.restart, run.host), same[0])
        job = self.job
        attempt = Attempt(
            restart=run.restart, start=run.first_seen or job.start, end=run.last_seen or job.end, ended=False
        )
        job.agents[0].attempts.append(attempt)
        job.agents[0].attempts.sort(key=lambda a: a.restart)
        self._index(attempt)
        return attempt


def _attach_workers(job: Job) -> None:
    runs = _Runs()
    by_proc: dict[Proc, WorkerRun] = {}  # every resource a worker's records came with (its output may have its own)
    for proc in {r.proc for r in job.logs} | {s.proc for s in job.spans} | {p.proc for p in job.points}:
        if proc.kind == "worker":
            key = (proc.host, proc.restart or 0, proc.rank)
            run = runs.add(key, WorkerRun(proc.rank, key[1], proc.host, proc.local_rank, proc.pid, proc))
            by_proc[proc] = run
    _worker_records(job, runs, by_proc)
    attempts = _Attempts(job)
    for failure in _failures(job):
        key = runs.key_for(failure.host, failure.restart, failure.rank)  # the agent's host name may differ
        run = runs.add(key, WorkerRun(failure.rank, failure.restart, failure.host, failure.local_rank))
        _apply_failure(run, failure)
        attempts.of(run).failures.append(failure)
    for run in sorted(runs.values(), key=lambda w: (w.restart, w.rank if w.rank is not None else -1)):
        attempt = attempts.of(run)
        attempt.workers.append(run)


def _worker_records(job: Job, runs: _Runs, by_proc: dict[Proc, WorkerRun]) -> None:
    """What each worker process recorded itself: its spans, exception, SIGTERM stack, output lines, time span."""
    for span in job.spans:
        run = by_proc.get(span.proc) or _delivered_by_agent(span, runs)
        if run is None:
            continue
        start, end = span.start, span.end
        if start:  # when the rank was first and last seen: once per span of every rank
            run.first_seen = min(run.first_seen or start, start)
        if end > run.last_seen:
            run.last_seen = end
        if span.name == names.WORKER_START:
            run.start = span.start if not run.start else min(run.start, span.start)
            run.parent_span = span.parent_id
            if span.proc.kind == "worker":
                run.proc, run.pid = span.proc, span.proc.pid  # the worker's own process
            else:  # sent by its agent
                run.pid = run.pid or as_int(span.attrs.get(names.WORKER_PID))
        else:
            run.spans.append(span)
    for rec in job.logs:
        run = by_proc.get(rec.proc) or _delivered_by_agent(rec, runs)
        if run is None:
            _agent_status(rec, runs)
            continue
        time = rec.time
        if time:  # the same, once per record of every rank
            run.first_seen = min(run.first_seen or time, time)
            if time > run.last_seen:
                run.last_seen = time
        name = rec.name
        if name == EXCEPTION_EVENT:
            run.exception = _exc_line(rec.attrs)
            run.stacktrace = as_str(rec.attrs.get("exception.stacktrace"))
            run.state = "failed"
            run.failed_at = rec.time
            run.cuda_memory = cuda_memory_of(rec.attrs, _WORKER_CUDA_KEYS)
        elif name == TERMINATED_EVENT:
            run.stack = as_str(rec.attrs.get(names.STACK))
            run.state = "terminated"
        if is_output(rec):
            run.output.append(rec)
    for run in runs.values():
        run.output = sorted(run.output, key=lambda r: r.time)[-MAX_OUTPUT_LINES:]


def _delivered_by_agent(rec: LogRecord | Span, runs: _Runs) -> WorkerRun | None:
    """A worker's final record (or start span) its agent sent for it (``torchelastic.delivered_by``): it comes with
    the agent's resource, and names its worker by rank and restart in its attributes."""
    if rec.attrs.get(names.DELIVERED_BY) != "agent":
        return None
    rank = as_int(rec.attrs.get(names.GLOBAL_RANK))
    if rank is None:
        return None
    restart = as_int(rec.attrs.get(names.RESTART_COUNT)) or 0
    key = runs.key_for_rank(rec.proc.host, restart, rank)
    return runs.add(key, WorkerRun(rank, restart, rec.proc.host, as_int(rec.attrs.get(names.LOCAL_RANK))))


def _agent_status(rec: LogRecord, runs: _Runs) -> None:
    """The agent's worker status events (START, SUCCEEDED, FAILED) name workers even without their own telemetry."""
    if not rec.name.startswith(names.WORKER_STATUS_PREFIX) or rec.attrs.get(names.SOURCE) != "WORKER":
        return
    rank = as_int(rec.attrs.get(names.GLOBAL_RANK))
    restart = as_int(rec.attrs.get(names.AGENT_RESTARTS)) or 0
    if rank is None:
        return
    key = runs.key_for_rank(rec.proc.host, restart, rank)
    local_rank = as_int(rec.attrs.get(names.METADATA_LOCAL_RANK))
    run = runs.add(key, WorkerRun(rank, restart, rec.proc.host, local_rank))
    run.pid = run.pid or as_int(rec.attrs.get(names.WORKER_ID))
    if rec.name.endswith(".SUCCEEDED") and run.state == "unknown":
        run.state = "succeeded"


def _exc_line(attrs: Attrs) -> str:
    kind, message = as_str(attrs.get("exception.type")), as_str(attrs.get("exception.message"))
    return f"{kind}: {message}" if kind and message else kind or message


def _failures(job: Job) -> list[Failure]:
    """The agent's ``torchelastic.worker.failure`` records (or, without logs, the span events of the same name)."""
    records = [(r.time, r.attrs, r.proc) for r in job.logs_named(FAILURE_EVENT)]
    if not records:
        records = [(e.time, e.attrs, s.proc) for s in job.spans for e in s.events if e.name == FAILURE_EVENT]
    return [_failure(time, attrs, proc.host) for time, attrs, proc in records]


def _failure(time: int, attrs: Attrs, host: str) -> Failure:
    return Failure(
        rank=as_int(attrs.get(names.GLOBAL_RANK)),
        local_rank=as_int(attrs.get(names.LOCAL_RANK)),
        restart=as_int(attrs.get(names.RESTART_COUNT)) or 0,
        time=time,
        exit_code=as_int(attrs.get(names.EXIT_CODE)),
        signal=as_str(attrs.get(names.SIGNAL)),
        exc_type=as_str(attrs.get("exception.type")),
        exc_message=as_str(attrs.get("exception.message")),
        stacktrace=as_str(attrs.get("exception.stacktrace")),
        host=host,
        pid=as_int(attrs.get(names.WORKER_PID)),
    )


def _apply_failure(run: WorkerRun, failure: Failure) -> None:
    run.exit_code, run.signal = failure.exit_code, failure.signal
    run.pid = failure.pid or run.pid  # the agent knows its worker's pid
    run.state = "terminated" if failure.stopped_by_agent else "failed"
    run.end = failure.time
    if not run.exception and failure.exc_type:
        run.exception = f"{failure.exc_type}: {failure.exc_message}"
        run.stacktrace = failure.stacktrace


# ---- attempts: times, states, root cause ----------------------------------------------------------------------


def _last_points(job: Job) -> dict[Proc, int]:
    """Each worker process's last metric point's time: a worker still running whose spans and records say little
    (no output, no spans of its own) still exports its metrics, so it ran at least until then."""
    last: dict[Proc, int] = {}
    for point in job.points:
        proc = point.proc
        if proc.kind == "worker" and point.time > last.get(proc, 0):
            last[proc] = point.time
    return last


def _finish_attempt(job: Job, attempt: Attempt, verdicts: _Verdicts, alive: dict[Proc, int]) -> None:
    for run in attempt.workers:
        run.start = run.start or run.first_seen or attempt.start
        if run.state in ("failed", "terminated") and run.end:
            pass
        elif attempt.ended and attempt.end:
            run.end = attempt.end
            if run.state == "unknown":
                run.state = "stopped" if attempt.failed else "succeeded"
        else:
            run.end = max(run.last_seen, alive.get(run.proc, 0) if run.proc is not None else 0, run.start)
            if run.state == "unknown":
                run.state = "running"
        run.end = max(run.end, run.start)
    attempt.failed = attempt.failed or any(w.state == "failed" for w in attempt.workers)
    if not attempt.ended and attempt.workers and all(w.state in _FINAL for w in attempt.workers):
        attempt.ended = True  # no attempt span (no traces), but every worker's end is known
    attempt.root_cause = verdicts.of(attempt) or _derived_root_cause(attempt)
    if attempt.root_cause is not None:
        cause = attempt.root_cause
        for run in attempt.workers:
            if run.rank == cause.rank:
                run.root_cause = True
                if not cause.stacktrace:
                    cause.stacktrace = run.stacktrace
                if cause.cuda_memory is None:
                    cause.cuda_memory = run.cuda_memory
                cause.output = output_lines(run, cause.stacktrace)


def is_output(rec: LogRecord) -> bool:
    """Whether ``rec`` is one of a process's output lines (``log.iostream``) or a ``logging`` record: what a worker's
    output shows (``WorkerRun.output``), not an event."""
    return IOSTREAM in rec.attrs or _is_logging(rec)


def _is_logging(rec: LogRecord) -> bool:
    """A worker's Python ``logging`` record (OpenTelemetry's handler gives it ``code.*``; events have a name): the
    line a console handler printed is this record, not an output line (``worker.log_records``)."""
    return not rec.event_name and "code.function.name" in rec.attrs


def output_lines(run: WorkerRun, stacktrace: str = "") -> list[str]:
    """The worker's last output lines (``[stdout] ...``), less those repeating its traceback, shown beside it."""
    shown = set(line.strip() for line in (stacktrace or run.stacktrace).splitlines())
    lines = []
    for rec in run.output:
        text = str(rec.body)
        bare = text.split("]: ", 1)[1] if text.startswith("[rank") and "]: " in text else text  # torchrun's prefix
        if bare.strip() and bare.strip() not in shown:
            lines.append(f"[{rec.attrs.get(IOSTREAM) or rec.severity_text or 'log'}] {text}")
    return lines


_RC = names.ROOT_CAUSE_PREFIX
_FINAL = ("succeeded", "failed", "terminated")


class _Verdicts:
    """The agents' own verdicts, gathered once per job: ``torchelastic.root_cause`` records by restart count and
    spans carrying the root-cause attributes by span id (looking them up per attempt would scan every record).

    On several nodes each agent whose workers failed records its own verdict; the attempt's is the one that failed
    first (by the time the record names), this agent's own on a tie, so that every agent's attempt tells the same
    first failure."""

    def __init__(self, job: Job) -> None:
        self.records: dict[int, list[LogRecord]] = collections.defaultdict(list)
        for rec in job.logs_named(ROOT_CAUSE_EVENT):
            self.records[as_int(rec.attrs.get(names.RESTART_COUNT)) or 0].append(rec)
        self.spans: dict[str, Span] = {}
        for span in job.spans:
            if _RC + "rank" in span.attrs:
                self.spans.setdefault(span.span_id, span)

    def of(self, attempt: Attempt) -> RootCause | None:
        """The agents' verdict on ``attempt``: a ``torchelastic.root_cause`` record, or the root-cause attributes on
        the attempt span."""
        records = self.records.get(attempt.restart)
        if records:
            rec = records[0] if len(records) == 1 else min(records, key=lambda r: _verdict_order(r, attempt.host))
            return _from_root_cause_attrs(rec.attrs, attempt, rec.time, rec.proc.host)
        span = self.spans.get(attempt.span_id)
        if span is not None:
            return _from_root_cause_attrs(span.attrs, attempt, span.end, span.proc.host)
        return None


def _verdict_order(rec: LogRecord, host: str) -> tuple[int, bool]:
    return (as_int(rec.attrs.get(_RC + "time_unix_nano")) or rec.time, rec.proc.host != host)


def _from_root_cause_attrs(attrs: Attrs, attempt: Attempt, time: int, host: str) -> RootCause:
    consequences = attrs.get(_RC + "consequences") or []
    return RootCause(
        rank=as_int(attrs.get(_RC + "rank")),
        local_rank=as_int(attrs.get(_RC + "local_rank")),
        restart=attempt.restart,
        time=as_int(attrs.get(_RC + "time_unix_nano")) or time,
        exit_code=as_int(attrs.get("process.exit.code")),
        signal=as_str(attrs.get(_RC + "signal")),
        exc_type=as_str(attrs.get("exception.type")),
        exc_message=as_str(attrs.get("exception.message")),
        stacktrace=as_str(attrs.get("exception.stacktrace")),
        host=as_str(attrs.get("host.name")) or host,
        pid=as_int(attrs.get("process.pid")),
        consequences=[r for r in (as_int(c) for c in _as_list(consequences)) if r is not None],
        source="record",
        cuda_memory=cuda_memory_of(attrs, _ROOT_CAUSE_CUDA_KEYS),
    )


def _as_list(raw: AttrValue) -> list[AttrValue]:
    return list(raw) if isinstance(raw, (list, tuple)) else [raw]


def _derived_root_cause(attempt: Attempt) -> RootCause | None:
    """The failed rank the agent did not stop itself that failed first (by its exception, else by detection)."""
    if not attempt.failures:
        return None
    runs = {w.rank: w for w in attempt.workers}

    def when(f: Failure) -> tuple[bool, int, int]:
        run = runs.get(f.rank)
        own = run.failed_at if run is not None and run.failed_at else f.time
        return (f.stopped_by_agent, own, f.rank if f.rank is not None else 1 << 30)

    first = min(attempt.failures, key=when)
    run = runs.get(first.rank)
    exc_type, _, exc_message = (run.exception if run is not None else "").partition(": ")
    return RootCause(
        rank=first.rank,
        local_rank=first.local_rank,
        restart=attempt.restart,
        time=when(first)[1],
        exit_code=first.exit_code,
        signal=first.signal,
        exc_type=first.exc_type or exc_type,
        exc_message=first.exc_message or exc_message,
        stacktrace=first.stacktrace or (run.stacktrace if run is not None else ""),
        host=first.host,
        pid=first.pid,
        consequences=sorted({f.rank for f in attempt.failures if f.rank is not None and f.rank != first.rank}),
    )


def _consequences(job: Job) -> None:
    """Every rank of a failed attempt that failed or was stopped after its root cause, on every node: an agent's
    verdict names only its own workers (``torchelastic.root_cause.consequences``), and on many nodes most of the
    ranks that then died (gloo's ``Connection closed by peer``) or that their agents stopped are on the others."""
    ended: dict[int, set[int]] = collections.defaultdict(set)
    for attempt in job.attempts:
        if attempt.failed:
            ended[attempt.restart].update(w.rank for w in attempt.workers if w.rank is not None and w.state in _ENDED)
    # one list for the causes that name the same: the agents of an attempt (a thousand on a large job) each hold
    # the cause of every rank it ended, mostly the same, and each would hold a list of all of them
    made: dict[tuple[int, int | None, frozenset[int]], list[int]] = {}
    for attempt in job.attempts:
        cause = attempt.root_cause
        ranks = ended[attempt.restart]
        if cause is not None and ranks:
            key = (attempt.restart, cause.rank, frozenset(r for r in cause.consequences if r not in ranks))
            same = made.get(key)
            if same is None:
                same = made[key] = sorted((ranks | key[2]) - {cause.rank})
            cause.consequences = same


_ENDED = ("failed", "terminated", "stopped")


def _restarts(job: Job) -> list[Restart]:
    spans = [s for s in job.spans if s.name == RESTART_EVENT]
    if spans:
        items: Iterable[tuple[int, Attrs, Proc]] = [(s.start, s.attrs, s.proc) for s in spans]
    else:
        items = [(r.time, r.attrs, r.proc) for r in job.logs_named(RESTART_EVENT)]
    return sorted(
        (
            Restart(
                time,
                as_int(attrs.get(names.RESTART_COUNT)),
                as_str(attrs.get(names.RESTART_REASON) or attrs.get(names.REASON)),
                proc.host,
            )
            for time, attrs, proc in items
        ),
        key=lambda r: r.time,
    )


def _outcome(job: Job) -> str:
    states = {a.run_state for a in job.agents if a.run_state}
    last = max(job.attempts, key=lambda a: (a.restart, a.start), default=None)
    if "FAILED" in states or (last is not None and last.failed and last.ended):
        return "FAILED"
    if states == {"SUCCEEDED"} or (not states and last is not None and last.ended and not last.failed):
        return "SUCCEEDED"
    if last is not None and not last.ended:
        return "UNFINISHED"
    return states.pop() if len(states) == 1 else "UNKNOWN"
