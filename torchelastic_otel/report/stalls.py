"""The stalls of a job's ranks, from their ``torchelastic.worker.stalled`` records: one per rank and start, with the
innermost frame of the main thread and the line of the user's code. Read by the training analysis (``training``)
and by the goodput partition (``goodput``: a stalled tail is ``stalled``), so it is its own module.
"""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass, field

from torchelastic_otel import _names as names
from torchelastic_otel.report.model import Job, as_int, as_str
from torchelastic_otel.report.records import Attrs, AttrValue, LogRecord

__all__ = ["Stall", "Group", "stalls", "stack_top", "collectives_of", "rank_of", "restart_of", "STALLED_EVENT"]

STALLED_EVENT = names.WORKER_STALLED
_COLLECTIVES = names.COLLECTIVES_PREFIX
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]*)", line (?P<line>\d+), in (?P<function>.*)$')


@dataclass
class Group:
    """One process group's collectives, as a rank's record tells them (``torchelastic.collectives.<group>.<field>``):
    the sequence numbers of its last collective enqueued, started and completed, and the oldest one pending (its
    name and number); ``None`` where the record does not say."""

    last_enqueued: int | None = None
    last_started: int | None = None
    last_completed: int | None = None
    pending: str | None = None
    pending_seq: int | None = None

    @property
    def text(self) -> str:
        """``last enqueued #11, completed #10, pending #11 gloo:all_reduce``."""
        pending = f", pending #{self.pending_seq} {self.pending}" if self.pending else ""
        return f"last enqueued #{self.last_enqueued}, completed #{self.last_completed}{pending}"


#: the fields of a ``Group``: those the record's attribute names may end with
_GROUP_FIELDS = frozenset(("last_enqueued", "last_started", "last_completed", "pending", "pending_seq"))


@dataclass
class Stall:
    rank: int | None
    restart: int
    host: str
    since: int  # ns since the epoch: the rank's last progress
    first_record: int
    seconds: float  # the longest the stall was seen to last
    records: int
    stack_top: str  # the innermost frame of the main thread
    code: str  # the main thread's line of the user's code
    stack: str
    collectives: dict[str, Group] = field(default_factory=dict)


def rank_of(rec: LogRecord) -> int | None:
    return rec.proc.rank if rec.proc.rank is not None else as_int(rec.attrs.get(names.GLOBAL_RANK))


def restart_of(rec: LogRecord) -> int:
    if rec.proc.restart is not None:
        return rec.proc.restart
    return as_int(rec.attrs.get(names.RESTART_COUNT)) or 0


def stack_top(stack: str) -> str:
    """The innermost frame of the first (main) thread of a ``torchelastic.stack`` text: ``path:line in function``."""
    top = ""
    for line in stack.splitlines():
        if line.startswith("Thread ") and top:
            break
        match = _FRAME.match(line)
        if match:
            top = f"{match['path']}:{match['line']} in {match['function']}"
    return top


def _code(attrs: Attrs) -> str:
    path = as_str(attrs.get("code.file.path"))
    if not path:
        return ""
    return f"{path}:{as_str(attrs.get('code.line.number'))} in {as_str(attrs.get('code.function.name'))}"


def stalls(job: Job) -> list[Stall]:
    """The job's stalls: one per rank and start (its repeats counted), in time order."""
    found: dict[tuple[int, int | None, int], Stall] = {}
    for rec in sorted(job.logs_named(STALLED_EVENT), key=lambda r: r.time):
        since = as_int(rec.attrs.get(names.STALLED_SINCE_UNIX_NANO)) or rec.time
        key = (restart_of(rec), rank_of(rec), since)
        seconds = _float(rec.attrs.get(names.STALLED_SECONDS))
        stack = as_str(rec.attrs.get(names.STACK))
        stall = found.get(key)
        if stall is None:
            found[key] = Stall(
                key[1],
                key[0],
                rec.proc.host,
                since,
                rec.time,
                seconds,
                1,
                stack_top(stack),
                _code(rec.attrs),
                stack,
                collectives_of(rec.attrs),
            )
            continue
        stall.records += 1
        stall.seconds = max(stall.seconds, seconds)
        stall.stack_top, stall.code = stack_top(stack) or stall.stack_top, _code(rec.attrs) or stall.code
        stall.stack, stall.collectives = stack or stall.stack, collectives_of(rec.attrs) or stall.collectives
    return sorted(found.values(), key=lambda s: (s.restart, s.since, s.rank if s.rank is not None else -1))


def _float(raw: AttrValue) -> float:
    if not isinstance(raw, (int, float, str)):
        return 0.0
    try:
        return float(raw)
    except ValueError:
        return 0.0


def collectives_of(attrs: Attrs) -> dict[str, Group]:
    """``torchelastic.collectives.<group>.<field>`` attributes -> ``{group: Group}`` (a field of another name is
    left out; its group is still there)."""
    out: dict[str, Group] = collections.defaultdict(Group)
    for key, raw in attrs.items():
        if not key.startswith(_COLLECTIVES):
            continue
        group, _, name = key[len(_COLLECTIVES) :].rpartition(".")
        if group and name:
            found = out[group]
            if name == "pending":
                found.pending = as_str(raw)
            elif name in _GROUP_FIELDS:
                setattr(found, name, as_int(raw))
    return dict(out)
