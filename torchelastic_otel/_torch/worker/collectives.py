"""A rank's collectives, from torch's Flight Recorder: how far it got in each process group, and when it arrived.

torch records every collective of a process group -- also those DDP's reducer issues from C++ -- in its Flight
Recorder (gloo too, since torch 2.x; on by default in torch 2.13, ``TORCH_FR_BUFFER_SIZE`` entries, 2,000). The
bridge reads it from its own thread (``_compat.flight_recorder``), never from the training path:

- every tick (1 s), the status only (no entries: cheap): per process group the sequence number of the last
  collective enqueued, started and completed. The last enqueued becomes gauge ``torchelastic.worker.collective.seq``
  {``process_group``}: a rank whose number stays behind the others' is the rank the others wait for;
- every ``TORCHELASTIC_OTEL_COLLECTIVES_INTERVAL`` seconds, the entries: each step's *arrival* -- the time from the
  start of the step (the end of the one before, ``steps``) to this rank's enqueueing of the step's last collective
  -- becomes histogram ``torchelastic.worker.step.arrival`` (s). A dump of the entries holds the GIL for tens of
  milliseconds (``bench/bench_steps.py``, docs/performance.md), so by default the reads are ``INTERVAL`` apart at
  least, and further apart when a dump takes long: at most ``READ_SHARE`` of the training thread's time.

On a CUDA job whose steps are measured on the GPU's clock (``anatomy``, ``device_clock``), the arrivals are those
of the sampled steps, on the GPU's clock: the host enqueues its collectives ahead of the GPU.

Why arrival, not step time: under synchronous collectives every rank's step takes the same time, the fast ranks
waiting inside a collective for the slow one. When a rank *arrives* differs: a rank slow in its data loading,
forward or backward reaches the step's last collective (DDP's last gradient bucket) later by exactly its delay.
Both ends of the interval are this process's own clock, so ranks on different hosts compare without clock sync
(docs/training.md compares arrival with step time, forward time and enqueue times on a job with one slow rank).

A process group is named by its description (``default_pg``, or what ``new_group(group_desc=...)`` was given),
by its name where it has none (``undefined``).
"""

from __future__ import annotations

import bisect
import collections
import itertools
import logging
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from torchelastic_otel import _compat, _settings
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._torch.worker import anatomy, steps

__all__ = ["Group", "status", "summary", "summary_attributes", "read_entries", "tick", "enabled", "awaiting_read"]

_logger = logging.getLogger("torchelastic_otel")


def _interval() -> float | None:
    return _settings.COLLECTIVES_INTERVAL.get(
        on_invalid=lambda: selftelemetry.count(selftelemetry.SANITIZED, "metrics", "invalid_collectives_interval")
    )


#: Seconds between two reads of the Flight Recorder's entries (the arrival of each step), when set.
CONFIGURED_INTERVAL = _interval()
#: By default: at least every 10 s, and no more often than keeps the reads (they hold the GIL) at 0.1 % of the time.
INTERVAL, READ_SHARE = 10.0, 0.001
#: The recent arrivals the median gauge is taken over.
MEDIAN_OF = 1001
_UNNAMED = ("", "undefined")


@dataclass
class Group:
    """One process group as this rank sees it."""

    name: str  # torch's name of the group ("0"), the same on every rank
    key: str  # how the bridge names it: its description (``default_pg``), else its name
    last_enqueued: int
    last_started: int  # -1: not known (gloo does not say when a collective starts)
    last_completed: int
    pending: str = ""  # the oldest collective enqueued and not completed (``gloo:all_reduce``), if known
    pending_seq: int = -1

    def attributes(self) -> dict[str, object]:
        out: dict[str, object] = {"last_enqueued": self.last_enqueued, "last_completed": self.last_completed}
        if self.last_started >= 0:
            out["last_started"] = self.last_started
        if self.pending:
            out["pending"], out["pending_seq"] = self.pending, self.pending_seq
        return out


class _Names:
    """Process group name -> description, learnt from the entries (the status has names only)."""

    def __init__(self) -> None:
        self.descriptions: dict[str, str] = {}
        self.lock = threading.Lock()

    def learn(self, entries: list[dict[str, object]]) -> None:
        with self.lock:
            for entry in entries:
                group = entry.get("process_group")
                if isinstance(group, (list, tuple)) and len(group) == 2:
                    self.descriptions[str(group[0])] = str(group[1])

    def name_only(self, name: str) -> None:
        with self.lock:
            self.descriptions.setdefault(name, "")

    def key(self, name: str) -> str | None:
        """The bridge's name of group ``name``; ``None`` until an entry told its description."""
        description = self.descriptions.get(name)
        if description is None:
            return None
        if description in _UNNAMED:
            return name
        clashes = [n for n, d in self.descriptions.items() if d == description and n != name]
        return f"{description}#{name}" if clashes else description


_names = _Names()


def enabled() -> bool:
    """Whether this process has a default process group to ask about (``torch.distributed`` initialised)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return False
    try:
        return bool(dist.is_available() and dist.is_initialized())
    except Exception:
        return False


def awaiting_read() -> bool:
    """Whether the steps taken so far will get the Flight Recorder's entries: the default group is up, or its last
    entries were kept when it was destroyed before the pipeline was ready (:func:`keep_before_destroy`)."""
    return enabled() or bool(_arrivals.kept)


def _as_int(raw: Any) -> int:
    try:
        return int(raw)
    except (TypeError, ValueError):
        return -1


def _groups(data: dict[str, object]) -> list[Group]:
    groups: list[Group] = []
    table = data.get("pg_status")
    if not isinstance(table, dict):
        return groups
    for name, row in table.items():
        if not isinstance(row, dict):
            continue
        name = str(name)
        key = _names.key(name)
        groups.append(
            Group(
                name,
                key if key is not None else "",
                _as_int(row.get("last_enqueued_collective")),
                _as_int(row.get("last_started_collective")),
                _as_int(row.get("last_completed_collective")),
            )
        )
    return groups


def status() -> list[Group]:
    """Every process group's last collectives (the Flight Recorder's status, without its entries: cheap)."""
    if not enabled():
        return []
    data = _compat.flight_recorder(include_collectives=False)
    if data is None:
        return []
    groups = _groups(data)
    if any(not g.key for g in groups):
        return read_entries()[0]  # a group not named yet: its entries tell its description (once)
    return groups


def read_entries() -> tuple[list[Group], list[dict[str, object]]]:
    """The status with each group's pending collective, and the entries (oldest first)."""
    if not enabled():
        return [], []
    data = _compat.flight_recorder(include_collectives=True)
    if data is None:
        return [], []
    entries = [e for e in data.get("entries") or () if isinstance(e, dict)]
    _names.learn(entries)
    groups = _groups(data)
    by_name = {g.name: g for g in groups}
    for entry in entries:
        group = entry.get("process_group")
        name = str(group[0]) if isinstance(group, (list, tuple)) and group else None
        target = by_name.get(name) if name is not None else None
        seq = _as_int(entry.get("collective_seq_id"))
        if target is None or seq <= target.last_completed or entry.get("is_p2p"):
            continue
        if target.pending_seq < 0 or seq < target.pending_seq:
            target.pending, target.pending_seq = str(entry.get("profiling_name") or ""), seq
    for group in groups:
        if not group.key:  # no entry of it left in the recorder (another group filled it): its name, from now on
            _names.name_only(group.name)
            group.key = group.name
    return groups, entries


def summary(groups: list[Group] | None = None) -> dict[str, dict[str, object]]:
    """``{group: {last_enqueued, last_started, last_completed, pending, pending_seq}}`` (pending read from the
    entries when one is enqueued and not completed)."""
    if groups is None:
        groups = status()
        if any(g.last_enqueued > g.last_completed for g in groups):
            groups = read_entries()[0]
    return {g.key.replace(".", "_"): g.attributes() for g in groups if g.key}


def summary_attributes() -> dict[str, object]:
    """The summary as event metadata (``collectives`` -> ``torchelastic.collectives.<group>.<field>``); ``{}``
    when there is none. Never raises: it goes on the records of a rank that is being stopped."""
    try:
        found = summary()
    except Exception:
        selftelemetry.count(selftelemetry.DROPPED, "logs", "collectives_summary_error")
        return {}
    return {"collectives": found} if found else {}


# ---- what the tick does: the gauge every second, the arrivals every INTERVAL ------------------------------------


class _Arrivals:
    """Which steps' arrivals were recorded already, and the recent ones (their median)."""

    def __init__(self) -> None:
        self.done_until_ns = 0  # the end of the last step whose arrival was looked for
        self.next_read = time.monotonic() + (CONFIGURED_INTERVAL or INTERVAL)
        self.recent: collections.deque[float] = collections.deque(maxlen=MEDIAN_OF)
        self.kept: list[dict[str, object]] = []  # the entries read before the group was destroyed (for the exit)

    def due(self) -> bool:
        return time.monotonic() >= self.next_read

    def read_took(self, seconds: float) -> None:
        """Schedule the next read: the configured interval, else 10 s or more (``READ_SHARE``)."""
        interval = CONFIGURED_INTERVAL or max(INTERVAL, seconds / READ_SHARE)
        self.next_read = time.monotonic() + interval

    @staticmethod
    def span_s(arrivals: list[float]) -> float:
        """The seconds the steps of ``arrivals`` covered, as far as this rank knows (its recent step ends)."""
        marks = steps.recent_marks()
        if len(marks) < 2:
            return 0.0
        per_step = (marks[-1] - marks[0]) / 1e9 / (len(marks) - 1)
        return per_step * len(arrivals)

    def on_host(self, created: list[int]) -> list[float]:
        """The arrival of each step ended since the last time, on the host's clock (``created``: sorted)."""
        marks = steps.recent_marks()
        arrivals = arrivals_of(marks, created, self.done_until_ns)
        if marks:
            self.done_until_ns = max(self.done_until_ns, marks[-1])
        return arrivals

    def record(self, arrivals: list[float]) -> int:
        """The arrivals into the histogram (a fast loop's even sample: ``steps.sample``) and their median."""
        if arrivals:
            meters = steps.instruments()
            record = meters.arrival.record
            for arrival in steps.sample(arrivals, self.span_s(arrivals)):
                record(arrival)
            self.recent.extend(arrivals)
            meters.arrival_median.set(statistics.median(self.recent))
        return len(arrivals)


def arrivals_of(marks: list[int], created: list[int], after_ns: int = 0) -> list[float]:
    """For each step ``(marks[i-1], marks[i]]`` ending after ``after_ns``: seconds from its start to the last
    collective created in it (``created`` sorted); steps with no collective in them are left out."""
    out = []
    for start, end in itertools.pairwise(marks):
        if end <= after_ns:
            continue
        last = bisect.bisect_right(created, end) - 1
        if last >= 0 and created[last] > start:
            out.append((created[last] - start) / 1e9)
    return out


_arrivals = _Arrivals()


def collectives_of(entries: list[dict[str, object]]) -> list[anatomy.Collective]:
    """Each entry's creation (host ns) and, where NCCL timed it (``TORCH_NCCL_ENABLE_TIMING``), its GPU seconds;
    oldest first. An unusable duration is left out, counted."""
    out: list[anatomy.Collective] = []
    for entry in entries:
        created = _as_int(entry.get("time_created_ns"))
        if created <= 0:
            continue
        duration = entry.get("duration_ms")
        seconds: float | None = None
        if duration is not None:
            if isinstance(duration, (int, float)) and not isinstance(duration, bool) and 0 <= duration < 1e9:
                seconds = float(duration) / 1e3
            else:
                selftelemetry.count(selftelemetry.SANITIZED, "metrics", "collective_duration_invalid")
        out.append((created, seconds))
    out.sort(key=lambda c: c[0])
    return out


def _arrive(entries: list[dict[str, object]]) -> None:
    """The steps' phases (with their wait for the last collective carved out: ``anatomy``) and their arrivals: on
    the GPU's clock where the job is on it, else on the host's."""
    found = collectives_of(entries)
    with steps.lock():
        on_device = anatomy.resolve(found or None)
    if on_device is not None:
        _arrivals.record(on_device)
        marks = steps.recent_marks()
        if marks:
            _arrivals.done_until_ns = max(_arrivals.done_until_ns, marks[-1])
    elif found:
        _arrivals.record(_arrivals.on_host([c[0] for c in found]))


def keep_before_destroy() -> None:
    """The default process group is about to be destroyed before the pipeline is ready (a short job's build is
    still under way): its entries, read now, are what :func:`read_at_exit` reads (the group is gone by then).
    Never raises."""
    try:
        if enabled():
            _arrivals.kept = read_entries()[1]
    except Exception:
        selftelemetry.count(selftelemetry.DROPPED, "metrics", "read_at_exit_error")


def _read_kept() -> None:
    """The entries kept at the group's destruction, once the pipeline is ready: the steps before it get their
    phases and arrivals then, not only at exit (a job may go on without its group)."""
    from torchelastic_otel import pipeline

    if pipeline.ready() is not None:
        read_at_exit()


def read_at_exit() -> None:
    """What the periodic reads left: the last steps' arrivals and phases (a job shorter than the read interval
    has only these). Runs at exit, before the final collection; never raises."""
    try:
        steps.drain()
        entries: list[dict[str, object]] = []
        if enabled():
            entries = read_entries()[1]
        elif _arrivals.kept:
            entries, _arrivals.kept = _arrivals.kept, []
        _arrive(entries)
    except Exception:
        selftelemetry.count(selftelemetry.DROPPED, "metrics", "read_at_exit_error")


def tick() -> list[Group]:
    """The watchdog's tick: the seq gauge from the status; every INTERVAL, the steps' arrivals. The groups seen."""
    if not enabled():
        if _arrivals.kept:
            _read_kept()
        return []
    if _arrivals.due():
        started = time.monotonic()
        groups, entries = read_entries()
        _arrivals.read_took(time.monotonic() - started)
        if entries:
            steps.drain()
        _arrive(entries)
    else:
        groups = status()
    if groups:
        meters = steps.instruments()
        for group in groups:
            if group.key and group.last_enqueued >= 0:
                meters.seq.set(group.last_enqueued, {"process_group": group.key})
    return groups
