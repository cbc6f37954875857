"""The report as one self-contained HTML file: no network, no CDN, nothing outside the file.

The static parts (outcome, root cause with its traceback, failures, restarts, metric table, notable log records,
trace tree) are HTML written here, every value from the files escaped. The interactive parts (the zoomable
timeline and the per-rank charts) are drawn in the browser from a JSON island by the inline script in
``_assets``, which only ever sets text and attributes, never markup. A Content-Security-Policy forbids every load
but the inline style and script, so the page cannot reach the network even by mistake.

The file's size is bounded whatever the input: the timeline, charts, tables, tracebacks and lists are capped
(``Limits``), and what was left out is said on the page. At scale the top of the page says what went wrong: the
counts (the same as ``--json``'s), the hosts in short (``node0000…node1023 (1,024 hosts)``), the root cause and the
deviating nodes; the timeline is grouped by node (``<details>``): the deviating nodes first and open, the healthy
ones folded into one band per attempt, a few of them listed folded (drawn when opened).
"""

from __future__ import annotations

import datetime
import html
import json
from collections.abc import Iterable
from dataclasses import dataclass

from torchelastic_otel import _names as names
from torchelastic_otel.report import _assets, timeline, training, tree
from torchelastic_otel.report import goodput as goodput_mod
from torchelastic_otel.report import groups as groups_mod
from torchelastic_otel.report import hosts as hosts_mod
from torchelastic_otel.report import memory as memory_mod
from torchelastic_otel.report import metrics as metrics_mod
from torchelastic_otel.report import nodes as nodes_mod
from torchelastic_otel.report.model import IOSTREAM, Attempt, Job, WorkerRun, as_str, output_lines
from torchelastic_otel.report.records import SEVERITY_WARN, LogRecord, Problems, Telemetry

_CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"


@dataclass(frozen=True)
class Limits:
    rows: int = 256
    open_nodes: int = 8  # deviating nodes drawn open
    node_groups: int = 32  # deviating nodes with their rows
    healthy_nodes: int = 8  # healthy nodes listed one by one (folded), beside the bands
    deviating_listed: int = 16  # groups of deviating nodes named at the top (groups.of)
    table_ranks: int = 64  # rows of the per-rank steps table
    spans: int = 3000
    charts: int = 16
    series: int = 16
    points: int = 150
    metric_rows: int = 200
    metric_ranks: int = 16
    tree_lines: int = 300
    failures: int = 64
    text: int = 8192  # characters of one traceback or stack
    notable: int = 200  # warning and error records listed
    body: int = 400


def e(value: object) -> str:
    return html.escape(str(value), quote=True)


def render(tel: Telemetry, jobs: list[Job], limits: Limits = Limits()) -> str:
    views = [_View.of(job, limits) for job in jobs]
    data = {"jobs": [_job_data(job, i, limits, views[i]) for i, job in enumerate(jobs)]}
    title = "torchelastic report" + (f": run {jobs[0].run_id}" if jobs and jobs[0].run_id else "")
    body = [
        "<header>",
        f"<h1>{e(title)}</h1>",
        f"<p class=meta>{len(tel.files):,} file(s): {len(tel.spans):,} spans, {len(tel.logs):,} log records, "
        f"{len(tel.points):,} metric points &middot; rendered {e(_now())}</p>",
        "</header>",
    ]
    body += [_job_html(job, i, limits, views[i]) for i, job in enumerate(jobs)]
    body.append(_problems_html(tel.problems))
    return "\n".join(
        [
            "<!doctype html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{e(title)}</title>",
            f"<style>{_assets.CSS}</style>",
            "</head><body>",
            *body,
            f'<script id="report-data" type="application/json">{_json_island(data)}</script>',
            f"<script>{_assets.SCRIPT}</script>",
            "</body></html>",
        ]
    )


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _json_island(data: object) -> str:
    """JSON that cannot end its ``<script>`` element early, whatever strings the telemetry holds."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


# ---- the JSON island: timeline rows and chart series ----------------------------------------------------------


def _ms(job: Job, t: int) -> float:
    return round((t - job.start) / 1e6, 3)


def _job_data(job: Job, index: int, limits: Limits, view: _View) -> dict[str, object]:
    layout = view.layout
    charts = metrics_mod.charts(view.streams, limits.charts, limits.series, limits.points)
    return {
        "training": _arrival_chart(job, view.found, limits),
        "index": index,
        "end": _ms(job, job.end),
        "groups": [{"host": g.host, "rows": [_row_data(job, r) for r in g.rows]} for g in layout.groups],
        "bands": [_row_data(job, r) for r in layout.bands],
        "restarts": [
            {
                "t": _ms(job, r.time),
                "l": f"↻ restart {r.restart}",
                "title": f"restart {r.restart} at {timeline.seconds(job, r.time)} (reason: {r.reason or '?'})",
            }
            for r, _ in hosts_mod.restarts(job)
        ],
        "rowsLeftOut": layout.rows_left_out,
        "charts": [
            {
                "title": c.stream.label,
                "unit": c.stream.unit,
                "kind": c.stream.kind,
                "series": [
                    {
                        "label": s.label,
                        "rank": s.rank,
                        "restart": s.restart,
                        "points": [[_ms(job, t), _finite(v)] for t, v in s.points],
                    }
                    for s in c.series
                ],
            }
            for c in charts
        ],
    }


def _arrival_chart(job: Job, found: training.Training, limits: Limits) -> list[dict[str, object]]:
    """The per-rank chart of the straggler signal: each rank's arrival between two exports of its metrics."""
    series = found.arrival_series[: limits.series]
    if not series:
        return []
    return [
        {
            "title": training.ARRIVAL + " per rank",
            "unit": "s",
            "kind": "arrival",
            "series": [
                {
                    "label": s.label,
                    "rank": s.rank,
                    "restart": s.restart,
                    "points": [[_ms(job, t), _finite(v)] for t, v in s.points],
                }
                for s in series
            ],
        }
    ]


def _finite(value: float) -> float | None:
    return value if value == value and value not in (float("inf"), float("-inf")) else None


def _row_data(job: Job, row: timeline.Row) -> dict[str, object]:
    def bar(b: timeline.Bar) -> dict[str, object]:
        return {"s": _ms(job, b.start), "e": _ms(job, b.end), "c": b.cls, "l": b.label, "t": b.title, "d": b.data}

    return {
        "key": row.key,
        "label": row.label,
        "kind": row.kind,
        "bars": [bar(b) for b in row.bars],
        "spans": [bar(b) for b in row.spans],
        "marks": [{"t": _ms(job, m.time), "c": m.cls, "l": m.label, "title": m.title} for m in row.marks],
    }


# ---- the static parts -------------------------------------------------------------------------------------------


@dataclass
class _View:
    """What both the page and its JSON island are made from, computed once per job."""

    found: training.Training
    assessment: goodput_mod.Assessment
    overview: nodes_mod.Overview
    layout: timeline.Grouped
    streams: list[metrics_mod.Stream]  # computed once: the charts and the table both read them

    @classmethod
    def of(cls, job: Job, limits: Limits) -> _View:
        studied = training.study(job)
        found = studied.training
        view = nodes_mod.overview(job, found)
        layout = timeline.grouped(
            job,
            view,
            max_rows=limits.rows,
            max_spans=limits.spans,
            max_open=limits.open_nodes,
            max_groups=limits.node_groups,
            max_healthy=limits.healthy_nodes,
        )
        return cls(found, studied.assessment, view, layout, metrics_mod.streams(job.points))


def _job_html(job: Job, index: int, limits: Limits, view: _View) -> str:
    found, assessment = view.found, view.assessment
    restarts = job.restart_count
    after = f" after {restarts} restart{'s' if restarts != 1 else ''}" if restarts else ""
    parts = [
        f'<section class="job" id="job-{index}" data-run-id="{e(job.run_id or "")}" data-outcome="{e(job.outcome)}">',
        f"<h2>run <code>{e(job.run_id or '(no run id)')}</code> "
        f'<span class="badge {e(job.outcome.lower())}">{e(job.outcome)}</span>{e(after)}</h2>',
        _summary_html(job, view.overview),
        _verdict_html(assessment),
        _root_cause_html(job, limits),
        _deviating_html(view.overview, limits),
        "<h3>Timeline</h3>",
        '<div class="toolbar"><button type="button" data-zoom="in" title="zoom in">+</button>'
        '<button type="button" data-zoom="out" title="zoom out">&minus;</button>'
        '<button type="button" data-zoom="reset">reset</button>'
        "<span class=hint>wheel: zoom &middot; drag: pan &middot; double-click: reset &middot; "
        "click a bar: details &middot; times UTC</span></div>",
        _timeline_html(job, index, view),
        '<pre class="details" aria-live="polite">click a bar or a mark for its details</pre>',
        _legend(),
        _goodput_html(assessment.goodput),
        _memory_html(job, assessment.creep, limits),
        _training_html(job, found, index, limits),
        "<h3>Metrics</h3>",
        f'<div class="charts" data-job="{index}"></div>',
        _failures_html(job, limits),
        "<h3>Metric values</h3>",
        _metric_table_html(view.streams, limits),
        _notable_html(job, limits),
        "<h3>Trace</h3>",
        f'<pre class="tree">{e(chr(10).join(tree.render(job.spans, max_lines=limits.tree_lines)))}</pre>',
        "</section>",
    ]
    return "\n".join(p for p in parts if p)


def _summary_html(job: Job, view: nodes_mod.Overview) -> str:
    """The counts (as ``--json`` states them, in ``data-*`` too) and the hosts in short."""
    c = view.counts
    data = " ".join(f'data-{k}="{v}"' for k, v in c.as_json().items())
    items = ((c.ranks, "rank"), (c.attempts, "attempt"), (c.nodes, "node"), (c.failures, "failure"))
    counts = " &middot; ".join(e(hosts_mod.plural(n, w)) for n, w in items)
    hosts = f'<p class=hosts data-hosts="{c.nodes}">hosts: {e(view.hosts)}</p>' if view.hosts else ""
    return (
        f"<p class=summary {data}>{counts} &middot; {(job.end - job.start) / 1e9:.1f} s &middot; "
        f"{e(hosts_mod.plural(c.agents, 'agent'))}</p>{hosts}"
    )


def _deviating_html(view: nodes_mod.Overview, limits: Limits) -> str:
    """The deviating nodes, grouped by what their ranks did (``groups``: one item for the many that failed alike),
    each with what its deviating ranks did, before the timeline."""
    if not view.deviating:
        return ""
    total = len(view.deviating) + len(view.healthy)
    found = groups_mod.of(view)
    grouped = f" in {hosts_mod.plural(len(found), 'group')}" if len(found) < len(view.deviating) else ""
    out = [
        f"<h3>Deviating nodes <small>({len(view.deviating):,} of {total:,}{grouped}; "
        f"{e(hosts_mod.plural(len(view.healthy), 'healthy node'))})</small></h3><ul class=deviating>"
    ]
    for group in found[: limits.deviating_listed]:
        notes = group.notes()
        items = "".join(f"<li>{e(n[: limits.body])}</li>" for n in notes[:4])
        more = f"<li>&hellip; {len(notes) - 4} more</li>" if len(notes) > 4 else ""
        ranks = e(hosts_mod.rank_list(group.ranks))
        if len(group.nodes) == 1:
            node = group.nodes[0]
            head = f'<li data-host="{e(node.host)}" data-reasons="{e(",".join(node.reasons))}"><b>{e(node.host)}</b> '
        else:
            head = (
                f'<li class=group data-nodes="{len(group.nodes)}" data-ranks="{len(group.ranks)}" '
                f'data-reasons="{e(",".join(group.reasons))}"><b>{e(group.hosts)}</b> '
            )
        out.append(f"{head}{e(', '.join(group.reasons))}: {ranks}<ul>{items}{more}</ul></li>")
    out.append("</ul>")
    rest = [n for group in found[limits.deviating_listed :] for n in group.nodes]
    if rest:
        out.append(
            f"<p class=note>{len(rest):,} more deviating nodes in "
            f"{e(hosts_mod.plural(len(found) - limits.deviating_listed, 'group'))}: "
            f"{e(hosts_mod.summarize(n.host for n in rest))}</p>"
        )
    return "\n".join(out)


def _timeline_html(job: Job, index: int, view: _View) -> str:
    """The grouped timeline's frame: an axis, a ``<details>`` per node shown (its lane drawn by the script), the
    healthy bands. What each group is, and whether it is open, is in the HTML itself."""
    layout, ov = view.layout, view.overview
    out = [f'<div class="timeline" data-job="{index}"><div class="lane axis-lane"></div>']
    healthy_started = False
    for i, group in enumerate(layout.groups):
        if not group.deviating and not healthy_started and layout.bands:
            out.append(_bands_html(ov, layout))
            healthy_started = True
        cls = "node deviating" if group.deviating else "node healthy"
        out.append(
            f'<details class="{cls}" data-host="{e(group.host)}" data-group="{i}"'
            f' data-reasons="{e(",".join(group.node.reasons))}"{" open" if group.open else ""}>'
            f"<summary>{e(group.summary)}</summary>"
            f'<div class="lane" data-group="{i}"></div></details>'
        )
    if layout.deviating_left_out:
        out.append(f"<p class=note>{layout.deviating_left_out:,} more deviating nodes, listed above, not drawn</p>")
    if layout.bands and not healthy_started:
        out.append(_bands_html(ov, layout))
    if layout.healthy_left_out:
        rest = ov.healthy[len(ov.healthy) - layout.healthy_left_out :]
        out.append(
            f"<p class=note>{layout.healthy_left_out:,} more healthy nodes, in the bands only: "
            f"{e(hosts_mod.summarize(n.host for n in rest))}</p>"
        )
    if layout.rows_left_out:
        out.append(f"<p class=note>{layout.rows_left_out:,} more rows not shown</p>")
    out.append("</div>")
    return "".join(out)


def _bands_html(ov: nodes_mod.Overview, layout: timeline.Grouped) -> str:
    texts = "".join(f"<li>{e(b.text())}</li>" for b in ov.bands)
    return (
        f'<div class="healthy" data-nodes="{len(ov.healthy)}"><p class=band-title>'
        f"{e(hosts_mod.plural(len(ov.healthy), 'healthy node'))}, folded: "
        f"{e(hosts_mod.summarize(n.host for n in ov.healthy))}</p>"
        f'<div class="lane band-lane"></div><ul class=bands>{texts}</ul></div>'
    )


def _legend() -> str:
    items = [
        ("attempt ok", "attempt"),
        ("attempt failed", "failed attempt"),
        ("worker succeeded", "worker ran"),
        ("worker failed", "worker failed"),
        ("worker terminated", "stopped by the agent"),
        ("rdzv", "rendezvous"),
        ("span", "worker span"),
    ]
    swatches = "".join(f'<span><i class="sw {c}"></i>{e(t)}</span>' for c, t in items)
    return f'<div class="legend">{swatches}<span>&#x2717; root cause</span><span>&#x21bb; restart</span></div>'


def _verdict_html(found: goodput_mod.Assessment) -> str:
    v = found.verdict
    return (
        f'<p class="verdict {e(v.verdict)}" data-verdict="{e(v.verdict)}" data-steps="{v.steps}">'
        f"<b>{e(v.verdict.upper())}</b>: {e(v.reason)}</p>"
    )


def _percent(value: float, total: float) -> str:
    """``62.1``: the share as the JSON's 3-digit fraction gives it (``goodput.fraction``)."""
    return f"{goodput_mod.fraction(value, total) * 100:.1f}"


def _goodput_bar(scope: str, label: str, seconds: dict[str, float]) -> str:
    """One stacked bar (an SVG of a rect per cause, in permille of the width) with its legend of percentages."""
    total = sum(seconds.values())
    rects, keys, x = [], [], 0.0
    for cause in goodput_mod.CAUSES:
        value = seconds.get(cause, 0.0)
        if value <= 0 or total <= 0:
            continue
        width = value / total * 1000
        pct = _percent(value, total)
        title = f"{cause.replace('_', ' ')}: {value:.1f} s ({pct} %)"
        rects.append(
            f'<rect class="gp {cause}" x="{x:.2f}" y="0" width="{width:.2f}" height="18" '
            f'data-cause="{cause}" data-seconds="{value:.3f}" data-percent="{pct}"><title>{e(title)}</title>'
            "</rect>"
        )
        keys.append(
            f'<span data-cause="{cause}"><i class="sw gp {cause}"></i>{e(cause.replace("_", " "))} {pct} %</span>'
        )
        x += width
    return (
        f'<div class="goodput" data-scope="{e(scope)}"><div class="gp-label">{e(label)}</div>'
        '<svg class="gp-bar" viewBox="0 0 1000 18" preserveAspectRatio="none" width="100%" height="18" '
        f'role="img" aria-label="{e(label)}">{"".join(rects)}</svg>'
        f'<div class="legend">{"".join(keys)}</div></div>'
    )


def _goodput_html(found: goodput_mod.Goodput) -> str:
    if not found.ranks or found.wall <= 0:
        return ""
    ratio = found.ratio
    out = [
        "<h3>Where the time went</h3>",
        f"<p class=note>Each rank's wall time by cause, the mean over {len(found.ranks)} ranks; goodput is the "
        "productive share (step time whose progress was kept)."
        + ("" if found.measured else " No goodput counters in these files: worker time is start-up or lost.")
        + "</p>",
        _goodput_bar(
            "run", f"run: goodput {ratio * 100 if ratio is not None else 0:.1f} % of {found.wall:.1f} s", found.seconds
        ),
    ]
    if len(found.attempts) > 1:
        for restart, seconds in found.attempts.items():
            wall = found.attempt_wall(restart)
            out.append(_goodput_bar(f"attempt {restart}", f"attempt {restart}: {wall:.1f} s", seconds))
    return "\n".join(out)


def _root_cause_html(job: Job, limits: Limits) -> str:
    failed = hosts_mod.failed_attempts(job)
    if not failed and not job.restarts:
        return ""
    out = ["<h3>Root cause</h3>" if failed else "<h3>Restarts</h3>"]
    for attempt in failed:
        out.append(_cause_html(job, attempt, limits))
    if job.restarts:
        out.append("<ul class=restarts>")
        for r, agents in hosts_mod.restarts(job):
            where = f" on {hosts_mod.plural(agents, 'agent')}" if agents > 1 else f" on {r.host}" if r.host else ""
            out.append(
                f"<li>&#x21bb; restart {e(r.restart)} at {e(timeline.seconds(job, r.time))} "
                f"(reason: {e(r.reason or '?')}){e(where)}</li>"
            )
        out.append("</ul>")
    return "\n".join(out)


def _cause_html(job: Job, attempt: Attempt, limits: Limits) -> str:
    cause = attempt.root_cause
    if cause is None:
        return (
            f'<div class="cause unknown" data-attempt="{attempt.restart}"><p>attempt {attempt.restart} failed '
            f"({e(attempt.status or 'no failure records in these files')})</p></div>"
        )
    parts = [
        f'<div class="cause" data-attempt="{attempt.restart}" data-rank="{e(cause.rank)}">',
        f"<p class=headline>attempt {attempt.restart}: {e(cause.headline)}</p>",
    ]
    if cause.cuda_memory is not None:
        parts.append(
            f'<p class=oom data-device="{e(cause.cuda_memory.device)}">{e(memory_mod.oom_text(cause.cuda_memory))}</p>'
        )
    if cause.consequences:
        parts.append(f"<p>then failed or stopped: {e(hosts_mod.rank_list(cause.consequences))}</p>")
    if cause.source == "derived":
        parts.append(
            "<p class=note>chosen from the agent's failure records: the first rank not stopped by the agent</p>"
        )
    if cause.stacktrace:
        parts.append(f"<pre class=traceback>{e(_cap(cause.stacktrace, limits.text))}</pre>")
    if cause.output:
        parts.append(f"<p>last output lines of rank {e(cause.rank)}:</p>" + _pre(cause.output, limits, "output"))
    parts.append("</div>")
    return "\n".join(parts)


def _memory_html(job: Job, creeps: list[memory_mod.Creep], limits: Limits) -> str:
    """The ranks whose memory creeps (``memory``: a CUDA device's with its forecast), and the points left out."""
    left_out = memory_mod.left_out(job)
    if not creeps and not left_out:
        return ""
    out = ["<h3>Memory</h3>"]
    if creeps:
        out.append("<ul class=creeps>")
        for c in creeps[: limits.failures]:
            device = "" if c.device is None else f' data-device="{c.device}"'
            full_in = "" if c.full_in_s is None else f' data-full-in="{c.full_in_s:.0f}"'
            out.append(
                f'<li class=creep data-rank="{c.rank}" data-memory="{e(c.memory)}"{device}{full_in}>'
                f"memory creeps: {e(c.text)}</li>"
            )
        out.append("</ul>")
        if len(creeps) > limits.failures:
            out.append(f"<p class=note>{len(creeps) - limits.failures} more (see --json)</p>")
    if left_out:
        out.append(f"<p class=note>{left_out:,} memory points left out: not a memory size</p>")
    return "\n".join(out)


def _training_html(job: Job, found: training.Training, index: int, limits: Limits) -> str:
    """Missing ranks, the straggler table (with each rank's step phases) and the per-rank chart, and the stalls
    (``training``)."""
    if not found:
        return ""
    out = []
    if found.missing:
        out.append("<h3>Missing from a collective</h3>")
        for m in found.missing:
            out.append(
                f'<p class="missing" data-ranks="{e(",".join(map(str, m.ranks)))}" data-seq="{m.seq}" '
                f'data-group="{e(m.process_group)}">attempt {m.restart}: {e(m.sentence)} '
                f"(ranks {e(', '.join(map(str, m.waiting)))} waited in it)</p>"
            )
    if any(r.arrival is not None or any(v is not None for v in r.phases.values()) for r in found.ranks):
        out.append(_stragglers_html(found, index, limits))
    if found.stalls:
        out.append(_stalls_html(job, found.stalls, limits))
    return "\n".join(out)


def _stragglers_html(found: training.Training, index: int, limits: Limits) -> str:
    ms = training.ms
    with_arrival = any(r.arrival is not None for r in found.ranks)
    out = [
        "<h3>Stragglers</h3>" if with_arrival else "<h3>Steps</h3>",
        f"<p class=note>Each rank's mean arrival at its steps' last collective (from the start of the step to its "
        f"enqueueing of that collective) against the attempt's median rank. A straggler's median arrival is "
        f"{training.STRAGGLER_RATIO}x the median rank's or more, and {round(training.STRAGGLER_DELAY * 100)} % of "
        "the step or more later, in most of its steps. Step time is the same on every rank of a synchronous job: "
        "the fast ranks wait for the slow one inside the collective.</p>",
    ]
    for r in found.stragglers:
        times = r.ratio if r.ratio is not None else r.median_ratio or 0.0
        out.append(
            f'<p class="straggler-line" data-rank="{r.rank}">attempt {r.restart}: rank {r.rank}'
            f"{' (' + e(r.host) + ')' if r.host else ''} is a straggler: {times:.2f}x the median rank"
            f"{': ' + e(r.straggler_reason) if r.straggler_reason else ''}</p>"
        )
    with_phases = any(v is not None for r in found.ranks for v in r.phases.values())
    gpu = with_phases and any(r.clock == goodput_mod.CLOCK_DEVICE for r in found.ranks)
    phase_heads = "".join(f"<th class=phase>{e(p.replace('_', ' '))}</th>" for p in goodput_mod.PHASES)
    phase_heads += "<th>clock</th><th>GPU idle</th>" if gpu else ""
    out.append(
        "<table class=stragglers><thead><tr><th>attempt</th><th>rank</th><th>host</th><th>arrival</th>"
        f"<th>ratio</th><th>step time</th><th>steps</th>{phase_heads if with_phases else ''}</tr></thead>"
        "<tbody>"
    )
    shown, left_out = found.table_ranks(limits.table_ranks)
    for r in shown:
        ratio = f"{r.ratio:.2f}" if r.ratio is not None else ""
        cells = "".join(f'<td class=phase data-phase="{p}">{ms(r.phases.get(p))}</td>' for p in goodput_mod.PHASES)
        if gpu:
            idle = f"{r.gpu_idle * 100:.1f} %" if r.gpu_idle is not None else ""
            device = "GPU" if r.clock == goodput_mod.CLOCK_DEVICE else "host"
            cells += (
                f'<td data-clock="{e(r.clock)}">{device}</td><td class=gpu-idle '
                f'data-gpu-idle="{"" if r.gpu_idle is None else r.gpu_idle}">{idle}</td>'
            )
        out.append(
            f'<tr class="{"straggler" if r.straggler else ""}" data-rank="{r.rank}" data-restart="{r.restart}">'
            f"<td>{r.restart}</td><td>{r.rank}</td><td>{e(r.host)}</td><td>{ms(r.arrival)}</td>"
            f"<td>{ratio}</td><td>{ms(r.step)}</td><td>{r.steps}</td>"
            f"{cells if with_phases else ''}</tr>"
        )
    out.append("</tbody></table>")
    if left_out:
        out.append(f"<p class=note>{left_out:,} more ranks, none a straggler, not listed (see --json)</p>")
    if with_phases:
        out.append(
            f"<p class=note>Phases: each rank's median seconds per step of each phase "
            f"({e(names.WORKER_STEP_PHASE_DURATION)}), from its histogram's buckets."
            + (
                " GPU: timed on the GPU's own clock (CUDA events); GPU idle is the share of the GPU's step "
                "time it waited for the host."
                if gpu
                else ""
            )
            + "</p>"
        )
    out.append(f'<div class="charts training" data-job="{index}"></div>')
    return "\n".join(out)


def _table(head: list[str], rows: Iterable[str], note: str = "") -> str:
    """A table's lines: ``head`` (a heading, the table up to its body), ``rows``, its end, and ``note`` (what was
    left out) where there is one."""
    return "\n".join([*head, *rows, "</tbody></table>", *([f"<p class=note>{note}</p>"] if note else [])])


def _stalls_html(job: Job, stalls: list[training.Stall], limits: Limits) -> str:
    head = [
        "<h3>Stalls</h3>",
        "<table class=stalls><thead><tr><th>attempt</th><th>rank</th><th>stalled at</th>"
        "<th>for</th><th>where</th></tr></thead><tbody>",
    ]
    more = len(stalls) - limits.failures
    rows = (_stall_row(job, stall, limits) for stall in stalls[: limits.failures])
    return _table(head, rows, f"{more} more stalls not listed" if more > 0 else "")


def _stall_row(job: Job, stall: training.Stall, limits: Limits) -> str:
    groups = "; ".join(f"{g}: {f.text}" for g, f in sorted(stall.collectives.items()))
    details = f"<details><summary>stacks</summary>{_pre([stall.stack], limits)}</details>" if stall.stack else ""
    return (
        f'<tr data-rank="{e(stall.rank)}" data-restart="{stall.restart}"><td>{stall.restart}</td>'
        f"<td>{e(stall.rank)}</td><td>{e(timeline.seconds(job, stall.since))}</td>"
        f"<td>{stall.seconds:.1f} s{f' ({stall.records} records)' if stall.records > 1 else ''}</td>"
        f"<td><code class=stack-top>{e(stall.stack_top)}</code>"
        f"{'<br>your code: <code>' + e(stall.code) + '</code>' if stall.code else ''}"
        f"{'<br>' + e(groups) if groups else ''}{details}</td></tr>"
    )


def _pre(lines: list[str], limits: Limits, cls: str = "") -> str:
    text = _cap("\n".join(lines).rstrip(), limits.text)
    return f"<pre{' class=' + cls if cls else ''}>{e(text)}</pre>"


def _cap(text: str, limit: int) -> str:
    """The end of a long traceback or stack (where it failed), saying how much was cut."""
    return text if len(text) <= limit else f"... ({len(text) - limit:,} characters cut)\n" + text[-limit:]


def _failures_html(job: Job, limits: Limits) -> str:
    runs = [w for w in job.workers if w.state in ("failed", "terminated") or w.exception or w.stack]
    if not runs:
        return ""
    runs.sort(key=lambda w: (not w.root_cause, w.state != "failed", not w.exception))  # the cause, not 63 stopped
    head = [
        "<h3>Failures</h3>",
        "<table class=failures><thead><tr><th>attempt</th><th>rank</th><th>how it ended</th>"
        "<th>exception / where</th></tr></thead><tbody>",
    ]
    more = len(runs) - limits.failures
    rows = (_failure_row(run, limits) for run in runs[: limits.failures])
    return _table(head, rows, f"{more} more failed workers not listed" if more > 0 else "")


def _failure_row(run: WorkerRun, limits: Limits) -> str:
    how = run.state + (f", exit code {run.exit_code}" if run.exit_code is not None else "")
    how += f", {run.signal}" if run.signal else ""
    details = []
    for summary, lines in (
        ("traceback", [run.stacktrace]),
        ("stack when stopped", [run.stack]),
        ("last output lines", output_lines(run)),
    ):
        if any(lines):
            details.append(f"<details><summary>{summary}</summary>{_pre(lines, limits)}</details>")
    cls = "root-cause" if run.root_cause else ""
    return (
        f'<tr class="{cls}"><td>{run.restart}</td><td>{e(run.rank)}</td><td>{e(how)}'
        f"{' &#x2717; root cause' if run.root_cause else ''}</td>"
        f"<td>{e(run.exception[: limits.body])}{''.join(details)}</td></tr>"
    )


def _metric_table_html(all_streams: list[metrics_mod.Stream], limits: Limits) -> str:
    if not all_streams:
        return "<p class=note>no metric points in these files</p>"
    table = metrics_mod.table(all_streams, limits.metric_rows, limits.metric_ranks)
    columns = "".join(f"<th>{e(c)}</th>" for c in table.columns)
    rows = []
    for stream, cells in table.rows:
        kind = stream.kind + (" (mean)" if stream.kind in ("histogram", "exponential_histogram", "summary") else "")
        tds = "".join(f"<td>{e(c)}</td>" for c in cells)
        rows.append(f"<tr><td>{e(stream.label)}</td><td>{e(kind)}</td>{tds}</tr>")
    left_out = table.left_out_rows or table.left_out_columns
    return _table(
        [f"<table class=metrics><thead><tr><th>metric</th><th>kind</th>{columns}</tr></thead><tbody>"],
        rows,
        f"{table.left_out_rows} more metric streams and {table.left_out_columns} more ranks not shown"
        if left_out
        else "",
    )


def _notable_html(job: Job, limits: Limits) -> str:
    notable = [r for r in job.logs if r.severity >= SEVERITY_WARN and IOSTREAM not in r.attrs]  # output: see failures
    if not notable:
        return ""
    notable.sort(key=lambda r: r.time)
    head = [
        f"<h3>Warnings and errors <small>({len(notable):,} records)</small></h3><table class=logs><thead><tr>"
        "<th>time</th><th>severity</th><th>process</th><th>record</th></tr></thead><tbody>"
    ]
    rows = (
        f"<tr><td>{e(timeline.seconds(job, rec.time))}</td><td>{e(rec.severity_text or rec.severity)}</td>"
        f"<td>{e(rec.proc.label)}</td><td>{e(_record_line(rec)[: limits.body])}</td></tr>"
        for rec in notable[: limits.notable]
    )
    more = len(notable) - limits.notable
    return _table(head, rows, f"{more:,} more not listed" if more > 0 else "")


def _record_line(rec: LogRecord) -> str:
    """``name: message`` of a record, with the rank and exit of a worker failure."""
    text = rec.name or str(rec.body)
    message = as_str(rec.attrs.get("exception.message")) or ("" if rec.name == rec.body else str(rec.body))
    worker = [
        f"{k} {as_str(rec.attrs.get('torchelastic.' + k))}"
        for k in ("global_rank", "exit_code", "signal")
        if as_str(rec.attrs.get("torchelastic." + k))
    ]
    details = ", ".join(part for part in (", ".join(worker), message if message != text else "") if part)
    return f"{text}: {details}" if details else text


def _problems_html(problems: Problems) -> str:
    if not problems:
        return ""
    counts = ", ".join(f"{e(reason)}: {n:,}" for reason, n in sorted(problems.counts.items()))
    examples = e("\n".join(problems.examples))
    return (
        f'<section class="problems"><h2>Skipped input</h2><p>Not readable as OTLP JSON Lines, counted: {counts}</p>'
        f"<pre>{examples}</pre></section>"
    )
