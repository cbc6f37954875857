"""Short forms for many hosts and ranks, and the counts every view of the report states the same way.

A job on 1,024 nodes has 1,024 host names and 8,192 ranks: listing them is a page of text nobody reads. The report
says ``node0000…node1023 (1,024 hosts)`` and ``ranks 0–6, 8–8191 (8,191 ranks)`` instead, and names the few that
deviate. The counts (attempts per run, not per agent; ranks; nodes; failures) are computed once here so that the
terminal, the HTML and ``--json`` cannot disagree.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from torchelastic_otel.report.model import Attempt, Job, Restart

_NUMBERED = re.compile(r"^(?P<prefix>.*?)(?P<digits>\d+)(?P<suffix>\D*)$")
ELLIPSIS = "…"
DASH = "–"


def plural(n: int, word: str, words: str = "") -> str:
    """``1 node``, ``1,024 nodes``."""
    return f"{n:,} {word if n == 1 else words or word + 's'}"


def ranges(numbers: Iterable[int], limit: int = 8) -> str:
    """``0–6, 8–31``: sorted runs of consecutive integers, at most ``limit`` of them (then ``… (+N more)``)."""
    runs = _runs(sorted(set(numbers)))
    shown = [f"{a}" if a == b else f"{a}{DASH}{b}" if b > a + 1 else f"{a}, {b}" for a, b in runs[:limit]]
    more = sum(b - a + 1 for a, b in runs[limit:])
    return ", ".join(shown) + (f", {ELLIPSIS} (+{more:,} more)" if more else "")


def rank_list(ranks: Iterable[int], limit: int = 8) -> str:
    """``rank 7``, ``ranks 0–6, 8–31 (31 ranks)``: the count said once there is a range."""
    unique = sorted(set(ranks))
    if not unique:
        return "no rank"
    text = ranges(unique, limit)
    if len(unique) == 1:
        return f"rank {text}"
    counted = f" ({len(unique):,} ranks)" if len(unique) > 3 else ""
    return f"ranks {text}{counted}"


def _runs(numbers: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], n)
        else:
            runs.append((n, n))
    return runs


def summarize(hosts: Iterable[str], limit: int = 6) -> str:
    """``node0000…node1023 (1,024 hosts)``: host names as runs of consecutive numbers with a common prefix and
    suffix (zero padding kept), names without a number as they are; at most ``limit`` pieces, then ``+N more``.
    One host is its name alone; two or three are listed."""
    unique = sorted({h for h in hosts if h})
    if not unique:
        return ""
    if len(unique) <= 3:
        return ", ".join(unique)
    pieces = _pieces(unique)
    shown = pieces[:limit]
    more = sum(n for _, n in pieces[limit:])
    text = ", ".join(p for p, _ in shown) + (f", {ELLIPSIS} (+{more:,} more)" if more else "")
    return f"{text} ({len(unique):,} hosts)"


def _pieces(hosts: list[str]) -> list[tuple[str, int]]:
    """(text, how many hosts) per run of numbered names, in name order; each unnumbered name is its own piece."""
    groups: dict[tuple[str, str, int], list[tuple[int, str]]] = {}
    plain: list[str] = []
    padded = {(m["prefix"], m["suffix"]) for m in map(_NUMBERED.match, hosts) if m and m["digits"][0] == "0"}
    for host in hosts:
        m = _NUMBERED.match(host)
        if m is None:
            plain.append(host)
            continue
        key = (m["prefix"], m["suffix"])
        width = len(m["digits"]) if key in padded else 0  # node0007 and node0010 pad alike; node7 and node10 don't
        groups.setdefault((*key, width), []).append((int(m["digits"]), host))
    out: list[tuple[str, tuple[str, int], int]] = []  # (text, sort key, count)
    for members in groups.values():
        members.sort()
        by_number = dict(members)
        for a, b in _runs([n for n, _ in members]):
            text = by_number[a] if a == b else f"{by_number[a]}{ELLIPSIS}{by_number[b]}"
            out.append((text, (by_number[a], a), b - a + 1))
    out += [(host, (host, 0), 1) for host in plain]
    out.sort(key=lambda item: item[1])
    return [(text, count) for text, _, count in out]


# ---- the counts ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Counts:
    """What a run is made of, as every view states it."""

    attempts: int  # distinct restart counts: on several nodes every agent has its own span of the same attempt
    ranks: int
    nodes: int  # distinct hosts of the agents and workers
    agents: int
    failures: int  # worker processes that failed themselves (not those the agent stopped)

    def as_json(self) -> dict[str, int]:
        return asdict(self)

    @property
    def text(self) -> str:
        """``2 ranks, 2 attempts, 1 node, 1 failure``."""
        return ", ".join(
            (
                plural(self.ranks, "rank"),
                plural(self.attempts, "attempt"),
                plural(self.nodes, "node"),
                plural(self.failures, "failure"),
            )
        )


def node_hosts(job: Job) -> list[str]:
    """The hosts of the job's agents and workers, sorted."""
    return sorted({a.host for a in job.agents if a.host} | {w.host for w in job.workers if w.host})


def counts(job: Job) -> Counts:
    hosts = node_hosts(job)
    return Counts(
        attempts=len({a.restart for a in job.attempts}),
        ranks=len(job.ranks),
        nodes=len(hosts) or (1 if job.agents or job.workers else 0),
        agents=len(job.agents),
        failures=sum(1 for w in job.workers if w.state == "failed"),
    )


# ---- one attempt per restart count -------------------------------------------------------------------------


def failed_attempts(job: Job) -> list[Attempt]:
    """One failed attempt per restart count: on N nodes each agent has its own span of attempt 0, and each holds
    the same root cause; the one to tell is the one on the root cause's host (else the first with a cause)."""
    by_restart: dict[int, list[Attempt]] = {}
    for attempt in job.attempts:
        if attempt.failed:
            by_restart.setdefault(attempt.restart, []).append(attempt)
    return [min(same, key=_telling) for _, same in sorted(by_restart.items())]


def _telling(attempt: Attempt) -> tuple[bool, bool, bool]:
    cause = attempt.root_cause
    return (cause is None, cause is None or attempt.host != cause.host, cause is None or cause.source != "record")


def restarts(job: Job) -> list[tuple[Restart, int]]:
    """Each restart count once (the first agent's), with how many agents recorded it."""
    first: dict[int | None, Restart] = {}
    agents: dict[int | None, int] = {}
    for restart in job.restarts:
        first.setdefault(restart.restart, restart)
        agents[restart.restart] = agents.get(restart.restart, 0) + 1
    return [(r, agents[key]) for key, r in first.items()]
