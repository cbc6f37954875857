"""The timeline of a job as rows of bars, for both renderers: per agent a row of its attempts, then a row per rank.

- agent row: one bar per attempt (failed or not), its rendezvous as thin bars, a mark at each restart;
- rank row: one bar per attempt the rank ran in (its worker process: how it ended, the root cause marked), the
  worker's own spans as thin bars, a mark where it failed or was stopped;
- any other process (not torchrun's): one bar from its first to its last span, its spans as thin bars.

Sizes are bounded whatever the input: at most ``max_rows`` rows, and the thin bars of a row are merged into at
most a share of ``max_spans`` (``N spans``) when there are more.

:func:`grouped` is the timeline at scale: the rows of each deviating node (``nodes``) as a group, first, then a
band per attempt for all the healthy nodes together, then (folded, for who wants to look) the rows of a few
healthy nodes. Rows are built only for the nodes shown, so 1,024 nodes cost what a few do.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from torchelastic_otel.report import hosts as hosts_mod
from torchelastic_otel.report.model import Agent, Attempt, Job, WorkerRun
from torchelastic_otel.report.nodes import Band, Node, Overview
from torchelastic_otel.report.records import Proc, Span


@dataclass
class Bar:
    start: int
    end: int
    cls: str
    label: str
    title: str
    data: dict[str, int | str | None] = field(default_factory=dict)  # what the HTML gives the script


@dataclass
class Mark:
    time: int
    cls: str
    label: str
    title: str


@dataclass
class Row:
    key: str
    label: str
    kind: str  # agent | rank | process
    bars: list[Bar] = field(default_factory=list)
    spans: list[Bar] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)


def seconds(job: Job, t: int) -> str:
    return f"{(t - job.start) / 1e9:.2f} s"


def rows(job: Job, max_rows: int = 256, max_spans: int = 3000) -> tuple[list[Row], int]:
    """The rows of ``job`` and how many rows were left out to stay within ``max_rows``."""
    out: list[Row] = []
    for agent in job.agents:
        out.append(_agent_row(job, agent))
        out.extend(_rank_rows(job, agent))
    out.extend(_process_rows(job))
    left_out = max(0, len(out) - max_rows)
    out = out[:max_rows]
    per_row = max(8, max_spans // max(1, len(out)))
    for row in out:
        row.spans = _bounded(row.spans, per_row)
    return out, left_out


@dataclass
class Group:
    """The rows of one node: its agent's row, then a row per rank."""

    host: str
    deviating: bool
    open: bool
    summary: str  # what the folded group says: ``node0003 -- ranks 6, 7 -- root cause: rank 7 ...``
    rows: list[Row]
    node: Node


@dataclass
class Grouped:
    groups: list[Group]  # deviating nodes first, then the healthy nodes shown one by one (folded)
    bands: list[Row]  # one row per attempt: all the healthy nodes together
    deviating_left_out: int  # deviating nodes beyond the limit (named in the summary, no rows)
    healthy_left_out: int  # healthy nodes in the bands only
    rows_left_out: int  # rows cut from the groups shown (a node with more ranks than the limit)


def grouped(
    job: Job,
    found: Overview,
    max_rows: int = 256,
    max_spans: int = 3000,
    max_open: int = 8,
    max_groups: int = 32,
    max_healthy: int = 8,
) -> Grouped:
    """The timeline by node (see the module's docstring): at most ``max_groups`` deviating nodes with rows, the
    first ``max_open`` of them open; at most ``max_healthy`` healthy nodes with rows, folded (open only when the job
    is one node: nothing to fold); at most ``max_rows`` rows in all."""
    agents: dict[str, list[Agent]] = collections.defaultdict(list)
    for agent in job.agents:
        agents[agent.host].append(agent)
    if len(agents) == 1 and len(found.deviating) + len(found.healthy) == 1:  # one node, maybe named only by workers
        only = found.deviating[0] if found.deviating else found.healthy[0]
        agents = {only.host: next(iter(agents.values()))}
    shown = [(n, True) for n in found.deviating[:max_groups]] + [(n, False) for n in found.healthy[:max_healthy]]
    single = len(found.deviating) + len(found.healthy) == 1
    groups, budget, cut = [], max_rows, 0
    for i, (node, deviating) in enumerate(shown):
        rows: list[Row] = []
        for agent in agents.get(node.host, []):
            rows.append(_agent_row(job, agent))
            rows.extend(_rank_rows(job, agent))
        if not rows:
            continue
        cut += max(0, len(rows) - budget)
        rows = rows[: max(0, budget)]
        budget -= len(rows)
        is_open = (deviating and i < max_open) or single
        groups.append(Group(node.host, deviating, is_open, _group_summary(node), rows, node))
    per_row = max(8, max_spans // max(1, sum(len(g.rows) for g in groups)))
    for group in groups:
        for row in group.rows:
            row.spans = _bounded(row.spans, per_row)
    bands = [_band_row(job, band) for band in found.bands] if found.healthy and not single else []
    return Grouped(
        groups=groups,
        bands=bands,
        deviating_left_out=max(0, len(found.deviating) - max_groups),
        healthy_left_out=max(0, len(found.healthy) - max_healthy),
        rows_left_out=cut,
    )


def _group_summary(node: Node) -> str:
    ranks = hosts_mod.rank_list(node.ranks) if node.ranks else "no ranks"
    if not node.deviating:
        return f"{node.host or '(no host)'}: {ranks}, healthy"
    flagged = hosts_mod.rank_list(node.deviating_ranks)
    return f"{node.host or '(no host)'}: {ranks}; {', '.join(node.reasons)}: {flagged}"


def _band_row(job: Job, band: Band) -> Row:
    state = "stopped" if set(band.states) <= {"terminated", "stopped"} and band.states else "ok"
    label = f"{band.nodes:,} healthy"
    row = Row(f"band:{band.restart}", label, "band")
    row.bars.append(
        Bar(
            band.start,
            max(band.end, band.start),
            f"band {state}",
            f"attempt {band.restart}",
            band.text(),
            {"attempt": band.restart, "nodes": band.nodes},
        )
    )
    return row


def _agent_row(job: Job, agent: Agent) -> Row:
    row = Row(f"agent:{agent.host}:{agent.proc.pid if agent.proc else ''}", f"agent {agent.host}".strip(), "agent")
    for attempt in agent.attempts:
        state = "failed" if attempt.failed else ("ok" if attempt.ended else "running")
        cause = f"\nroot cause: {attempt.root_cause.headline}" if attempt.root_cause else ""
        row.bars.append(
            Bar(
                attempt.start,
                max(attempt.end, attempt.start),
                f"attempt {state}",
                f"attempt {attempt.restart}" + (" ✗" if attempt.failed else ""),
                f"attempt {attempt.restart}: {state}{' (' + attempt.status + ')' if attempt.status else ''}, "
                f"{seconds(job, attempt.start)} to {seconds(job, attempt.end)}{cause}",
                {"attempt": attempt.restart, "state": state},
            )
        )
        for s, e in attempt.rendezvous:
            row.spans.append(Bar(s, e, "rdzv", "rendezvous", f"rendezvous, {(e - s) / 1e6:.0f} ms"))
    for restart in job.restarts:
        if not restart.host or restart.host == agent.host:
            row.marks.append(
                Mark(
                    restart.time,
                    "restart",
                    f"↻ restart {restart.restart}",
                    f"restart {restart.restart} at {seconds(job, restart.time)} (reason: {restart.reason or '?'})",
                )
            )
    return row


def _rank_rows(job: Job, agent: Agent) -> list[Row]:
    by_rank: dict[int | None, list[tuple[Attempt, WorkerRun]]] = collections.defaultdict(list)
    for attempt in agent.attempts:
        for run in attempt.workers:
            by_rank[run.rank].append((attempt, run))
    out = []
    for rank in sorted(by_rank, key=lambda r: (r is None, r if r is not None else 0)):
        row = Row(f"rank:{agent.host}:{rank}", f"rank {rank if rank is not None else '?'}", "rank")
        for attempt, run in by_rank[rank]:
            row.bars.append(_worker_bar(job, attempt, run))
            row.spans.extend(_span_bar(job, s) for s in run.spans)
            row.marks.extend(_worker_marks(job, run))
        out.append(row)
    return out


def _worker_bar(job: Job, attempt: Attempt, run: WorkerRun) -> Bar:
    lines = [
        f"rank {run.rank}, restart {run.restart}: {run.state}{' (root cause)' if run.root_cause else ''}",
        f"pid {run.pid} on {run.host or '?'}, {seconds(job, run.start)} to {seconds(job, run.end)}",
    ]
    if run.exit_code is not None or run.signal:
        lines.append(f"exit code {run.exit_code}" + (f", {run.signal}" if run.signal else ""))
    if run.exception:
        lines.append(run.exception[:300])
    cls = f"worker {run.state}" + (" root-cause" if run.root_cause else "")
    return Bar(
        run.start,
        run.end,
        cls,
        f"restart {run.restart}",
        "\n".join(lines),
        {"rank": run.rank, "restart": run.restart, "attempt": attempt.restart, "state": run.state},
    )


def _worker_marks(job: Job, run: WorkerRun) -> list[Mark]:
    if run.root_cause:
        at = run.failed_at or run.end
        what = run.exception or run.state
        return [Mark(at, "failure", "✗", f"rank {run.rank} failed at {seconds(job, at)}: {what}")]
    if run.state in ("terminated", "stopped"):
        return [Mark(run.end, "terminated", "■", f"rank {run.rank} stopped by the agent at {seconds(job, run.end)}")]
    if run.state == "failed":
        at = run.failed_at or run.end
        return [Mark(at, "failed", "✗", f"rank {run.rank} failed at {seconds(job, at)}: {run.exception}")]
    return []


def _span_bar(job: Job, span: Span) -> Bar:
    cls = "span failed" if span.failed else "span"
    title = f"{span.name}, {(span.end - span.start) / 1e6:.1f} ms at {seconds(job, span.start)}"
    return Bar(span.start, span.end, cls, span.name, title)


def _process_rows(job: Job) -> list[Row]:
    """Processes that are neither a torchrun agent nor a worker: their spans."""
    by_proc: dict[Proc, list[Span]] = collections.defaultdict(list)
    for span in job.spans:
        if span.proc.kind == "process":
            by_proc[span.proc].append(span)
    out = []
    for proc, spans in by_proc.items():
        start, end = min(s.start for s in spans), max(s.end for s in spans)
        row = Row(f"proc:{proc.host}:{proc.pid}", proc.label, "process")
        row.bars.append(Bar(start, end, "process", proc.label, f"{proc.label}: {len(spans)} spans"))
        row.spans = [_span_bar(job, s) for s in spans]
        out.append(row)
    return out


def _bounded(bars: list[Bar], limit: int) -> list[Bar]:
    """``bars`` as they are when there are at most ``limit``; else neighbours merged into ``N spans`` bars."""
    if len(bars) <= limit:
        return bars
    bars = sorted(bars, key=lambda b: b.start)
    gap = (max(b.end for b in bars) - bars[0].start) / limit
    merged: list[list[Bar]] = []
    group_end = 0
    for bar in bars:  # groups are more than ``gap`` apart, so there are at most limit + 1 of them
        if merged and bar.start <= group_end + gap:
            merged[-1].append(bar)
            group_end = max(group_end, bar.end)
        else:
            merged.append([bar])
            group_end = bar.end
    return [_merge(group) for group in merged]


def _merge(group: list[Bar]) -> Bar:
    if len(group) == 1:
        return group[0]
    names = collections.Counter(b.label for b in group).most_common(3)
    title = f"{len(group)} spans: " + ", ".join(f"{n} x{c}" for n, c in names)
    failed = any("failed" in b.cls for b in group)
    return Bar(
        group[0].start,
        max(b.end for b in group),
        "span merged" + (" failed" if failed else ""),
        f"{len(group)} spans",
        title,
    )
