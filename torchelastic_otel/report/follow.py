"""``torchelastic-otel report --follow PATH...``: a live view of a running job, from its files as they grow.

**Reading** (``Tail``) is ``tail -F``'s: each file from where the last read ended (an offset per file, keyed by the
file's identity, so that a renamed file is never read twice), files that appear later under a followed directory, a
file rotated -- renamed and replaced: one in a followed directory is found again under its new name; one named on
the command line is read to its end through the handle kept open on it, as ``tail -F`` does, and the new one from
its start -- or truncated (read again from its start), a partial last line kept for the next read. Each complete
line goes through the report's own reader (``otlpjson.Reader``), so bad input is skipped and counted as ``report``
counts it: a binary file once (``not_json_lines``), a line that is not JSON or not OTLP where it is. A ``.gz`` file
is read whole once it holds still (it cannot be tailed).

**What it keeps** (``State``) is what the live view shows, not every record, so that its memory stays flat over a
long run and a redraw costs what the state holds, not what the run wrote:

- per metric stream (process, name, kind, attributes) of the metrics the views read (``VIEW_METRICS``) its latest
  point: a cumulative counter's or histogram's latest point says all of its past the views read; for the streams
  the views fit a line to or take a rate of (memory, steps: ``SERIES``) a thinned series as well (at most
  ``SERIES_POINTS`` evenly spaced, and the last ``RECENT_POINTS``); and each process's first and last point (when
  it was first and last seen);
- the lifecycle spans (``LIFECYCLE``: runs, attempts, rendezvous, worker starts, restarts: a few an attempt) and
  any span holding a root cause or a failure; of every other span name, per process, the first and the last
  ``SPANS_KEPT`` (when the process was first and last seen);
- the events (log records with an event name) per process and name: of the bridge's (failures, root causes,
  exceptions, stalls, status) the first and the last ``EVENTS_KEPT``, of any other the first and the last; of each
  process's output lines and log records the first and the last ``LINES_KEPT``.

**The loop** (``follow``): every ``interval`` seconds it reads what is new, rebuilds the job from the state with the
report's own model and analyses when something new was kept (its CPU bounded: a rebuild at most every four times
the last one took, put off while reading falls behind, at the next read for a failure, a restart or a stall), and
redraws the view in place -- the cursor home, each line, clear to the end: as ``top`` does -- or, when its output is
no terminal, prints each new frame in full under a separator line. It ends when the run ends (every agent seen has
ended its run: its ``torchelastic.run`` span, or its ``SUCCEEDED``/``FAILED`` status record, and the files are
quiet) or on Ctrl-C; its caller then prints the full report of the files, as ``report`` does.
"""

from __future__ import annotations

import collections
import datetime
import gc
import gzip
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Generic, TypeVar

from torchelastic_otel import _names as names
from torchelastic_otel.report import figures, memory, model, terminal
from torchelastic_otel.report.otlpjson import HEAD_CHARS, Reader, ReportError, binary_counted, find_files
from torchelastic_otel.report.records import LogRecord, Point, Problems, Proc, Span, Telemetry

__all__ = [
    "DEFAULT_INTERVAL",
    "EVENTS_KEPT",
    "Follower",
    "LINES_KEPT",
    "LIFECYCLE",
    "RECENT_POINTS",
    "SERIES",
    "SERIES_POINTS",
    "SPANS_KEPT",
    "State",
    "Tail",
    "VIEW_METRICS",
    "fit",
    "follow",
]

#: seconds between two reads and redraws
DEFAULT_INTERVAL = 2.0
#: bytes of one file read at a time (a file far ahead is read in several, each line handed on as it comes)
CHUNK = 4 << 20
#: polls in a row a file of a followed directory must be missing from it to be taken as gone: a file renamed
#: between the directory's listing and the look at each path is missing from one poll, and found again, by its
#: identity, under its new name at the next
MISSING_POLLS = 2
#: after the run has ended, how long the files may go on growing before the follower ends anyway (seconds)
END_GRACE = 10.0
#: the share of the time the view may take to rebuild: a large run's rebuild takes longer than the interval, and
#: the view is then rebuilt less often (reading keeps up every interval; what ``URGENT`` names is shown at once)
BUILD_SHARE = 0.25
#: intervals a rebuild is put off while reading falls behind the files (a read takes longer than an interval): the
#: reading catches up first, and the view is rebuilt at the latest this much later than it would have been
CATCH_UP = 4
#: bytes enough for the whole characters of a file's beginning that tell a binary file (``otlpjson.HEAD_CHARS``)
_HEAD_BYTES = 4 * HEAD_CHARS + 4
#: the bytes before where a file was read that must be there still for a file found under a new name to be the same
_TAIL_BYTES = 256

#: spans kept whole: a few per attempt
LIFECYCLE = frozenset(
    {
        names.RUN,
        names.ATTEMPT,
        names.RENDEZVOUS,
        names.WORKER_START,
        names.RESTART,
        names.WORKERS_START,
        names.WORKERS_STOP,
        names.WORKERS_FAILURE,
        names.AGENT_SHUTDOWN,
    }
)
#: of any other span name, per process, the last this many (and the first)
SPANS_KEPT = 4
#: of each of the bridge's events (``torchelastic.*``: failures, exceptions, stalls, status), per process, the last
#: this many (and the first); of any other event name (a user's, a logging call site's) the first and the last
EVENTS_KEPT = 16
#: of each process's output lines and log records, the last this many (and the first): the report shows a failed
#: rank's last lines that do not repeat its traceback (8 of them)
LINES_KEPT = 24
#: the metrics the live view's analyses read (``training``, ``goodput``, ``memory``): of any other, only each
#: process's first point is kept (when it was first seen)
VIEW_METRICS = frozenset(
    {
        names.WORKER_STEPS,
        names.WORKER_STEP_ARRIVAL,
        names.WORKER_STEP_ARRIVAL_MEDIAN,
        names.WORKER_STEP_DURATION,
        names.WORKER_STEP_PHASE_DURATION,
        names.WORKER_STEP_PHASE_MEDIAN,
        names.WORKER_STEP_GPU_IDLE,
        names.GOODPUT_TIME,
        names.WORKER_PROGRESS_AT_RISK,
        names.PROCESS_MEMORY_USAGE,
        names.WORKER_CUDA_MEMORY_ALLOCATED,
        names.WORKER_CUDA_MEMORY_TOTAL,
    }
)
#: the metric streams kept as thinned series too: those ``memory`` fits a line to and ``training.step_rates`` reads
SERIES = frozenset({memory.USAGE, memory.CUDA_ALLOCATED, memory.STEPS})
#: a series' evenly spaced points, at most (a line fitted to a few dozen points of a long run is the line of all)
SERIES_POINTS = 24
#: and its last points, all of them (a rate over the last ones)
RECENT_POINTS = 4
#: metric streams at most (the bridge bounds its cardinality; a writer that does not cannot grow the state further)
MAX_STREAMS = 1 << 19

#: events that redraw the view at the next read, however recently it was rebuilt
URGENT = frozenset(
    {
        names.WORKER_FAILURE,
        names.WORKER_EXCEPTION,
        names.ROOT_CAUSE,
        names.RESTART,
        names.WORKER_STALLED,
        names.WORKER_TERMINATED,
    }
)
_RC_RANK = names.ROOT_CAUSE_PREFIX + "rank"
_ENDED = ("SUCCEEDED", "FAILED")


# ---- reading: the tail of every file ---------------------------------------------------------------------------


@dataclass
class _File:
    """One file being followed, by its identity (device, inode)."""

    path: str
    named: bool  # named on the command line (its handle is kept: it is read to its end when it is renamed)
    offset: int = 0
    partial: bytes = b""  # the last line, not complete yet
    lines: int = 0  # complete lines read (``where`` names the line as ``report`` numbers it)
    checked: bool = False  # its beginning was looked at: binary or not
    binary: bool = False
    fd: int | None = None
    head: bytes = b""  # its first bytes, as first read: another file under a reused inode begins otherwise ...
    tail: bytes = b""  # ... or holds other bytes just before ``offset`` (files of one writer often begin alike)
    size: int = -1  # a ``.gz`` file's size at the last look: read whole once it holds still
    done: bool = False  # a ``.gz`` file read
    missing: int = 0  # polls in a row that did not find it: gone once ``MISSING_POLLS`` is reached
    seen: int = 0  # its size at the last look: what was not read of it when it goes is counted


@dataclass
class TailStats:
    """What the tail reader did, for the view's header."""

    bytes: int = 0
    lines: int = 0
    rotated: int = 0  # files found again under another name, or replaced under theirs
    truncated: int = 0  # files read again from their start
    waiting: list[str] = field(default_factory=list)  # paths named that hold no file (yet)


Line = tuple[str, str]  # (where: "path:line", the line as the reader takes it)


class Tail:
    """The lines added to the files under ``paths`` since the last ``poll`` (see the module's docstring); what cannot
    be read is counted in ``problems`` as ``report`` counts it."""

    def __init__(self, paths: Iterable[str | os.PathLike[str]], problems: Problems, chunk: int = CHUNK) -> None:
        self.paths = [Path(p) for p in paths]
        self.problems = problems
        self.chunk = chunk
        self.files: dict[tuple[int, int], _File] = {}
        self.stats = TailStats()
        self._unreadable: set[tuple[int, int]] = set()

    def close(self) -> None:
        """Close the handles kept open."""
        for found in self.files.values():
            _close(found)

    @property
    def pending(self) -> bool:
        """Whether some file ends in a line not complete yet."""
        return any(found.partial for found in self.files.values())

    def poll(self) -> Iterator[list[Line]]:
        """The complete lines added since the last poll, a chunk at a time, in the order of the files' paths."""
        present: dict[tuple[int, int], tuple[str, int, bool]] = {}
        waiting: list[str] = []
        for path, named in self._paths(waiting):
            try:
                stat = os.stat(path)
            except OSError:
                continue
            ident = (stat.st_dev, stat.st_ino)
            if ident not in present:
                present[ident] = (path, stat.st_size, named)
            elif named:
                present[ident] = (present[ident][0], stat.st_size, True)
        self.stats.waiting = waiting
        for ident in [i for i in self.files if i not in present]:  # renamed out of sight, replaced or deleted
            gone = self.files[ident]
            gone.missing += 1
            if gone.fd is None and gone.missing < MISSING_POLLS:
                continue  # renamed between the listing and its look: found again under its new name next time
            self._unreadable.discard(ident)
            yield from self._finish(self.files.pop(ident))
        for ident, (path, size, named) in present.items():
            found = self.files.get(ident)
            if found is not None and found.path != path:
                if size >= found.offset and self._holds(path, found):  # the same file, renamed (rotated)
                    found.path = path
                    self.stats.rotated += 1
                else:  # a new file that got the inode of one deleted since (shorter, or beginning otherwise)
                    yield from self._finish(self.files.pop(ident))
                    found = None
            if found is None:
                found = self.files[ident] = _File(path, named)
            found.missing, found.seen = 0, size
            found.named = found.named or named
            yield from self._read(ident, found, size)

    @staticmethod
    def _same(fd: int, found: _File) -> bool:
        """Whether the file open as ``fd`` holds what was read of ``found``: its first bytes, and its last bytes
        before ``offset``."""
        try:
            return os.pread(fd, len(found.head), 0) == found.head and (
                os.pread(fd, len(found.tail), found.offset - len(found.tail)) == found.tail
            )
        except OSError:
            return False

    def _holds(self, path: str, found: _File) -> bool:
        """Whether the file at ``path`` is ``found``, renamed."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return False
        try:
            return self._same(fd, found)
        finally:
            os.close(fd)

    def _paths(self, waiting: list[str]) -> Iterator[tuple[str, bool]]:
        """Every file to follow now: (path, named on the command line)."""
        for path in self.paths:
            if path.is_dir():
                try:
                    inside = find_files([path])
                except ReportError:  # none yet
                    waiting.append(str(path))
                    continue
                for file in inside:
                    yield str(file), False
            elif path.exists():
                yield str(path), True
            else:
                waiting.append(str(path))

    def _read(self, ident: tuple[int, int], found: _File, size: int) -> Iterator[list[Line]]:
        if found.binary or found.done:
            return
        if size < found.offset:  # truncated: from its start again
            self.stats.truncated += 1
            found.offset, found.partial, found.tail, found.lines, found.checked = 0, b"", b"", 0, False
        if found.path.endswith(".gz"):
            yield from self._read_gz(found, size)
            return
        fd = self._open(ident, found)
        if fd is None:
            return
        try:
            if found.offset and size > found.offset and not self._same(fd, found):
                self.stats.truncated += 1  # truncated and written again beyond where it was read: from its start
                found.offset, found.partial, found.tail, found.lines, found.checked = 0, b"", b"", 0, False
            yield from self._read_to(found, fd, size)
        finally:
            if not found.named:
                os.close(fd)

    def _read_to(self, found: _File, fd: int, size: int) -> Iterator[list[Line]]:
        while found.offset < size and not found.binary:
            try:
                data = os.pread(fd, min(self.chunk, size - found.offset), found.offset)
            except OSError as exc:
                self.problems.add("unreadable_file", found.path, str(exc)[:160])
                return
            if not data:
                return
            if found.offset == 0:
                found.head = data[:_HEAD_BYTES]
            found.tail = data[-_TAIL_BYTES:] if len(data) >= _TAIL_BYTES else (found.tail + data)[-_TAIL_BYTES:]
            found.offset += len(data)
            self.stats.bytes += len(data)
            lines = self._lines(found, data)
            if lines:
                yield lines

    def _open(self, ident: tuple[int, int], found: _File) -> int | None:
        """A descriptor of the file (the one kept open for a named file), if it is still the same file."""
        if found.fd is not None:
            return found.fd
        try:
            fd = os.open(found.path, os.O_RDONLY)
        except FileNotFoundError:  # renamed or deleted since it was looked at: the next poll tells which
            return None
        except OSError as exc:
            if ident not in self._unreadable:  # counted once, tried again at every poll
                self._unreadable.add(ident)
                self.problems.add("unreadable_file", found.path, str(exc)[:160])
            return None
        stat = os.fstat(fd)
        if (stat.st_dev, stat.st_ino) != ident:  # replaced since it was looked at: the next poll finds both
            os.close(fd)
            return None
        if found.named:
            found.fd = fd
        return fd

    def _finish(self, found: _File) -> Iterator[list[Line]]:
        """A file gone from where it was: read to its end through its kept handle (a named file rotated), and its
        last line, if not complete, handed on as it is (``report`` counts it as cut short)."""
        try:
            if found.fd is not None and not found.binary:
                yield from self._read_to(found, found.fd, os.fstat(found.fd).st_size)
            elif found.seen > found.offset and not (found.binary or found.path.endswith(".gz")):
                self.problems.add(
                    "unread_file_end",
                    found.path,
                    f"{found.seen - found.offset:,} bytes gone before they were read (deleted or replaced while the "
                    "follower was behind)",
                )
            if found.partial and not found.binary:
                found.lines += 1
                yield [(f"{found.path}:{found.lines}", found.partial.decode("utf-8", "replace"))]
                found.partial = b""
        finally:
            _close(found)

    def _lines(self, found: _File, data: bytes) -> list[Line]:
        """The complete lines of ``data`` after what was left of the last read."""
        buffer = found.partial + data if found.partial else data
        if not found.checked and (len(buffer) >= _HEAD_BYTES or b"\n" in buffer):
            end = len(buffer) if len(buffer) >= _HEAD_BYTES else buffer.rfind(b"\n") + 1
            head = buffer[: min(end, _HEAD_BYTES)].decode("utf-8", "replace")[:HEAD_CHARS]
            found.checked = True
            if binary_counted(head, self.problems, found.path):
                found.binary, found.partial = True, b""
                return []
        cut = buffer.rfind(b"\n")
        if cut < 0:
            found.partial = buffer
            return []
        found.partial = buffer[cut + 1 :]
        out = []
        for line in buffer[: cut + 1].decode("utf-8", "replace").split("\n")[:-1]:
            found.lines += 1
            out.append((f"{found.path}:{found.lines}", line + "\n"))
        self.stats.lines += len(out)
        return out

    def _read_gz(self, found: _File, size: int) -> Iterator[list[Line]]:
        """A compressed file whole, once its size held still from one poll to the next (it cannot be tailed)."""
        if size != found.size:
            found.size = size
            return
        found.done = True
        lines: list[Line] = []
        try:
            with gzip.open(found.path, "rt", encoding="utf-8", errors="replace") as fh:
                head = fh.read(HEAD_CHARS)
                if binary_counted(head, self.problems, found.path):
                    return
                rest = fh.readline()
                for number, line in enumerate([*(head + rest).splitlines(keepends=True), *fh], 1):
                    lines.append((f"{found.path}:{number}", line))
                    if len(lines) >= 4096:
                        yield lines
                        lines = []
        except (OSError, EOFError, UnicodeError) as exc:
            self.problems.add("unreadable_file", found.path, str(exc)[:160])
        self.stats.bytes += size
        if lines:
            yield lines


def _close(found: _File) -> None:
    if found.fd is not None:
        try:
            os.close(found.fd)
        except OSError:
            pass
        found.fd = None


# ---- what is kept ------------------------------------------------------------------------------------------------

_T = TypeVar("_T")


class _Ring(Generic[_T]):
    """The first item and the last ``size``."""

    __slots__ = ("first", "last")

    def __init__(self, size: int) -> None:
        self.first: _T | None = None
        self.last: collections.deque[_T] = collections.deque(maxlen=size)

    def add(self, item: _T) -> None:
        if self.first is None:
            self.first = item
        else:
            self.last.append(item)

    def items(self) -> list[_T]:
        return ([self.first] if self.first is not None else []) + list(self.last)


class _Series:
    """A metric stream's points thinned evenly: every ``every``-th point, ``every`` doubling whenever
    ``SERIES_POINTS`` are kept, and the last ``RECENT_POINTS`` as they came."""

    __slots__ = ("kept", "every", "seen", "recent")

    def __init__(self) -> None:
        self.kept: list[Point] = []
        self.every = 1
        self.seen = 0
        self.recent: collections.deque[Point] = collections.deque(maxlen=RECENT_POINTS)

    def add(self, point: Point) -> None:
        if self.seen % self.every == 0:
            self.kept.append(point)
            if len(self.kept) >= SERIES_POINTS:
                self.kept = self.kept[::2]
                self.every *= 2
        self.seen += 1
        self.recent.append(point)

    def points(self) -> list[Point]:
        kept = {id(p) for p in self.kept}
        return self.kept + [p for p in self.recent if id(p) not in kept]


def _stream_key(point: Point) -> tuple[object, ...]:
    try:
        key: tuple[object, ...] = (point.proc, point.name, point.kind, tuple(point.attrs.items()))
        hash(key)
    except TypeError:  # a list value
        key = (point.proc, point.name, point.kind, repr(point.attrs))
    return key


def _event_name(rec: LogRecord) -> str | None:
    """An event's name (its ``event_name``, or torch's name as the body of records older than that field); ``None``
    for an output line or a log record of any other kind."""
    if rec.event_name:
        return rec.event_name
    body = rec.body
    if isinstance(body, str) and body.startswith("torchelastic.") and len(body) < 200 and not model.is_output(rec):
        return body
    return None


class State:
    """The aggregates of a run the live view is built from (see the module's docstring)."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._spans: dict[tuple[Proc, str], _Ring[Span]] = {}
        self._events: dict[tuple[Proc, str], _Ring[LogRecord]] = {}
        self._lines: dict[Proc, _Ring[LogRecord]] = {}
        self._latest: dict[tuple[object, ...], Point] = {}
        self._series: dict[tuple[object, ...], _Series] = {}
        self._first: dict[Proc, Point] = {}
        self._last: dict[Proc, Point] = {}
        #: every agent seen: whether it said its run is over
        self.agents: dict[Proc, bool] = {}
        self.records = 0
        self.streams_left_out = 0
        #: the records kept, as of the last ``telemetry``
        self.kept = 0
        #: counts what was kept: the view is rebuilt when it moved
        self.version = 0
        #: an ``URGENT`` event, a new attempt or the run's end was kept since the last ``telemetry``
        self.urgent = False

    def add(self, spans: list[Span], logs: list[LogRecord], points: list[Point]) -> None:
        """Fold newly read records in."""
        self.records += len(spans) + len(logs) + len(points)
        self.version += bool(spans or logs or points)
        for span in spans:
            self._span(span)
        for rec in logs:
            self._log(rec)
        for point in points:
            self._point(point)

    def _span(self, span: Span) -> None:
        proc = span.proc
        if proc.kind == "agent":
            ended = span.name == names.RUN or self.agents.get(proc, False)
            self.agents[proc] = ended
        if span.name in (names.RUN, names.ATTEMPT):
            self.urgent = True
        if span.name in LIFECYCLE or _RC_RANK in span.attrs or any(e.name == model.FAILURE_EVENT for e in span.events):
            self.spans.append(span)
            return
        key = (proc, span.name)
        ring = self._spans.get(key)
        if ring is None:
            ring = self._spans[key] = _Ring(SPANS_KEPT)
        ring.add(span)

    def _log(self, rec: LogRecord) -> None:
        proc = rec.proc
        name = _event_name(rec)
        if proc.kind == "agent":
            ended = self.agents.get(proc, False) or (
                name is not None
                and name.startswith(names.WORKER_STATUS_PREFIX)
                and rec.attrs.get(names.SOURCE) == "AGENT"
                and rec.attrs.get(names.STATE) in _ENDED
            )
            self.agents[proc] = ended
        if name is None:
            lines = self._lines.get(proc)
            if lines is None:
                lines = self._lines[proc] = _Ring(LINES_KEPT)
            lines.add(rec)
            return
        key = (proc, name)
        ring = self._events.get(key)
        if ring is None:
            ring = self._events[key] = _Ring(EVENTS_KEPT if name.startswith("torchelastic.") else 1)
        ring.add(rec)
        self.urgent = self.urgent or name in URGENT

    def _point(self, point: Point) -> None:
        proc = point.proc
        if proc not in self._first:
            self._first[proc] = point
            if proc.kind == "agent":
                self.agents.setdefault(proc, False)
        last = self._last.get(proc)
        if last is None or point.time >= last.time:
            self._last[proc] = point
        if point.name not in VIEW_METRICS:
            return
        key = _stream_key(point)
        seen = self._latest.get(key)
        if seen is None:
            if len(self._latest) >= MAX_STREAMS:
                self.streams_left_out += 1
                return
            self._latest[key] = point
        elif ((point.count or 0), point.time) >= ((seen.count or 0), seen.time):
            self._latest[key] = point
        if point.name in SERIES:
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = _Series()
            series.add(point)

    @property
    def run_over(self) -> bool:
        """Whether every agent seen has said its run is over (and one was seen)."""
        return bool(self.agents) and all(self.agents.values())

    def _points(self) -> list[Point]:
        points = [p for key, p in self._latest.items() if key not in self._series]
        for series in self._series.values():
            points.extend(series.points())
        known = set(map(id, points))
        for point in (*self._first.values(), *self._last.values()):
            if id(point) not in known:
                known.add(id(point))
                points.append(point)
        return points

    def telemetry(self, problems: Problems, files: list[str], lines: int) -> Telemetry:
        """What is kept, as the report's records: the views' input."""
        spans = self.spans + [s for ring in self._spans.values() for s in ring.items()]
        logs = [r for ring in self._events.values() for r in ring.items()]
        logs += [r for ring in self._lines.values() for r in ring.items()]
        points = self._points()
        self.kept, self.urgent = len(spans) + len(logs) + len(points), False
        return Telemetry(spans, logs, points, problems, files, lines)


class Follower:
    """The files under ``paths`` read as they grow (``Tail``, ``otlpjson.Reader``) into a ``State``."""

    def __init__(self, paths: Iterable[str | os.PathLike[str]], chunk: int = CHUNK) -> None:
        self.reader = Reader()
        self.state = State()
        self.tail = Tail(paths, self.reader.telemetry.problems, chunk)

    @property
    def problems(self) -> Problems:
        """What could not be read, counted as ``report`` counts it."""
        return self.reader.telemetry.problems

    def read(self) -> int:
        """Read what is new into the state, a chunk of lines at a time (each chunk's records folded in before the
        next is read); the records read."""
        tel = self.reader.telemetry
        got = 0
        for lines in self.tail.poll():
            for where, line in lines:
                self.reader.read_line(line, where)
            figures.screen(tel)  # the figures no duration, size or count can be: left out, counted (as ``read``)
            spans, logs, points = tel.spans, tel.logs, tel.points
            tel.spans, tel.logs, tel.points = [], [], []
            self.state.add(spans, logs, points)
            got += len(spans) + len(logs) + len(points)
        self.reader.forget()  # this read's decoded ids and shared attribute sets: they would grow with the run
        return got

    def telemetry(self) -> Telemetry:
        """What is kept, as the report's records (``State.telemetry``)."""
        tel = self.reader.telemetry
        return self.state.telemetry(tel.problems, [f.path for f in self.tail.files.values()], tel.lines)

    def close(self) -> None:
        self.tail.close()
        self.reader.close()


# ---- the view ---------------------------------------------------------------------------------------------------


class _Screen:
    """Frames drawn in place on a terminal (cursor home, each line cleared to its end, the rest below cleared, the
    cursor hidden meanwhile); elsewhere each new frame in full, under a separator line."""

    def __init__(self, out: IO[str], tty: bool) -> None:
        self.out, self.tty = out, tty
        self._last: list[str] = []
        self._started = False

    def draw(self, head: list[str], body: list[str], width: int, height: int) -> None:
        if self.tty:
            lines = fit(head + body, width, height)
            text = "\033[H" + "".join(line + "\033[K\n" for line in lines[:-1]) + lines[-1] + "\033[K\033[J"
            if not self._started:
                text = "\033[?25l\033[H\033[2J" + text
                self._started = True
            self.out.write(text)
        elif body != self._last:
            self._last = body  # first: a Ctrl-C that lands in the write still finds a frame to close
            self.out.write(f"\n==== {_clock()} ====\n" + "\n".join(head + body) + "\n")
        self._last = body
        self.out.flush()

    def close(self) -> None:
        """Back to a plain terminal (the cursor shown, the screen cleared for the report); elsewhere a separator
        line before it."""
        if self.tty and self._started:
            self.out.write("\033[H\033[2J\033[?25h")
        elif not self.tty and self._last:
            self.out.write(f"\n==== {_clock()}: the report of the files ====\n")
        self.out.flush()


def _visible(text: str, width: int) -> str:
    """``text`` cut to ``width`` columns, its colour codes kept (and reset where cut)."""
    out, columns, i, painted = [], 0, 0, False
    while i < len(text):
        if text[i] == "\033":
            end = text.find("m", i)
            if end < 0:
                break
            out.append(text[i : end + 1])
            painted = text[i : end + 1] != "\033[0m"
            i = end + 1
            continue
        if columns >= width:
            if painted:
                out.append("\033[0m")
            break
        out.append(text[i])
        columns += 1
        i += 1
    return "".join(out)


def fit(lines: list[str], width: int, height: int) -> list[str]:
    """The lines that fit a screen of ``height`` rows, each cut to ``width`` columns; the last row says how many
    more there are."""
    if len(lines) > height:
        lines = lines[: max(1, height - 1)] + [
            f"... {len(lines) - height + 1} more lines (all in the report at the end)"
        ]
    return [_visible(line, width) for line in lines] or [""]


def _clock() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M:%S UTC")


def _size(n: int) -> str:
    return f"{n / 2**20:,.1f} MB" if n >= 2**20 else f"{n / 2**10:,.1f} kB"


@dataclass
class _Builds:
    """How the view's rebuilds went: the last one's seconds, how many, their CPU seconds together."""

    last: float = 0.0
    count: int = 0
    cpu: float = 0.0


def _header(following: Follower, interval: float, idle: float | None, builds: _Builds) -> list[str]:
    tail, state = following.tail, following.state
    stats = tail.stats
    top = f"torchelastic-otel report --follow  {_clock()}  (every {interval:g} s; Ctrl-C: the full report now)"
    if not state.records:
        where = ", ".join(str(p) for p in tail.paths)
        return [top, f"waiting for OTLP JSON Lines in {where}: {stats.lines:,} lines read, no record yet"]
    notes = [f"{len(tail.files):,} files", _size(stats.bytes), f"{stats.lines:,} lines", f"{state.records:,} records"]
    notes.append(f"{state.kept:,} kept")
    if idle is not None:
        notes.append(f"new data {idle:.1f} s ago")
    notes.append(f"view built in {builds.last:.2f} s ({builds.count:,} builds: {builds.cpu:.0f} s of CPU)")
    if stats.rotated or stats.truncated:
        notes.append(f"{stats.rotated} rotated, {stats.truncated} truncated")
    if state.streams_left_out:
        notes.append(f"{state.streams_left_out:,} points of streams beyond {MAX_STREAMS:,} left out")
    if stats.waiting:
        notes.append(f"waiting for {', '.join(stats.waiting)}")
    agents = state.agents
    if agents:
        notes.append(f"agents: {sum(agents.values())} of {len(agents)} ended")
    return [top, "read " + ", ".join(notes)]


def _body(following: Follower, width: int, color: bool) -> list[str]:
    """The report's live sections of what is kept (``terminal.live``)."""
    tel = following.telemetry()
    collecting = gc.isenabled()
    gc.disable()  # the views make many objects in no cycle: reference counting frees them (as in ``cli``)
    try:
        return terminal.live(tel, model.build(tel), width=width, color=color)
    except Exception as exc:  # a view that fails on partial data: said in the frame, the follower goes on
        return ["", f"the live view failed on what is read so far: {type(exc).__name__}: {exc}"]
    finally:
        if collecting:
            gc.enable()


# ---- the loop ----------------------------------------------------------------------------------------------------


def follow(
    paths: Iterable[str | os.PathLike[str]],
    final: Callable[[], int],
    interval: float = DEFAULT_INTERVAL,
    out: IO[str] | None = None,
    width: int = 0,
) -> int:
    """Show the run under ``paths`` live on ``out`` (stdout) until it ends or Ctrl-C, then return ``final()`` (the
    full report, which the caller prints)."""
    out = out or sys.stdout
    tty = out.isatty()
    screen = _Screen(out, tty)
    try:
        _loop(list(paths), interval, screen, width, terminal.use_color(out))
    except KeyboardInterrupt:  # Ctrl-C: the report of what is there
        pass
    finally:
        screen.close()
    return final()


def _loop(paths: list[str | os.PathLike[str]], interval: float, screen: _Screen, width: int, color: bool) -> None:
    following = Follower(paths)
    state, tail = following.state, following.tail
    body: list[str] = []
    built, next_build, shape, builds = -1, 0.0, (0, 0), _Builds()
    ended_at: float | None = None
    last_data: float | None = None
    try:
        while True:
            tick = time.monotonic()
            got = following.read()
            now = time.monotonic()
            if got:
                last_data = now
            columns, rows = _size_of(screen, width)
            moved = state.version != built or (columns, rows) != shape
            behind = now - tick > interval  # more was written while this was read: reading first, for a while
            due = next_build + (CATCH_UP * interval if behind else 0.0)
            if moved and (state.urgent or state.run_over or now >= due):
                cpu = time.process_time()
                body, built, shape = (
                    _body(following, columns, color and screen.tty),
                    state.version,
                    (columns, rows),
                )
                builds.last, builds.count = time.monotonic() - now, builds.count + 1
                builds.cpu += time.process_time() - cpu
                next_build = now + builds.last / BUILD_SHARE
            idle = None if last_data is None else now - last_data
            screen.draw(_header(following, interval, idle, builds), body, columns, rows)
            if state.run_over:
                ended_at = ended_at if ended_at is not None else now
                if (not got and not tail.pending) or now - ended_at > END_GRACE:
                    return
            gc.collect()  # the garbage of this read and redraw (only what is new is walked: the rest is frozen)
            gc.freeze()  # what is kept lives long: the cyclic collector need not walk it again and again
            if not behind:
                time.sleep(max(0.0, tick + interval - time.monotonic()))
    finally:
        following.close()
        gc.unfreeze()


def _size_of(screen: _Screen, width: int) -> tuple[int, int]:
    """(columns, rows) of the view: the terminal's (or ``width``), a report's width elsewhere."""
    size = shutil.get_terminal_size((110, 50)) if screen.tty else os.terminal_size((width or 110, 10**6))
    return max(60, width or size.columns), max(10, size.lines)
