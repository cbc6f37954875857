"""The report as text for a terminal: outcome (counts, hosts) and verdict, root cause and restarts, the deviating
nodes, timeline, where the time went, training (stragglers, step phases, stalls), trace tree, metric table.

What went wrong comes first: the root cause and the deviating nodes fit the first screen whatever the job's size.
The timeline shows the deviating nodes' ranks and folds the healthy nodes into one line per attempt (``nodes``).

Plain text (colour only on a terminal that wants it: not with ``NO_COLOR``), at most ``width`` columns in the
timeline and tables; long tracebacks keep their last lines, which say where it failed.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable
from typing import IO

from torchelastic_otel import _names as names
from torchelastic_otel.report import goodput as goodput_mod
from torchelastic_otel.report import groups as groups_mod
from torchelastic_otel.report import hosts as hosts_mod
from torchelastic_otel.report import memory as memory_mod
from torchelastic_otel.report import metrics as metrics_mod
from torchelastic_otel.report import nodes as nodes_mod
from torchelastic_otel.report import timeline, training, tree
from torchelastic_otel.report.model import Attempt, Job, RootCause
from torchelastic_otel.report.records import Problems, Telemetry

_LABEL = 16  # width of the row labels of the timeline
_TRACEBACK_LINES = 14
_FILL = {"succeeded": "█", "running": "█", "unknown": "█", "failed": "▓", "terminated": "░", "stopped": "░"}
_RED, _YELLOW, _GREEN, _DIM, _RESET = "\033[31m", "\033[33m", "\033[32m", "\033[2m", "\033[0m"


def use_color(stream: IO[str]) -> bool:
    return stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


class Text:
    """Lines being written, with colour when wanted."""

    def __init__(self, color: bool) -> None:
        self.lines: list[str] = []
        self.color = color

    def paint(self, text: str, code: str) -> str:
        return f"{code}{text}{_RESET}" if self.color else text

    def add(self, line: str = "", code: str = "") -> None:
        """Add ``line``, painted ``code`` (all of it) where given."""
        self.lines.append(self.paint(line, code) if code else line)

    def heading(self, title: str) -> None:
        self.add()
        self.add(self.paint(title, "\033[1m"))


def render(tel: Telemetry, jobs: list[Job], width: int = 100, color: bool = False) -> str:
    out = Text(color)
    out.add(
        f"read {len(tel.files):,} file(s): {len(tel.spans):,} spans, {len(tel.logs):,} log records, "
        f"{len(tel.points):,} metric points"
    )
    for job in jobs:
        _job(out, tel, job, width)
    _problems(out, tel.problems)
    return "\n".join(out.lines)


def outcome_line(job: Job, counts: hosts_mod.Counts | None = None) -> str:
    """``run r: FAILED after 1 restart -- 32 ranks, 2 attempts, 16 nodes, 1 failure, 41.2 s, 16 agents``."""
    counts = counts or hosts_mod.counts(job)
    restarts = job.restart_count
    after = f" after {restarts} restart{'s' if restarts != 1 else ''}" if restarts else ""
    seconds = (job.end - job.start) / 1e9
    return (
        f"run {job.run_id or '(no run id)'}: {job.outcome}{after} -- {counts.text}, {seconds:.1f} s, "
        f"{hosts_mod.plural(counts.agents, 'agent')}"
    )


def _job(out: Text, tel: Telemetry, job: Job, width: int, live: bool = False) -> None:
    code = _GREEN if job.outcome == "SUCCEEDED" else _RED if job.outcome == "FAILED" else _YELLOW
    studied = training.study(job)
    found, assessment = studied.training, studied.assessment
    view = nodes_mod.overview(job, found)
    out.heading(out.paint(outcome_line(job, view.counts), code))
    if view.hosts:
        out.add(f"hosts: {view.hosts}")
    _verdict(out, assessment)
    rates = training.step_rates(job) if live else {}
    if live:
        _now(out, job, found, assessment, rates)
    _root_causes(out, job)
    _deviating(out, view)
    if not live:
        _timeline(out, job, view, width)
    _where_the_time_went(out, assessment.goodput, width)
    _memory(out, job, assessment.creep)
    if live:
        _missing(out, found)
        _live_ranks(out, job, found, rates)
        if found.stalls:
            _stalls(out, job, found.stalls)
        return
    _training(out, job, found)
    out.heading("TRACE")
    for line in tree.render(job.spans, max_lines=80):
        out.add(line)
    _metrics(out, job, width)


_MAX_NODES = 12  # groups of deviating nodes listed in the first screen
_MAX_NOTES = 4  # lines per group


def _deviating(out: Text, view: nodes_mod.Overview) -> None:
    """The nodes that deviate, grouped by what their ranks did (``groups``: one line for the many that failed
    alike); the healthy ones counted."""
    if not view.deviating:
        return
    total = len(view.deviating) + len(view.healthy)
    found = groups_mod.of(view)
    grouped = f" in {hosts_mod.plural(len(found), 'group')}" if len(found) < len(view.deviating) else ""
    out.heading(
        f"DEVIATING NODES  ({len(view.deviating):,} of {total:,}{grouped}; "
        f"{hosts_mod.plural(len(view.healthy), 'healthy node')})"
    )
    for group in found[:_MAX_NODES]:
        out.add(group.line, _RED)
        notes = group.notes()
        for note in notes[:_MAX_NOTES]:
            out.add("  " + textwrap.shorten(note, 160, placeholder="..."))
        if len(notes) > _MAX_NOTES:
            out.add(f"  ... {len(notes) - _MAX_NOTES} more")
    if len(found) > _MAX_NODES:
        rest = [n for group in found[_MAX_NODES:] for n in group.nodes]
        out.add(
            f"... {len(rest):,} more deviating nodes in {hosts_mod.plural(len(found) - _MAX_NODES, 'group')}: "
            f"{hosts_mod.summarize(n.host for n in rest)}"
        )


# ---- timeline --------------------------------------------------------------------------------------------------


def _timeline(out: Text, job: Job, view: nodes_mod.Overview, width: int) -> None:
    layout = timeline.grouped(job, view, max_rows=48, max_open=4, max_groups=4, max_healthy=0)
    if not (layout.groups or layout.bands) or job.end <= job.start:
        return
    plot = max(30, width - _LABEL - 1)
    span = job.end - job.start

    def col(t: int) -> int:
        return min(plot - 1, max(0, int((t - job.start) * (plot - 1) / span)))

    out.heading(f"TIMELINE  (one column = {span / 1e9 / plot:.2f} s; times UTC)")
    out.add(" " * _LABEL + _axis(plot, span))
    for group in layout.groups:
        if len(layout.groups) > 1 or layout.bands:
            out.add(f"▾ {group.summary}", _RED if group.deviating else _DIM)
        for row in group.rows:
            _row(out, row, plot, col)
    if layout.rows_left_out:
        out.add(f"... {layout.rows_left_out} more rows")
    if layout.deviating_left_out:
        out.add(f"... {layout.deviating_left_out:,} more deviating nodes (listed above)")
    if layout.bands:
        out.add(
            f"▸ {hosts_mod.plural(len(view.healthy), 'healthy node')}, folded: "
            f"{hosts_mod.summarize(n.host for n in view.healthy)}",
            _DIM,
        )
        for row in layout.bands:
            _row(out, row, plot, col)
        for band in view.bands:
            out.add("  " + band.text())
    out.add("  █ ran  ▓ failed  ✗ root cause  ░ stopped by the agent  ↻ restart  |attempt|", _DIM)


def _row(out: Text, row: timeline.Row, plot: int, col: Callable[[int], int]) -> None:
    cells = [" "] * plot
    paint: dict[int, str] = {}
    for bar in row.bars:
        _draw(cells, paint, bar, col)
    for mark in row.marks:
        at = col(mark.time)
        cells[at] = mark.label[0]
        paint[at] = _YELLOW if mark.cls in ("restart", "terminated") else _RED
    line = "".join(out.paint(c, paint[i]) if i in paint else c for i, c in enumerate(cells))
    out.add(f"{row.label[: _LABEL - 1]:<{_LABEL}}{line.rstrip()}")


def _axis(plot: int, span: int) -> str:
    axis = [" "] * plot
    for i in range(5):
        at = round(i * (plot - 1) / 4)
        text = f"{span / 1e9 * i / 4:.1f}s"
        at = min(at, plot - len(text))
        axis[at : at + len(text)] = list(text)
    return "".join(axis)


def _draw(cells: list[str], paint: dict[int, str], bar: timeline.Bar, col: Callable[[int], int]) -> None:
    first, last = col(bar.start), col(bar.end)
    if bar.cls.startswith(("attempt", "band")):
        for i in range(first, last + 1):
            cells[i] = "─"
        cells[first] = "|"
        text = bar.label[: max(0, last - first - 1)]
        cells[first + 1 : first + 1 + len(text)] = list(text)
        if "failed" in bar.cls:
            for i in range(first, last + 1):
                paint[i] = _RED
        elif bar.cls.startswith("band"):
            for i in range(first, last + 1):
                paint[i] = _GREEN
        return
    state = str(bar.data.get("state", "unknown"))
    for i in range(first, last + 1):
        cells[i] = _FILL.get(state, "█")
        paint[i] = _RED if state == "failed" else _YELLOW if state in ("terminated", "stopped") else _GREEN


# ---- verdict and where the time went -------------------------------------------------------------------------

#: One character per cause in the bar (distinct without colour too), and its colour.
BAR_CHARS = {
    "productive": "█",
    "startup": "s",
    "rendezvous": "=",
    "restart": "-",
    "checkpoint_save": "▒",
    "checkpoint_load": "░",
    "lost_progress": "x",
    "input_wait": "▓",
    "stalled": "~",
}
_BAR_COLORS = {"productive": _GREEN, "lost_progress": _RED, "stalled": _RED, "input_wait": _YELLOW, "restart": _YELLOW}


def cause_label(cause: str) -> str:
    return cause.replace("_", " ")


def percent(value: float, total: float) -> str:
    """``62.1 %``: the share as the JSON's 3-digit fraction gives it (``goodput.fraction``)."""
    return f"{goodput_mod.fraction(value, total) * 100:.1f} %"


def _verdict(out: Text, found: goodput_mod.Assessment) -> None:
    verdict = found.verdict
    ratio = found.goodput.ratio
    code = _GREEN if verdict.verdict == "healthy" else _YELLOW if verdict.verdict == "compute-bound" else _RED
    goodput_text = f"  (goodput {ratio * 100:.1f} %)" if ratio is not None else ""
    out.add(out.paint(f"verdict: {verdict.verdict.upper()}: {verdict.reason}", code) + goodput_text)


def bar_columns(seconds: dict[str, float], columns: int) -> dict[str, int]:
    """Columns per cause summing to ``columns`` (largest remainders), in ``CAUSES`` order."""
    total = sum(seconds.values())
    if total <= 0 or columns <= 0:
        return dict.fromkeys(seconds, 0)
    exact = {cause: seconds[cause] * columns / total for cause in goodput_mod.CAUSES}
    cols = {cause: int(value) for cause, value in exact.items()}
    left = columns - sum(cols.values())
    for cause in sorted(exact, key=lambda c: exact[c] - cols[c], reverse=True)[:left]:
        cols[cause] += 1
    return cols


def _bar(out: Text, seconds: dict[str, float], columns: int) -> str:
    cols = bar_columns(seconds, columns)
    return "".join(
        out.paint(BAR_CHARS[c] * n, _BAR_COLORS.get(c, _DIM)) if out.color else BAR_CHARS[c] * n
        for c, n in cols.items()
        if n
    )


def _shares(out: Text, first: str, seconds: dict[str, float], indent: int, width: int) -> None:
    """``first`` then ``█ productive 62.1 %`` for every cause there is, wrapped at ``width`` between causes."""
    total = sum(seconds.values())
    items = [
        f"{BAR_CHARS[c]} {cause_label(c)} {percent(seconds[c], total)}" for c in goodput_mod.CAUSES if seconds[c] > 0
    ]
    line = " " * indent + first
    for item in items:
        if len(line) + 2 + len(item) > width and line.strip():
            out.add(line.rstrip())
            line = " " * indent
        line += ("  " if line.strip() and not line.endswith(": ") else "") + item
    out.add(line.rstrip())


def _where_the_time_went(out: Text, found: goodput_mod.Goodput, width: int) -> None:
    if not found.ranks or found.wall <= 0:
        return
    out.heading(f"WHERE THE TIME WENT  (each rank's wall time by cause, the mean over {len(found.ranks)} ranks)")
    if not found.measured:
        out.add("  no goodput counters in these files: a worker's time is start-up, or lost if it failed", _DIM)
    label = 12
    columns = max(20, width - label - 2)
    ratio = found.ratio
    out.add(f"{'run':<{label}}|{_bar(out, found.seconds, columns)}|")
    goodput_text = f"goodput {ratio * 100 if ratio is not None else 0:.1f} % of {found.wall:.1f} s: "
    _shares(out, goodput_text, found.seconds, label + 1, width)
    if len(found.attempts) > 1:
        for restart, seconds in found.attempts.items():
            wall = found.attempt_wall(restart)
            out.add(f"{'attempt ' + str(restart):<{label}}|{_bar(out, seconds, columns)}|")
            _shares(out, f"{wall:.1f} s: ", seconds, label + 1, width)


# ---- root cause ---------------------------------------------------------------------------------------------


def _root_causes(out: Text, job: Job) -> None:
    failed = hosts_mod.failed_attempts(job)
    if not failed and not job.restarts:
        return
    out.heading("ROOT CAUSE" if failed else "RESTARTS")
    restarts = hosts_mod.restarts(job)
    for attempt in failed:
        cause = attempt.root_cause
        if cause is None:
            out.add(f"attempt {attempt.restart}: failed ({attempt.status or 'no failure records in these files'})")
            continue
        out.add(f"attempt {attempt.restart}: {cause.headline}", _RED)
        _cause_details(out, cause)
        for restart, agents in restarts:
            if restart.restart == attempt.restart + 1:
                following = [a for a in job.attempts if a.restart == restart.restart]
                result = f" -> {_how_it_went(following)}" if following else ""
                on = f" on {hosts_mod.plural(agents, 'agent')}" if agents > 1 else ""
                out.add(
                    f"  ↻ restart {restart.restart} at {timeline.seconds(job, restart.time)} "
                    f"(reason: {restart.reason or '?'}){on}: attempt {restart.restart}{result}"
                )


def _how_it_went(attempts: list[Attempt]) -> str:
    """How an attempt went on every node: failed if it failed on any, running if it has not ended on all."""
    if any(a.failed for a in attempts):
        return "failed"
    return "succeeded" if all(a.ended for a in attempts) else "running"


def _cause_details(out: Text, cause: RootCause) -> None:
    if cause.cuda_memory is not None:
        out.add(f"  {memory_mod.oom_text(cause.cuda_memory)}")
    if cause.consequences:
        out.add(f"  then failed or stopped: {hosts_mod.rank_list(cause.consequences)}")
    if cause.source == "derived":
        out.add("  (chosen from the agent's failure records: the first rank not stopped by the agent)", _DIM)
    trace = cause.stacktrace.rstrip().splitlines()
    if trace:
        if len(trace) > _TRACEBACK_LINES:
            out.add(f"    ... {len(trace) - _TRACEBACK_LINES} lines")
        for line in trace[-_TRACEBACK_LINES:]:
            out.add("    " + line)
    if cause.output:
        out.add("  last output lines of the rank:")
        for line in cause.output[-8:]:
            out.add("    " + textwrap.shorten(line, 160, placeholder="..."))


# ---- memory -----------------------------------------------------------------------------------------------------

_MAX_CREEPS = 8


def _memory(out: Text, job: Job, creeps: list[memory_mod.Creep]) -> None:
    """The ranks whose memory creeps (``memory``: a CUDA device's with its forecast), and the points left out."""
    left_out = memory_mod.left_out(job)
    if not creeps and not left_out:
        return
    out.heading("MEMORY")
    for creep in creeps[:_MAX_CREEPS]:
        out.add(f"memory creeps: {creep.text}", _RED)
    if len(creeps) > _MAX_CREEPS:
        out.add(f"... {len(creeps) - _MAX_CREEPS} more (see --json or the HTML report)")
    if left_out:
        out.add(f"{left_out:,} memory points left out: not a memory size", _DIM)


# ---- training: stragglers, stalls, missing ranks -------------------------------------------------------------

_MAX_STALLS = 16


def _training(out: Text, job: Job, found: training.Training) -> None:
    _missing(out, found)
    if any(r.arrival is not None for r in found.ranks):
        _stragglers(out, found)
    if any(v is not None for r in found.ranks for v in r.phases.values()):
        _phases(out, found)
    if found.stalls:
        _stalls(out, job, found.stalls)


def _missing(out: Text, found: training.Training) -> None:
    if not found.missing:
        return
    out.heading("MISSING FROM A COLLECTIVE  (the other ranks waited for them inside it)")
    for missing in found.missing:
        waited = ", ".join(map(str, missing.waiting))
        out.add(
            out.paint(f"attempt {missing.restart}: {missing.sentence}", _RED)
            + f" (rank{'s' if len(missing.waiting) > 1 else ''} {waited} waited in it)"
        )


MAX_TABLE_RANKS = 32


def _stragglers(out: Text, found: training.Training) -> None:
    out.heading(
        f"STRAGGLERS  (arrival at each step's last collective against the attempt's median rank; a "
        f"straggler arrives {training.STRAGGLER_RATIO}x and {round(training.STRAGGLER_DELAY * 100)} % of the "
        "step or more later in most of its steps)"
    )
    for rank in found.stragglers:
        times = rank.ratio if rank.ratio is not None else rank.median_ratio or 0.0
        out.add(
            f"attempt {rank.restart}: rank {rank.rank}{' (' + rank.host + ')' if rank.host else ''} is "
            f"a straggler: {times:.2f}x the median rank",
            _RED,
        )
        if rank.straggler_reason:
            out.add(f"  {rank.straggler_reason}")
    if not found.stragglers:
        out.add(
            f"no straggler: no rank arrives {round(training.STRAGGLER_DELAY * 100)} % of the step later than the "
            "median rank in most of its steps"
        )
    out.add(f"{'attempt':>7} {'rank':>5}  {'host':<16}{'arrival':>12}{'ratio':>8}{'step time':>12}{'steps':>8}")
    shown, left_out = found.table_ranks(MAX_TABLE_RANKS)
    for rank in shown:
        ratio = f"{rank.ratio:.2f}" if rank.ratio is not None else ""
        line = (
            f"{rank.restart:>7} {rank.rank:>5}  {rank.host[:15]:<16}{training.ms(rank.arrival):>12}{ratio:>8}"
            f"{training.ms(rank.step):>12}{rank.steps:>8}"
        )
        out.add(out.paint(line + "  <- straggler", _RED) if rank.straggler else line)
    if left_out:
        out.add(f"... {left_out:,} more ranks, none a straggler (see --json)")
    out.add(
        "  step time is the same on every rank of a synchronous job: the fast ranks wait for the slow "
        "one inside the collective",
        _DIM,
    )


def _phases(out: Text, found: training.Training) -> None:
    gpu = any(r.clock == goodput_mod.CLOCK_DEVICE for r in found.ranks)
    clock = "; GPU: on the GPU's clock, with the GPU's idle share of its step" if gpu else ""
    out.heading(f"STEP PHASES  (each rank's median per step, of {names.WORKER_STEP_PHASE_DURATION}{clock})")
    cell = 11
    extra = f"{'clock':>7}{'GPU idle':>10}" if gpu else ""
    out.add(f"{'attempt':>7} {'rank':>5}" + "".join(f"{_PHASE_LABELS[p]:>{cell}}" for p in goodput_mod.PHASES) + extra)
    shown, left_out = found.table_ranks(MAX_TABLE_RANKS)
    for rank in shown:
        row = f"{rank.restart:>7} {rank.rank:>5}" + "".join(
            f"{training.ms(rank.phases.get(p)):>{cell}}" for p in goodput_mod.PHASES
        )
        if gpu:
            device = rank.clock == goodput_mod.CLOCK_DEVICE
            idle = f"{rank.gpu_idle * 100:.1f} %" if rank.gpu_idle is not None else ""
            row += f"{'GPU' if device else 'host':>7}{idle:>10}"
        out.add(row)
    if left_out:
        out.add(f"... {left_out:,} more ranks (see --json)")


_PHASE_LABELS = {
    "input": "input",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
    "collective_wait": "coll. wait",
    "other": "other",
}


def _stalls(out: Text, job: Job, stalls: list[training.Stall]) -> None:
    out.heading("STALLS  (torchelastic.worker.stalled: no step and no collective completed for the threshold)")
    for stall in stalls[:_MAX_STALLS]:
        repeats = f", {stall.records} records" if stall.records > 1 else ""
        out.add(
            f"attempt {stall.restart}: rank {stall.rank} stalled at {timeline.seconds(job, stall.since)} for "
            f"{stall.seconds:.1f} s{repeats}: {stall.stack_top or '(no stack)'}"
        )
        if stall.code:
            out.add(f"    your code: {stall.code}")
        for group, fields in sorted(stall.collectives.items()):
            out.add(f"    {group}: {fields.text}")
    if len(stalls) > _MAX_STALLS:
        out.add(f"... {len(stalls) - _MAX_STALLS} more stalls (see --json or the HTML report)")


# ---- metrics ---------------------------------------------------------------------------------------------------


def _metrics(out: Text, job: Job, width: int) -> None:
    all_streams = metrics_mod.streams(job.points)
    if not all_streams:
        return
    table = metrics_mod.table(all_streams, max_rows=60, max_ranks=8)
    out.heading("METRICS  (last value in the agent and in each rank's latest worker; a distribution's mean)")
    cell = 14
    name_width = max(24, width - cell * len(table.columns))
    out.add(f"{'metric':<{name_width}}" + "".join(f"{c[: cell - 1]:>{cell}}" for c in table.columns))
    for stream, cells in table.rows:
        label = stream.short_label
        label = label if len(label) < name_width else label[: name_width - 4] + "..."
        out.add(f"{label:<{name_width}}" + "".join(f"{c[: cell - 1]:>{cell}}" for c in cells))
    if table.left_out_rows or table.left_out_columns:
        out.add(
            f"... {table.left_out_rows} more metric streams, {table.left_out_columns} more ranks (see the HTML report)"
        )


def _problems(out: Text, problems: Problems) -> None:
    if not problems:
        return
    out.heading("SKIPPED  (input that could not be read as OTLP JSON Lines; counted, not lost silently)")
    out.add(", ".join(f"{reason}: {n}" for reason, n in sorted(problems.counts.items())))
    for example in problems.examples[:10]:
        out.add("  " + example)


# ---- the live view (``report --follow``) ----------------------------------------------------------------------


def live(tel: Telemetry, jobs: list[Job], width: int = 100, color: bool = False) -> list[str]:
    """The lines of the live view of a running job (``follow``): per run the report's first sections as they stand
    -- outcome, verdict, what is happening now (``_now``), root causes and restarts, the deviating nodes, where the
    time went, memory --, then each rank's step rate and phases in its latest attempt, the ranks missing from a
    collective and the stalls; then the input skipped. No timeline, trace tree nor metric table: the full report
    comes when the run ends."""
    out = Text(color)
    for job in jobs:
        _job(out, tel, job, width, live=True)
    _problems(out, tel.problems)
    return out.lines


def _now(
    out: Text,
    job: Job,
    found: training.Training,
    assessment: goodput_mod.Assessment,
    step_rates: dict[tuple[int, int], float],
) -> None:
    """One line for each thing that deviates as it stands: the latest attempt, a rank that failed (before its
    agent's verdict, by its own exception record), the root causes, the stragglers, stalls, missing ranks and
    memory that creeps."""
    latest = max((a.restart for a in job.attempts), default=None)
    if latest is None:
        return
    attempts = [a for a in job.attempts if a.restart == latest]
    state = _how_it_went(attempts)
    start = min(a.start for a in attempts)
    rates = {rank: rate for (restart, rank), rate in step_rates.items() if restart == latest}
    ranks = {w.rank for a in attempts for w in a.workers if w.rank is not None}
    line = f"attempt {latest} {state}: {hosts_mod.plural(len(ranks), 'rank')}, {(job.end - start) / 1e9:.1f} s"
    if rates:
        median = sorted(rates.values())[len(rates) // 2]
        slowest = min(rates, key=lambda rank: rates[rank])
        line += f"; {median:.2f} steps/s (the median rank's, over the last {training.RATE_WINDOW:g} s)"
        if rates[slowest] < 0.95 * median:  # a rank a step or more behind in 20
            line += f", slowest rank {slowest}: {rates[slowest]:.2f}"
    out.heading("NOW  " + line)
    told = False
    for attempt in hosts_mod.failed_attempts(job):
        cause = attempt.root_cause
        if cause is not None:
            out.add(f"  ✗ attempt {attempt.restart}: root cause {cause.headline}", _RED)
            told = True
            continue
        failed = sorted(
            (run for run in attempt.workers if run.state == "failed" and run.exception),
            key=lambda run: run.failed_at or run.end,
        )
        if failed:  # the rank's own exception record came first: the one that failed first, until the agent says
            first = failed[0]
            more = f"; {hosts_mod.plural(len(failed) - 1, 'rank')} failed after it" if len(failed) > 1 else ""
            out.add(
                f"  ✗ attempt {attempt.restart}: rank {first.rank} failed first: "
                + textwrap.shorten(first.exception, 120, placeholder="...")
                + f" (its own record; the agent's verdict is to come{more})",
                _RED,
            )
            told = True
    for restart, _ in hosts_mod.restarts(job):
        out.add(f"  ↻ restart {restart.restart} at {timeline.seconds(job, restart.time)} ({restart.reason or '?'})")
    for rank in found.stragglers:
        where = f" ({rank.host})" if rank.host else ""
        times = rank.ratio if rank.ratio is not None else rank.median_ratio or 0.0
        out.add(
            f"  ▲ attempt {rank.restart}: rank {rank.rank}{where} is a straggler: {times:.2f}x the median rank", _RED
        )
        told = True
    for stall in found.stalls:
        out.add(
            f"  ■ attempt {stall.restart}: rank {stall.rank} stalled at {timeline.seconds(job, stall.since)} for "
            f"{stall.seconds:.1f} s: {stall.stack_top or '(no stack)'}",
            _RED,
        )
        told = True
    for missing in found.missing:
        out.add(f"  ⋯ attempt {missing.restart}: {missing.sentence}", _RED)
        told = True
    for creep in assessment.creep[:_MAX_CREEPS]:
        out.add(f"  ↗ memory creeps: {creep.text}", _RED)
        told = True
    if not told:
        out.add("  no failure, straggler, stall nor missing rank so far", _DIM)


MAX_LIVE_RANKS = 16


def _live_ranks(out: Text, job: Job, found: training.Training, step_rates: dict[tuple[int, int], float]) -> None:
    """The latest attempt's ranks: steps, steps a second (``training.step_rates``), step time, arrival ratio and the
    median of each phase; the stragglers and the slowest first where they do not all fit."""
    latest = max((a.restart for a in job.attempts), default=None)
    rates = {rank: rate for (restart, rank), rate in step_rates.items() if restart == latest}
    rows = {r.rank: r for r in found.ranks if r.restart == latest}
    ranks = sorted(set(rows) | set(rates))
    if not ranks:
        return
    if len(ranks) > MAX_LIVE_RANKS:

        def slow(rank: int) -> tuple[bool, float, float]:
            row = rows.get(rank)
            return (not (row is not None and row.straggler), rates.get(rank, 0.0), -((row and row.ratio) or 0.0))

        ranks = sorted(sorted(ranks, key=slow)[:MAX_LIVE_RANKS])
    out.heading(
        f"RANKS  (attempt {latest}; steps/s over the last {training.RATE_WINDOW:g} s; the median of each phase a step)"
    )
    cell = 11
    out.add(
        f"{'rank':>5}  {'host':<12}{'steps':>8}{'steps/s':>9}{'step time':>11}{'ratio':>7}"
        + "".join(f"{_PHASE_LABELS[p]:>{cell}}" for p in goodput_mod.PHASES)
    )
    for rank in ranks:
        row = rows.get(rank)
        rate = f"{rates[rank]:.2f}" if rank in rates else ""
        steps = f"{row.steps:,}" if row is not None and row.steps else ""
        ratio = f"{row.ratio:.2f}" if row is not None and row.ratio is not None else ""
        phases = "".join(
            f"{training.ms(row.phases.get(p) if row is not None else None):>{cell}}" for p in goodput_mod.PHASES
        )
        line = (
            f"{rank:>5}  {(row.host if row is not None else '')[:11]:<12}{steps:>8}{rate:>9}"
            f"{training.ms(row.step if row is not None else None):>11}{ratio:>7}{phases}"
        )
        out.add(out.paint(line + "  <- straggler", _RED) if row is not None and row.straggler else line)
    left_out = len(set(rows) | set(rates)) - len(ranks)
    if left_out:
        values = sorted(rates.values())
        spread = f": {values[0]:.2f} to {values[-1]:.2f} steps/s" if values else ""
        out.add(f"... {left_out:,} more ranks{spread}", _DIM)
