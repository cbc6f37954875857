"""The job by node: which nodes deviate (a failure, a stall, a straggler, a missing rank) and which are healthy.

At 1,024 nodes the node that failed first must not be one row among thousands of identical ones. Both renderers
show the deviating nodes first (the root cause's node before the others, then by when each deviated), each with
what its ranks did, and fold the healthy nodes into one band per attempt: ``1,022 healthy nodes: attempt 0
12:00:01–12:03:10``. A rank the agent stopped because another rank failed is a consequence, not a deviation.

Each deviation is kept as an ``Event`` too (its reason, its attempt, how it ended and the error's text apart), so
that ``groups`` can fold the nodes that deviated alike into one line.
"""

from __future__ import annotations

import collections
import datetime
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from torchelastic_otel.report import hosts as hosts_mod
from torchelastic_otel.report.model import Job
from torchelastic_otel.report.stalls import Stall

#: the reasons a node deviates, in the order they are told
REASONS = ("root cause", "failure", "missing rank", "stall", "straggler")


class Missing(Protocol):
    """What the overview reads of a rank missing from a collective (``training.Missing``)."""

    @property
    def restart(self) -> int: ...
    @property
    def process_group(self) -> str: ...
    @property
    def seq(self) -> int: ...
    @property
    def collective(self) -> str: ...
    @property
    def ranks(self) -> Sequence[int]: ...


class Straggler(Protocol):
    """What the overview reads of a straggler (``training.RankSteps``)."""

    @property
    def rank(self) -> int: ...
    @property
    def restart(self) -> int: ...
    @property
    def host(self) -> str: ...
    @property
    def ratio(self) -> float | None: ...


class Training(Protocol):
    """What the overview reads of ``training.analyze``'s result (a protocol: ``training`` builds on this module)."""

    @property
    def missing(self) -> Sequence[Missing]: ...
    @property
    def stalls(self) -> Sequence[Stall]: ...
    @property
    def stragglers(self) -> Sequence[Straggler]: ...


@dataclass(frozen=True)
class Event:
    """One deviation of one rank, in parts: ``head`` says what happened without the numbers that differ from rank
    to rank (``failed in attempt 0 (exit code 1)``), ``detail`` the error's own text (an exception line, a stack's
    top frame, a collective), joined by ``sep``. Ranks whose events read the same once ``detail`` is masked
    (``groups.mask``) deviated alike."""

    reason: str
    rank: int | None
    head: str
    detail: str = ""
    sep: str = ": "


@dataclass
class Node:
    host: str
    ranks: list[int] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # "rank 7 failed in attempt 0 (root cause): ValueError: ..."
    deviating_ranks: set[int] = field(default_factory=set)
    first: int = 0  # when it first deviated (ns), for the order
    events: list[Event] = field(default_factory=list)

    @property
    def deviating(self) -> bool:
        return bool(self.reasons)

    def add(self, reason: str, rank: int | None, note: str, time: int = 0, event: Event | None = None) -> None:
        if reason not in self.reasons:
            self.reasons.append(reason)
            self.reasons.sort(key=REASONS.index)
        if rank is not None:
            self.deviating_ranks.add(rank)
        if note not in self.notes:
            self.notes.append(note)
        if time:
            self.first = min(self.first or time, time)
        self.events.append(event or Event(reason, rank, note))


@dataclass
class Band:
    """The healthy nodes in one attempt."""

    restart: int
    nodes: int
    start: int
    end: int
    states: dict[str, int]  # how their workers ended: state -> count

    def text(self) -> str:
        """``1,022 healthy nodes: attempt 0 12:00:01–12:03:10 (16,352 workers stopped by the agent)``."""
        ended = ", ".join(f"{n:,} {_STATE_WORDS.get(s, s)}" for s, n in sorted(self.states.items(), key=_by_count))
        return (
            f"{hosts_mod.plural(self.nodes, 'healthy node')}: attempt {self.restart} "
            f"{clock(self.start)}{hosts_mod.DASH}{clock(self.end)}" + (f" ({ended})" if ended else "")
        )


_STATE_WORDS = {
    "terminated": "stopped by the agent",
    "stopped": "stopped by the agent",
    "succeeded": "succeeded",
    "running": "running",
    "unknown": "unknown",
}


def _by_count(item: tuple[str, int]) -> tuple[int, str]:
    return (-item[1], item[0])


def clock(ns: int) -> str:
    """``12:00:01`` (UTC) of a time in ns since the epoch."""
    return datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc).strftime("%H:%M:%S") if ns else "?"


@dataclass
class Overview:
    counts: hosts_mod.Counts
    hosts: str  # ``node0000…node1023 (1,024 hosts)``
    deviating: list[Node]
    healthy: list[Node]
    bands: list[Band]


def overview(job: Job, found: Training) -> Overview:
    """The nodes of ``job`` sorted into deviating (in the order to read them) and healthy, and the healthy bands."""
    by_host: dict[str, Node] = {}
    rank_host: dict[tuple[int, int | None], str] = {}

    def node(host: str) -> Node:
        if host not in by_host:
            by_host[host] = Node(host)
        return by_host[host]

    for agent in job.agents:
        node(agent.host)
    for run in job.workers:
        node(run.host)
        rank_host[(run.restart, run.rank)] = run.host
    for host_node in by_host.values():
        host_node.ranks = []
    ranks_of: dict[str, set[int]] = collections.defaultdict(set)
    for (_, rank), host in rank_host.items():
        if rank is not None:
            ranks_of[host].add(rank)
    for host, ranks in ranks_of.items():
        by_host[host].ranks = sorted(ranks)
    _failures(job, node)
    _training(found, rank_host, node)
    nodes = list(by_host.values())
    if len(nodes) > 1:  # a nameless agent (no traces) beside named workers is no node of its own
        nodes = [n for n in nodes if n.host or n.ranks or n.deviating]
    deviating = sorted((n for n in nodes if n.deviating), key=_order)
    healthy = sorted((n for n in nodes if not n.deviating), key=lambda n: n.host)
    return Overview(
        counts=hosts_mod.counts(job),
        hosts=hosts_mod.summarize(hosts_mod.node_hosts(job)),
        deviating=deviating,
        healthy=healthy,
        bands=_bands(job, {n.host for n in healthy}),
    )


def _order(n: Node) -> tuple[bool, int, str]:
    return ("root cause" not in n.reasons, n.first or 1 << 62, n.host)


def _failures(job: Job, node: Callable[[str], Node]) -> None:
    for attempt in job.attempts:
        for run in attempt.workers:
            if run.state != "failed" and not run.root_cause:
                continue
            what = run.exception or run.state
            how = f"exit code {run.exit_code}" if run.exit_code is not None else ""
            how += (", " if how else "") + run.signal if run.signal else ""
            detail = f" ({how})" if how else ""
            reason = "root cause" if run.root_cause else "failure"
            head = f"root cause of attempt {run.restart}" if run.root_cause else f"failed in attempt {run.restart}"
            event = Event(reason, run.rank, head + detail, what)
            node(run.host).add(
                reason, run.rank, f"rank {run.rank}: {head}{detail}: {what}", run.failed_at or run.end, event
            )


def _training(found: Training, rank_host: dict[tuple[int, int | None], str], node: Callable[[str], Node]) -> None:
    for m in found.missing:
        where = ", ".join(p for p in (m.collective, m.process_group) if p)
        for rank in m.ranks:
            host = rank_host.get((m.restart, rank), "")
            node(host).add(
                "missing rank",
                rank,
                f"rank {rank}: missing from collective #{m.seq} in attempt {m.restart} ({where})",
                event=Event("missing rank", rank, f"missing from a collective in attempt {m.restart}", where),
            )
    for s in found.stalls:
        host = s.host or rank_host.get((s.restart, s.rank), "")
        node(host).add(
            "stall",
            s.rank,
            f"rank {s.rank}: stalled {s.seconds:.1f} s in attempt {s.restart}"
            + (f" at {s.stack_top}" if s.stack_top else ""),
            s.since,
            Event("stall", s.rank, f"stalled in attempt {s.restart}", s.stack_top, " at "),
        )
    for r in found.stragglers:
        host = r.host or rank_host.get((r.restart, r.rank), "")
        ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "?"
        node(host).add(
            "straggler",
            r.rank,
            f"rank {r.rank}: straggler in attempt {r.restart}, {ratio} the median rank's arrival",
            event=Event("straggler", r.rank, f"straggler in attempt {r.restart}"),
        )


def _bands(job: Job, healthy: set[str]) -> list[Band]:
    """Per attempt: how many healthy nodes took part, from their first start to their last end, how they ended."""
    spans: dict[int, list[int]] = {}
    nodes: dict[int, set[str]] = collections.defaultdict(set)
    states: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for agent in job.agents:
        for attempt in agent.attempts:
            for host in {agent.host} | {w.host for w in attempt.workers}:
                if host not in healthy:
                    continue
                nodes[attempt.restart].add(host)
                extent = spans.setdefault(attempt.restart, [attempt.start, attempt.end])
                extent[0], extent[1] = min(extent[0], attempt.start), max(extent[1], attempt.end)
            for run in attempt.workers:
                if run.host in healthy:
                    states[attempt.restart][run.state] += 1
    return [Band(r, len(nodes[r]), spans[r][0], spans[r][1], dict(states[r])) for r in sorted(nodes)]
