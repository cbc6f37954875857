"""The report as one self-contained HTML file: no network, no CDN, nothing outside the file.

The static parts (outcome, root cause with its traceback, failures, restarts, metric table, notable log records,
trace tree) are HTML written here, every value from the files escaped. The interactive parts (the zoomable
timeline and the per-rank charts) are drawn in the browser from a JSON island by the inline script in
``_assets``, which only ever sets text and attributes, never markup. A Content-Security-Policy forbids every load
but the inline style and script, so the page cannot reach the network even by mistake.

The file's size is bounded whatever the input: the timeline, charts, tables, tracebacks and lists are capped
(``Limits``), and what was left out is said on the page.
"""

from __future__ import annotations

import datetime
import html
import json
from dataclasses import dataclass
from typing import Any

from torchelastic_otel import _names as names
from torchelastic_otel.report import _assets, timeline, training, tree
from torchelastic_otel.report import goodput as goodput_mod
from torchelastic_otel.report import metrics as metrics_mod
from torchelastic_otel.report.model import IOSTREAM, Attempt, Job, WorkerRun, as_str, output_lines
from torchelastic_otel.report.records import SEVERITY_WARN, LogRecord, Problems, Telemetry

_CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"


@dataclass(frozen=True)
class Limits:
    rows: int = 256
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


def e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def render(tel: Telemetry, jobs: list[Job], limits: Limits = Limits()) -> str:
    data = {"jobs": [_job_data(job, i, limits) for i, job in enumerate(jobs)]}
    title = "torchelastic report" + (f": run {jobs[0].run_id}" if jobs and jobs[0].run_id else "")
    body = [
        "<header>",
        f"<h1>{e(title)}</h1>",
        f"<p class=meta>{len(tel.files)} file(s): {len(tel.spans):,} spans, {len(tel.logs):,} log records, "
        f"{len(tel.points):,} metric points &middot; rendered {e(_now())}</p>",
        "</header>",
    ]
    body += [_job_html(job, i, limits) for i, job in enumerate(jobs)]
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


def _json_island(data: Any) -> str:
    """JSON that cannot end its ``<script>`` element early, whatever strings the telemetry holds."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


# ---- the JSON island: timeline rows and chart series ----------------------------------------------------------


def _ms(job: Job, t: int) -> float:
    return round((t - job.start) / 1e6, 3)


def _job_data(job: Job, index: int, limits: Limits) -> dict[str, Any]:
    rows, left_out = timeline.rows(job, max_rows=limits.rows, max_spans=limits.spans)
    all_streams = metrics_mod.streams(job.points)
    charts = metrics_mod.charts(all_streams, limits.charts, limits.series, limits.points)
    return {
        "training": _arrival_chart(job, limits),
        "index": index,
        "end": _ms(job, job.end),
        "rows": [_row_data(job, r) for r in rows],
        "rowsLeftOut": left_out,
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


def _arrival_chart(job: Job, limits: Limits) -> list[dict[str, Any]]:
    """The per-rank chart of the straggler signal: each rank's arrival between two exports of its metrics."""
    series = training.analyze(job).arrival_series[: limits.series]
    if not series:
        return []
    return [{
        "title": training.ARRIVAL + " per rank",
        "unit": "s",
        "kind": "arrival",
        "series": [{"label": s.label, "rank": s.rank, "restart": s.restart,
                    "points": [[_ms(job, t), _finite(v)] for t, v in s.points]} for s in series],
    }]  # fmt: skip


def _finite(value: float) -> float | None:
    return value if value == value and value not in (float("inf"), float("-inf")) else None


def _row_data(job: Job, row: timeline.Row) -> dict[str, Any]:
    def bar(b: timeline.Bar) -> dict[str, Any]:
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


def _job_html(job: Job, index: int, limits: Limits) -> str:
    found = training.analyze(job)
    assessment = goodput_mod.assess(job, found)
    restarts = job.restart_count
    after = f" after {restarts} restart{'s' if restarts != 1 else ''}" if restarts else ""
    hosts = sorted({a.host for a in job.agents if a.host})
    parts = [
        f'<section class="job" id="job-{index}" data-run-id="{e(job.run_id or "")}" data-outcome="{e(job.outcome)}">',
        f"<h2>run <code>{e(job.run_id or '(no run id)')}</code> "
        f'<span class="badge {e(job.outcome.lower())}">{e(job.outcome)}</span>{e(after)}</h2>',
        f"<p class=summary>{len(job.ranks)} ranks &middot; {len(job.attempts)} attempts &middot; "
        f"{(job.end - job.start) / 1e9:.1f} s &middot; {len(job.agents)} agent(s)"
        f"{' on ' + e(', '.join(hosts)) if hosts else ''}</p>",
        _verdict_html(assessment),
        "<h3>Timeline</h3>",
        '<div class="toolbar"><button type="button" data-zoom="in" title="zoom in">+</button>'
        '<button type="button" data-zoom="out" title="zoom out">&minus;</button>'
        '<button type="button" data-zoom="reset">reset</button>'
        "<span class=hint>wheel: zoom &middot; drag: pan &middot; double-click: reset &middot; "
        "click a bar: details</span></div>",
        f'<div class="timeline" data-job="{index}"></div>',
        '<pre class="details" aria-live="polite">click a bar or a mark for its details</pre>',
        _legend(),
        _goodput_html(assessment.goodput),
        _root_cause_html(job, limits),
        _training_html(job, found, index, limits),
        "<h3>Metrics</h3>",
        f'<div class="charts" data-job="{index}"></div>',
        _failures_html(job, limits),
        "<h3>Metric values</h3>",
        _metric_table_html(job, limits),
        _notable_html(job, limits),
        "<h3>Trace</h3>",
        f'<pre class="tree">{e(chr(10).join(tree.render(job.spans, max_lines=limits.tree_lines)))}</pre>',
        "</section>",
    ]
    return "\n".join(p for p in parts if p)


def _legend() -> str:
    items = [
        ("attempt ok", "attempt"), ("attempt failed", "failed attempt"), ("worker succeeded", "worker ran"),
        ("worker failed", "worker failed"), ("worker terminated", "stopped by the agent"), ("rdzv", "rendezvous"),
        ("span", "worker span"),
    ]  # fmt: skip
    swatches = "".join(f'<span><i class="sw {c}"></i>{e(t)}</span>' for c, t in items)
    return f'<div class="legend">{swatches}<span>&#x2717; root cause</span><span>&#x21bb; restart</span></div>'


def _verdict_html(found: goodput_mod.Assessment) -> str:
    v = found.verdict
    return (f'<p class="verdict {e(v.verdict)}" data-verdict="{e(v.verdict)}"><b>{e(v.verdict.upper())}</b>: '
            f"{e(v.reason)}</p>")  # fmt: skip


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
        rects.append(f'<rect class="gp {cause}" x="{x:.2f}" y="0" width="{width:.2f}" height="18" '
                     f'data-cause="{cause}" data-seconds="{value:.3f}" data-percent="{pct}"><title>{e(title)}</title>'
                     "</rect>")  # fmt: skip
        keys.append(f'<span data-cause="{cause}"><i class="sw gp {cause}"></i>{e(cause.replace("_", " "))} '
                    f"{pct} %</span>")  # fmt: skip
        x += width
    return (f'<div class="goodput" data-scope="{e(scope)}"><div class="gp-label">{e(label)}</div>'
            '<svg class="gp-bar" viewBox="0 0 1000 18" preserveAspectRatio="none" width="100%" height="18" '
            f'role="img" aria-label="{e(label)}">{"".join(rects)}</svg>'
            f'<div class="legend">{"".join(keys)}</div></div>')  # fmt: skip


def _goodput_html(found: goodput_mod.Goodput) -> str:
    if not found.ranks or found.wall <= 0:
        return ""
    ratio = found.ratio
    out = ["<h3>Where the time went</h3>",
           f"<p class=note>Each rank's wall time by cause, the mean over {len(found.ranks)} ranks; goodput is the "
           "productive share (step time whose progress was kept)."
           + ("" if found.measured else " No goodput counters in these files: worker time is start-up or lost.")
           + "</p>",
           _goodput_bar("run", f"run: goodput {ratio * 100 if ratio is not None else 0:.1f} % of {found.wall:.1f} s",
                        found.seconds)]  # fmt: skip
    if len(found.attempts) > 1:
        for restart, seconds in found.attempts.items():
            wall = found.attempt_wall(restart)
            out.append(_goodput_bar(f"attempt {restart}", f"attempt {restart}: {wall:.1f} s", seconds))
    return "\n".join(out)


def _root_cause_html(job: Job, limits: Limits) -> str:
    failed = [a for a in job.attempts if a.failed]
    if not failed and not job.restarts:
        return ""
    out = ["<h3>Root cause</h3>" if failed else "<h3>Restarts</h3>"]
    for attempt in failed:
        out.append(_cause_html(job, attempt, limits))
    if job.restarts:
        out.append("<ul class=restarts>")
        for r in job.restarts:
            out.append(f"<li>&#x21bb; restart {e(r.restart)} at {e(timeline.seconds(job, r.time))} "
                       f"(reason: {e(r.reason or '?')}){' on ' + e(r.host) if r.host else ''}</li>")  # fmt: skip
        out.append("</ul>")
    return "\n".join(out)


def _cause_html(job: Job, attempt: Attempt, limits: Limits) -> str:
    cause = attempt.root_cause
    if cause is None:
        return (f'<div class="cause unknown" data-attempt="{attempt.restart}"><p>attempt {attempt.restart} failed '
                f"({e(attempt.status or 'no failure records in these files')})</p></div>")  # fmt: skip
    parts = [
        f'<div class="cause" data-attempt="{attempt.restart}" data-rank="{e(cause.rank)}">',
        f"<p class=headline>attempt {attempt.restart}: {e(cause.headline)}</p>",
    ]
    if cause.consequences:
        parts.append(f"<p>then failed or stopped: rank(s) {e(', '.join(map(str, cause.consequences)))}</p>")
    if cause.source == "derived":
        parts.append("<p class=note>chosen from the agent's failure records: the first rank not stopped by the agent"
                     "</p>")  # fmt: skip
    if cause.stacktrace:
        parts.append(f"<pre class=traceback>{e(_cap(cause.stacktrace, limits.text))}</pre>")
    if cause.output:
        parts.append(f"<p>last output lines of rank {e(cause.rank)}:</p>" + _pre(cause.output, limits, "output"))
    parts.append("</div>")
    return "\n".join(parts)


def _training_html(job: Job, found: training.Training, index: int, limits: Limits) -> str:
    """Missing ranks, the straggler table (with each rank's step phases) and the per-rank chart, and the stalls
    (``training``)."""
    if not found:
        return ""
    out = []
    if found.missing:
        out.append("<h3>Missing from a collective</h3>")
        for m in found.missing:
            out.append(f'<p class="missing" data-ranks="{e(",".join(map(str, m.ranks)))}" data-seq="{m.seq}" '
                       f'data-group="{e(m.process_group)}">attempt {m.restart}: {e(m.sentence)} '
                       f"(ranks {e(', '.join(map(str, m.waiting)))} waited in it)</p>")  # fmt: skip
    if any(r.arrival is not None or any(v is not None for v in r.phases.values()) for r in found.ranks):
        out.append(_stragglers_html(found, index))
    if found.stalls:
        out.append(_stalls_html(job, found.stalls, limits))
    return "\n".join(out)


def _stragglers_html(found: training.Training, index: int) -> str:
    ms = lambda v: "" if v is None else f"{v * 1000:,.1f} ms"  # noqa: E731
    with_arrival = any(r.arrival is not None for r in found.ranks)
    out = ["<h3>Stragglers</h3>" if with_arrival else "<h3>Steps</h3>",
           f"<p class=note>Each rank's mean arrival at its steps' last collective (from the start of the step to its "
           f"enqueueing of that collective) against the attempt's median rank: {training.STRAGGLER_RATIO}x or more "
           "is a straggler. Step time is the same on every rank of a synchronous job: the fast ranks wait for the "
           "slow one inside the collective.</p>"]  # fmt: skip
    for r in found.stragglers:
        out.append(
            f'<p class="straggler-line" data-rank="{r.rank}">attempt {r.restart}: rank {r.rank}'
            f"{' (' + e(r.host) + ')' if r.host else ''} is a straggler: {r.ratio:.2f}x the median rank</p>"
        )
    with_phases = any(v is not None for r in found.ranks for v in r.phases.values())
    phase_heads = "".join(f"<th class=phase>{e(p.replace('_', ' '))}</th>" for p in goodput_mod.PHASES)
    out.append("<table class=stragglers><thead><tr><th>attempt</th><th>rank</th><th>host</th><th>arrival</th>"
               f"<th>ratio</th><th>step time</th><th>steps</th>{phase_heads if with_phases else ''}</tr></thead>"
               "<tbody>")  # fmt: skip
    for r in found.ranks:
        ratio = f"{r.ratio:.2f}" if r.ratio is not None else ""
        cells = "".join(f'<td class=phase data-phase="{p}">{ms(r.phases.get(p))}</td>' for p in goodput_mod.PHASES)
        out.append(f'<tr class="{"straggler" if r.straggler else ""}" data-rank="{r.rank}" data-restart="{r.restart}">'
                   f"<td>{r.restart}</td><td>{r.rank}</td><td>{e(r.host)}</td><td>{ms(r.arrival)}</td>"
                   f"<td>{ratio}</td><td>{ms(r.step)}</td><td>{r.steps}</td>"
                   f"{cells if with_phases else ''}</tr>")  # fmt: skip
    out.append("</tbody></table>")
    if with_phases:
        out.append(f"<p class=note>Phases: each rank's median seconds per step of each phase "
                   f"({e(names.WORKER_STEP_PHASE_DURATION)}), from its histogram's buckets.</p>")  # fmt: skip
    out.append(f'<div class="charts training" data-job="{index}"></div>')
    return "\n".join(out)


def _stalls_html(job: Job, stalls: list[training.Stall], limits: Limits) -> str:
    out = ["<h3>Stalls</h3>", "<table class=stalls><thead><tr><th>attempt</th><th>rank</th><th>stalled at</th>"
           "<th>for</th><th>where</th></tr></thead><tbody>"]  # fmt: skip
    for stall in stalls[: limits.failures]:
        groups = "; ".join(
            f"{g}: last enqueued #{f.get('last_enqueued')}, completed #{f.get('last_completed')}"
            + (f", pending #{f.get('pending_seq')} {f.get('pending')}" if f.get("pending") else "")
            for g, f in sorted(stall.collectives.items())
        )
        details = f"<details><summary>stacks</summary>{_pre([stall.stack], limits)}</details>" if stall.stack else ""
        out.append(f'<tr data-rank="{e(stall.rank)}" data-restart="{stall.restart}"><td>{stall.restart}</td>'
                   f"<td>{e(stall.rank)}</td><td>{e(timeline.seconds(job, stall.since))}</td>"
                   f"<td>{stall.seconds:.1f} s{f' ({stall.records} records)' if stall.records > 1 else ''}</td>"
                   f"<td><code class=stack-top>{e(stall.stack_top)}</code>"
                   f"{'<br>your code: <code>' + e(stall.code) + '</code>' if stall.code else ''}"
                   f"{'<br>' + e(groups) if groups else ''}{details}</td></tr>")  # fmt: skip
    out.append("</tbody></table>")
    if len(stalls) > limits.failures:
        out.append(f"<p class=note>{len(stalls) - limits.failures} more stalls not listed</p>")
    return "\n".join(out)


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
    out = ["<h3>Failures</h3>", "<table class=failures><thead><tr><th>attempt</th><th>rank</th><th>how it ended</th>"
           "<th>exception / where</th></tr></thead><tbody>"]  # fmt: skip
    for run in runs[: limits.failures]:
        out.append(_failure_row(run, limits))
    out.append("</tbody></table>")
    if len(runs) > limits.failures:
        out.append(f"<p class=note>{len(runs) - limits.failures} more failed workers not listed</p>")
    return "\n".join(out)


def _failure_row(run: WorkerRun, limits: Limits) -> str:
    how = run.state + (f", exit code {run.exit_code}" if run.exit_code is not None else "")
    how += f", {run.signal}" if run.signal else ""
    details = []
    for summary, lines in (("traceback", [run.stacktrace]), ("stack when stopped", [run.stack]),
                           ("last output lines", output_lines(run))):  # fmt: skip
        if any(lines):
            details.append(f"<details><summary>{summary}</summary>{_pre(lines, limits)}</details>")
    cls = "root-cause" if run.root_cause else ""
    return (f'<tr class="{cls}"><td>{run.restart}</td><td>{e(run.rank)}</td><td>{e(how)}'
            f"{' &#x2717; root cause' if run.root_cause else ''}</td>"
            f"<td>{e(run.exception[: limits.body])}{''.join(details)}</td></tr>")  # fmt: skip


def _metric_table_html(job: Job, limits: Limits) -> str:
    all_streams = metrics_mod.streams(job.points)
    if not all_streams:
        return "<p class=note>no metric points in these files</p>"
    table = metrics_mod.table(all_streams, limits.metric_rows, limits.metric_ranks)
    head = "".join(f"<th>{e(c)}</th>" for c in table.columns)
    out = [f"<table class=metrics><thead><tr><th>metric</th><th>kind</th>{head}</tr></thead><tbody>"]
    for stream, cells in table.rows:
        kind = stream.kind + (" (mean)" if stream.kind in ("histogram", "exponential_histogram", "summary") else "")
        tds = "".join(f"<td>{e(c)}</td>" for c in cells)
        out.append(f"<tr><td>{e(stream.label)}</td><td>{e(kind)}</td>{tds}</tr>")
    out.append("</tbody></table>")
    if table.left_out_rows or table.left_out_columns:
        out.append(f"<p class=note>{table.left_out_rows} more metric streams and {table.left_out_columns} more "
                   "ranks not shown</p>")  # fmt: skip
    return "\n".join(out)


def _notable_html(job: Job, limits: Limits) -> str:
    notable = [r for r in job.logs if r.severity >= SEVERITY_WARN and IOSTREAM not in r.attrs]  # output: see failures
    if not notable:
        return ""
    notable.sort(key=lambda r: r.time)
    out = [f"<h3>Warnings and errors <small>({len(notable):,} records)</small></h3><table class=logs><thead><tr>"
           "<th>time</th><th>severity</th><th>process</th><th>record</th></tr></thead><tbody>"]  # fmt: skip
    for rec in notable[: limits.notable]:
        line = _record_line(rec)
        out.append(f"<tr><td>{e(timeline.seconds(job, rec.time))}</td><td>{e(rec.severity_text or rec.severity)}</td>"
                   f"<td>{e(rec.proc.label)}</td><td>{e(str(line)[: limits.body])}</td></tr>")  # fmt: skip
    out.append("</tbody></table>")
    if len(notable) > limits.notable:
        out.append(f"<p class=note>{len(notable) - limits.notable:,} more not listed</p>")
    return "\n".join(out)


def _record_line(rec: LogRecord) -> str:
    """``name: message`` of a record, with the rank and exit of a worker failure."""
    text = rec.name or str(rec.body)
    message = as_str(rec.attrs.get("exception.message")) or ("" if rec.name == rec.body else str(rec.body))
    worker = [f"{k} {as_str(rec.attrs.get('torchelastic.' + k))}" for k in ("global_rank", "exit_code", "signal")
              if as_str(rec.attrs.get("torchelastic." + k))]  # fmt: skip
    details = ", ".join(part for part in (", ".join(worker), message if message != text else "") if part)
    return f"{text}: {details}" if details else text


def _problems_html(problems: Problems) -> str:
    if not problems:
        return ""
    counts = ", ".join(f"{e(reason)}: {n:,}" for reason, n in sorted(problems.counts.items()))
    examples = e("\n".join(problems.examples))
    return (f'<section class="problems"><h2>Skipped input</h2><p>Not readable as OTLP JSON Lines, counted: {counts}</p>'
            f"<pre>{examples}</pre></section>")  # fmt: skip
