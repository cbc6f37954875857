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

    def add(self, line: str = "") -> None:
        self.lines.append(line)

    def heading(self, title: str) -> None:
        self.add()
        self.add(self.paint(title, "\033[1m"))


def render(tel: Telemetry, jobs: list[Job], width: int = 100, color: bool = False) -> str:
    out = Text(color)
    out.add(f"read {len(tel.files):,} file(s): {len(tel.spans):,} spans, {len(tel.logs):,} log records, "
            f"{len(tel.points):,} metric points")  # fmt: skip
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
    return (f"run {job.run_id or '(no run id)'}: {job.outcome}{after} -- {counts.text}, {seconds:.1f} s, "
            f"{hosts_mod.plural(counts.agents, 'agent')}")  # fmt: skip


def _job(out: Text, tel: Telemetry, job: Job, width: int) -> None:
    code = _GREEN if job.outcome == "SUCCEEDED" else _RED if job.outcome == "FAILED" else _YELLOW
    found = training.analyze(job)
    view = nodes_mod.overview(job, found)
    out.heading(out.paint(outcome_line(job, view.counts), code))
    if view.hosts:
        out.add(f"hosts: {view.hosts}")
    assessment = goodput_mod.assess(job, found)
    _verdict(out, assessment)
    _root_causes(out, job)
    _deviating(out, view)
    _timeline(out, job, view, width)
    _where_the_time_went(out, assessment.goodput, width)
    _memory(out, job, assessment.creep)
    _training(out, job, found)
    out.heading("TRACE")
    for line in tree.render(job.spans, max_lines=80):
        out.add(line)
    _metrics(out, job, width)


_MAX_NODES = 12  # deviating nodes listed in the first screen
_MAX_NOTES = 4  # lines per deviating node


def _deviating(out: Text, view: nodes_mod.Overview) -> None:
    """The nodes that deviate, what each of their ranks did; the healthy ones counted."""
    if not view.deviating:
        return
    total = len(view.deviating) + len(view.healthy)
    out.heading(f"DEVIATING NODES  ({len(view.deviating):,} of {total:,}; "
                f"{hosts_mod.plural(len(view.healthy), 'healthy node')})")  # fmt: skip
    for node in view.deviating[:_MAX_NODES]:
        out.add(out.paint(f"{node.host or '(no host)'}  {', '.join(node.reasons)}: "
                          f"{hosts_mod.rank_list(node.deviating_ranks)}", _RED))  # fmt: skip
        for note in node.notes[:_MAX_NOTES]:
            out.add("  " + textwrap.shorten(note, 160, placeholder="..."))
        if len(node.notes) > _MAX_NOTES:
            out.add(f"  ... {len(node.notes) - _MAX_NOTES} more")
    if len(view.deviating) > _MAX_NODES:
        rest = view.deviating[_MAX_NODES:]
        out.add(f"... {len(rest):,} more deviating nodes: {hosts_mod.summarize(n.host for n in rest)}")


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
            out.add(out.paint(f"▾ {group.summary}", _RED if group.deviating else _DIM))
        for row in group.rows:
            _row(out, row, plot, col)
    if layout.rows_left_out:
        out.add(f"... {layout.rows_left_out} more rows")
    if layout.deviating_left_out:
        out.add(f"... {layout.deviating_left_out:,} more deviating nodes (listed above)")
    if layout.bands:
        out.add(out.paint(f"▸ {hosts_mod.plural(len(view.healthy), 'healthy node')}, folded: "
                          f"{hosts_mod.summarize(n.host for n in view.healthy)}", _DIM))  # fmt: skip
        for row in layout.bands:
            _row(out, row, plot, col)
        for band in view.bands:
            out.add("  " + band.text())
    out.add(out.paint("  █ ran  ▓ failed  ✗ root cause  ░ stopped by the agent  ↻ restart  |attempt|", _DIM))


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
    state = bar.data.get("state", "unknown")
    for i in range(first, last + 1):
        cells[i] = _FILL.get(state, "█")
        paint[i] = _RED if state == "failed" else _YELLOW if state in ("terminated", "stopped") else _GREEN


# ---- verdict and where the time went -------------------------------------------------------------------------

#: One character per cause in the bar (distinct without colour too), and its colour.
BAR_CHARS = {"productive": "█", "startup": "s", "rendezvous": "=", "restart": "-", "checkpoint_save": "▒",
             "checkpoint_load": "░", "lost_progress": "x", "input_wait": "▓", "stalled": "~"}  # fmt: skip
_BAR_COLORS = {"productive": _GREEN, "lost_progress": _RED, "stalled": _RED, "input_wait": _YELLOW,
               "restart": _YELLOW}  # fmt: skip


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
    return "".join(out.paint(BAR_CHARS[c] * n, _BAR_COLORS.get(c, _DIM)) if out.color else BAR_CHARS[c] * n
                   for c, n in cols.items() if n)  # fmt: skip


def _shares(out: Text, first: str, seconds: dict[str, float], indent: int, width: int) -> None:
    """``first`` then ``█ productive 62.1 %`` for every cause there is, wrapped at ``width`` between causes."""
    total = sum(seconds.values())
    items = [f"{BAR_CHARS[c]} {cause_label(c)} {percent(seconds[c], total)}" for c in goodput_mod.CAUSES
             if seconds[c] > 0]  # fmt: skip
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
        out.add(out.paint("  no goodput counters in these files: a worker's time is start-up, or lost if it failed",
                          _DIM))  # fmt: skip
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
        out.add(out.paint(f"attempt {attempt.restart}: {cause.headline}", _RED))
        _cause_details(out, cause)
        for restart, agents in restarts:
            if restart.restart == attempt.restart + 1:
                following = [a for a in job.attempts if a.restart == restart.restart]
                result = f" -> {_how_it_went(following)}" if following else ""
                on = f" on {hosts_mod.plural(agents, 'agent')}" if agents > 1 else ""
                out.add(f"  ↻ restart {restart.restart} at {timeline.seconds(job, restart.time)} "
                        f"(reason: {restart.reason or '?'}){on}: attempt {restart.restart}{result}")  # fmt: skip


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
        out.add(out.paint("  (chosen from the agent's failure records: the first rank not stopped by the agent)", _DIM))
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
        out.add(out.paint(f"memory creeps: {creep.text}", _RED))
    if len(creeps) > _MAX_CREEPS:
        out.add(f"... {len(creeps) - _MAX_CREEPS} more (see --json or the HTML report)")
    if left_out:
        out.add(out.paint(f"{left_out:,} memory points left out: not a memory size", _DIM))


# ---- training: stragglers, stalls, missing ranks -------------------------------------------------------------

_MAX_STALLS = 16


def _training(out: Text, job: Job, found: training.Training) -> None:
    if found.missing:
        out.heading("MISSING FROM A COLLECTIVE  (the other ranks waited for them inside it)")
        for missing in found.missing:
            waited = ", ".join(map(str, missing.waiting))
            out.add(out.paint(f"attempt {missing.restart}: {missing.sentence}", _RED) +
                    f" (rank{'s' if len(missing.waiting) > 1 else ''} {waited} waited in it)")  # fmt: skip
    if any(r.arrival is not None for r in found.ranks):
        _stragglers(out, found)
    if any(v is not None for r in found.ranks for v in r.phases.values()):
        _phases(out, found)
    if found.stalls:
        _stalls(out, job, found.stalls)


MAX_TABLE_RANKS = 32


def table_ranks(found: training.Training, limit: int = MAX_TABLE_RANKS) -> tuple[list[training.RankSteps], int]:
    """The rows of a per-rank table: every rank when they fit, else the stragglers and then the slowest arrivals
    (in table order), and how many were left out."""
    if len(found.ranks) <= limit:
        return found.ranks, 0
    keep = sorted(found.ranks, key=lambda r: (not r.straggler, -(r.ratio or 0.0)))[:limit]
    chosen = {id(r) for r in keep}
    return [r for r in found.ranks if id(r) in chosen], len(found.ranks) - limit


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1000:,.1f} ms"


def _stragglers(out: Text, found: training.Training) -> None:
    out.heading(f"STRAGGLERS  (arrival at each step's last collective against the attempt's median rank; a "
                f"straggler arrives {training.STRAGGLER_RATIO}x and {round(training.STRAGGLER_DELAY * 100)} % of the "
                "step or more later in most of its steps)")  # fmt: skip
    for rank in found.stragglers:
        times = rank.ratio if rank.ratio is not None else rank.median_ratio or 0.0
        out.add(out.paint(f"attempt {rank.restart}: rank {rank.rank}{' (' + rank.host + ')' if rank.host else ''} is "
                          f"a straggler: {times:.2f}x the median rank", _RED))  # fmt: skip
        if rank.straggler_reason:
            out.add(f"  {rank.straggler_reason}")
    if not found.stragglers:
        out.add(f"no straggler: no rank arrives {round(training.STRAGGLER_DELAY * 100)} % of the step later than the "
                "median rank in most of its steps")  # fmt: skip
    out.add(f"{'attempt':>7} {'rank':>5}  {'host':<16}{'arrival':>12}{'ratio':>8}{'step time':>12}{'steps':>8}")
    shown, left_out = table_ranks(found)
    for rank in shown:
        ratio = f"{rank.ratio:.2f}" if rank.ratio is not None else ""
        line = (f"{rank.restart:>7} {rank.rank:>5}  {rank.host[:15]:<16}{_ms(rank.arrival):>12}{ratio:>8}"
                f"{_ms(rank.step):>12}{rank.steps:>8}")  # fmt: skip
        out.add(out.paint(line + "  <- straggler", _RED) if rank.straggler else line)
    if left_out:
        out.add(f"... {left_out:,} more ranks, none a straggler (see --json)")
    out.add(out.paint("  step time is the same on every rank of a synchronous job: the fast ranks wait for the slow "
                      "one inside the collective", _DIM))  # fmt: skip


def _phases(out: Text, found: training.Training) -> None:
    gpu = any(r.clock == goodput_mod.CLOCK_DEVICE for r in found.ranks)
    clock = "; GPU: on the GPU's clock, with the GPU's idle share of its step" if gpu else ""
    out.heading(f"STEP PHASES  (each rank's median per step, of {names.WORKER_STEP_PHASE_DURATION}{clock})")
    cell = 11
    extra = f"{'clock':>7}{'GPU idle':>10}" if gpu else ""
    out.add(f"{'attempt':>7} {'rank':>5}" + "".join(f"{_PHASE_LABELS[p]:>{cell}}" for p in goodput_mod.PHASES)
            + extra)  # fmt: skip
    shown, left_out = table_ranks(found)
    for rank in shown:
        row = f"{rank.restart:>7} {rank.rank:>5}" + "".join(f"{_ms(rank.phases.get(p)):>{cell}}"
                                                            for p in goodput_mod.PHASES)  # fmt: skip
        if gpu:
            device = rank.clock == goodput_mod.CLOCK_DEVICE
            idle = f"{rank.gpu_idle * 100:.1f} %" if rank.gpu_idle is not None else ""
            row += f"{'GPU' if device else 'host':>7}{idle:>10}"
        out.add(row)
    if left_out:
        out.add(f"... {left_out:,} more ranks (see --json)")


_PHASE_LABELS = {"input": "input", "forward": "forward", "backward": "backward", "optimizer": "optimizer",
                 "collective_wait": "coll. wait", "other": "other"}  # fmt: skip


def _stalls(out: Text, job: Job, stalls: list[training.Stall]) -> None:
    out.heading("STALLS  (torchelastic.worker.stalled: no step and no collective completed for the threshold)")
    for stall in stalls[:_MAX_STALLS]:
        repeats = f", {stall.records} records" if stall.records > 1 else ""
        out.add(f"attempt {stall.restart}: rank {stall.rank} stalled at {timeline.seconds(job, stall.since)} for "
                f"{stall.seconds:.1f} s{repeats}: {stall.stack_top or '(no stack)'}")  # fmt: skip
        if stall.code:
            out.add(f"    your code: {stall.code}")
        for group, fields in sorted(stall.collectives.items()):
            pending = f", pending #{fields.get('pending_seq')} {fields.get('pending')}" if fields.get("pending") else ""
            out.add(f"    {group}: last enqueued #{fields.get('last_enqueued')}, "
                    f"completed #{fields.get('last_completed')}{pending}")  # fmt: skip
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
        out.add(f"... {table.left_out_rows} more metric streams, {table.left_out_columns} more ranks "
                "(see the HTML report)")  # fmt: skip


def _problems(out: Text, problems: Problems) -> None:
    if not problems:
        return
    out.heading("SKIPPED  (input that could not be read as OTLP JSON Lines; counted, not lost silently)")
    out.add(", ".join(f"{reason}: {n}" for reason, n in sorted(problems.counts.items())))
    for example in problems.examples[:10]:
        out.add("  " + example)
