"""Reading OTLP JSON Lines: the OTLP File Exporter format, from any writer.

One JSON object a line, each a ``TracesData``, ``LogsData`` or ``MetricsData`` in OTLP's JSON encoding (ids in
hex, 64-bit integers as strings, lowerCamelCase keys). Written by ``opentelemetry-exporter-otlp-json-file``
(one signal a file) and by the Collector's ``file`` exporter (signals may share a file); ``.gz`` files are read
too. Each span, log record and metric is decoded straight from the parsed JSON into a plain record, by the rules
of OTLP's JSON encoding as the OpenTelemetry library (``opentelemetry.proto_json``) applies them (64-bit integers
as numbers or strings, ids in hex, bytes in base64, the same type checks and error messages), one item at a time,
so one bad item costs only itself. (The library's own decoding builds a message object per value: far more work
than a large run's files allow.) The value rules are ``otlpvalues``; with msgspec (the ``report`` extra) most lines
take a typed path (``typedlines``) that gives the same records, faster; both make them in one ``sink.Sink``.

Nothing read raises: a line that is not JSON, is cut short, is not OTLP, or holds an item the library rejects is
skipped and counted in ``Telemetry.problems`` with where it was; unknown top-level keys are counted and ignored.
A path that does not exist or holds no OTLP JSON Lines file is a ``ReportError`` with a clear message.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import itertools
import json
import os
import pickle
import signal
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from torchelastic_otel.report import figures
from torchelastic_otel.report.otlpvalues import (
    EMPTY,
    NO_EVENTS,
    attributes,
    distribution_of,
    int64,
    intern,
    json_list,
    json_object,
    point_value_of,
    string,
)
from torchelastic_otel.report.records import Distribution, Point, Problems, Proc, SpanEvent, Telemetry
from torchelastic_otel.report.sink import Procs, Sink

__all__ = ["ReportError", "Reader", "read", "find_files"]

#: msgspec's JSON parser (``_loads``), when the ``report`` extra is installed
_FAST_LOADS: Callable[[str], object] | None
try:
    import msgspec.json
except ImportError:  # the standard library's parser
    _FAST_LOADS = None
else:
    _FAST_LOADS = msgspec.json.Decoder().decode

#: the typed path of ``Reader``: with msgspec too
try:
    from torchelastic_otel.report import typedlines
except ImportError:  # every line takes the general path
    typedlines = None  # type: ignore[assignment]

#: File names a directory is searched for (recursively).
PATTERNS = ("*.jsonl", "*.json", "*.jsonl.gz", "*.json.gz", "*.ndjson")
_MAX_DETAIL = 160


class ReportError(Exception):
    """Input the report cannot use at all (no such path, nothing readable); its message is for the user."""


# ---- finding files -------------------------------------------------------------------------------------------


def find_files(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The files named, and those under the directories named (sorted); a missing path is a ``ReportError``."""
    return [Path(p) for p in _find(paths)]


def _find(paths: Iterable[str | os.PathLike[str]]) -> list[str]:
    """``find_files``, each file as the text of its ``Path``: what ``read`` reads, without the ``Path`` objects (a
    large run's hundred thousand files would hold tens of megabytes while it is read)."""
    found: list[str] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            inside = _walk(path)
            if not inside:
                raise ReportError(f"{path}: no OTLP JSON Lines files ({', '.join(PATTERNS)}) in this directory")
            found.extend(inside)
        elif path.is_file():
            found.append(str(path))
        else:
            raise ReportError(f"{path}: no such file or directory")
    if not found:
        raise ReportError("no input: name OTLP JSON Lines files or directories holding them")
    return list(dict.fromkeys(found))


#: the file name endings of ``PATTERNS``, matched in one pass over a directory tree
_SUFFIXES = tuple(pattern[1:] for pattern in PATTERNS)


def _walk(top: Path) -> list[str]:
    """The files under ``top`` whose names match ``PATTERNS``, sorted as paths, in one walk of the tree with the
    types the directory listing gives (not an ``rglob`` a pattern and a ``stat`` a file: a large run has a hundred
    thousand files). Symbolic links are followed, each real directory once (a link cycle ends)."""
    found: list[str] = []
    seen: set[tuple[int, int]] = set()
    pending = [str(top)]
    while pending:
        directory = pending.pop()
        try:
            stat = os.stat(directory)
            if (stat.st_dev, stat.st_ino) in seen:
                continue
            seen.add((stat.st_dev, stat.st_ino))
            with os.scandir(directory) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir():
                            pending.append(entry.path)
                        elif entry.name.endswith(_SUFFIXES) and entry.is_file():
                            found.append(entry.path)
                    except OSError:
                        continue
        except OSError:  # vanished or unreadable while walked: what could be listed is read
            continue
    found.sort(key=lambda p: p.split(os.sep))  # in the order of ``Path.parts``
    if str(top) == os.curdir:  # ``./a.jsonl`` as its ``Path`` writes it: ``a.jsonl``
        return [p[len(os.curdir) + 1 :] for p in found]
    return found


def _head_lines(head: str, fh: IO[str]) -> Iterator[str]:
    """The lines ``head`` (what was read of ``fh`` first) begins, the last one completed from ``fh``: the lines
    ``fh`` itself would have given, without reading (and decoding) its beginning twice."""
    *whole, rest = head.split("\n")
    for line in whole:
        yield line + "\n"
    if rest:
        yield rest + fh.readline()


#: files up to this size (bytes, not gzipped) are read whole and then split into lines: a large run has a hundred
#: thousand small files, and a text stream per file costs more than its lines; larger ones are read as a stream
WHOLE_BYTES = 16 * 1024 * 1024


def _small_text(path: str) -> str | None:
    """The text of the file at ``path`` as ``_open`` reads it (UTF-8, errors replaced, universal newlines), if it is
    no larger than ``WHOLE_BYTES`` and not gzipped; else None (to be streamed)."""
    if os.path.splitext(path)[1] == ".gz":
        return None
    with open(path, "rb") as fh:
        if os.fstat(fh.fileno()).st_size > WHOLE_BYTES:
            return None
        data = fh.read()
    text = data.decode("utf-8", errors="replace")
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def _lines(text: str) -> Iterator[str]:
    """The lines of ``text``, each with its newline (the last one's, if it has one), as a text file gives them."""
    start, size = 0, len(text)
    find = text.find
    while start < size:
        end = find("\n", start) + 1 or size
        yield text[start:end]
        start = end


@contextlib.contextmanager
def _file_lines(path: str) -> Iterator[tuple[str, Iterator[str]]]:
    """The head of the file at ``path`` (its first ``HEAD_CHARS`` characters) and its lines, the head's among them: a
    small file read whole, a large or gzipped one as a stream (``_small_text``)."""
    text = _small_text(path)
    if text is not None:
        yield text[:HEAD_CHARS], _lines(text)
        return
    with _open(path) as fh:
        head = fh.read(HEAD_CHARS)
        yield head, itertools.chain(_head_lines(head, fh), fh)


#: the characters of a file's beginning that tell whether it is binary (``binary_counted``)
HEAD_CHARS = 256


def binary_counted(head: str, problems: Problems, path: str) -> bool:
    """Whether the file at ``path``, beginning with ``head`` (its first ``HEAD_CHARS`` characters, decoded with
    replacement), is binary (e.g. the Collector's protobuf file format); if so, it is counted in ``problems``. The
    reader and the follower (``follow``) tell and count a binary file alike."""
    if "\x00" in head or "\ufffd" in head:
        problems.add("not_json_lines", path, "a binary file, not UTF-8 JSON lines")
        return True
    return False


def _open(path: str | Path) -> IO[str]:
    if os.path.splitext(path)[1] == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")


# ---- one line ------------------------------------------------------------------------------------------------

#: top-level key -> (scope list key, item list key, signal)
_SIGNALS = {
    "resourceSpans": ("scopeSpans", "spans", "traces"),
    "resourceLogs": ("scopeLogs", "logRecords", "logs"),
    "resourceMetrics": ("scopeMetrics", "metrics", "metrics"),
}


#: top-level key -> how a line of it begins, up to its first resource (the OTLP File Exporter's and the Collector's
#: compact JSON)
_HEADS = {key: '{"' + key + '":[{"resource":' for key in _SIGNALS}
_QUOTED = {key: f'"{key}"' for key in _SIGNALS}
_DECODER = json.JSONDecoder()


def _resource_first(line: str) -> str | None:
    """The signal whose first block's resource ``line`` begins with (``_HEADS``), if it names that signal once
    (JSON keeps the second of two equal keys: such a line is parsed whole)."""
    key = next((key for key, head in _HEADS.items() if line.startswith(head)), None)
    if key is None or line.count(_QUOTED[key], len(_HEADS[key])) != 0:
        return None
    return key


@dataclass(frozen=True)
class _KnownResource:
    """The text a line began with up to the end of its first resource, and that resource's process."""

    prefix: str
    head: str  # the prefix up to the resource (``_HEADS``)
    key: str  # the signal's key, quoted: a line naming it again is parsed whole
    proc: Proc

    @property
    def signal(self) -> str:
        """The signal's top-level key."""
        return self.key[1:-1]


class Reader:
    """Reads files into one ``Telemetry``; each item decoded by the library, converted to a plain record. With
    ``summary``, a worker's plain spans and the log records that are no event of the bridge's are folded as they
    are read (``sink.Sink``): enough for the summary (``report --json``), not for the views that draw them."""

    def __init__(self, summary: bool = False) -> None:
        #: where both paths put what they read
        self.sink = Sink(fold=summary)
        self.summary = summary
        self.telemetry, self.procs = self.sink.telemetry, self.sink.procs
        #: the resource text the last line began with (``_known_resource``)
        self._resource: _KnownResource | None = None
        #: the fast path, with msgspec (the ``report`` extra)
        self._typed = (
            typedlines.TypedLines(self.sink, short_texts=summary)
            if typedlines is not None and _FAST_LOADS is not None
            else None
        )
        self._convert: dict[str, Callable[[object, Proc], None]] = {
            "traces": self._add_span,
            "logs": self._add_log,
            "metrics": self._add_metric,
        }

    def forget(self) -> None:
        """Forget what only makes reading faster and the records smaller (the decoded ids, the index of shared
        attribute sets, the typed path's texts: much memory on a large run): before the reading helper's records
        are loaded, when they are no longer of use. The reader can read on, starting them again."""
        self.sink.forget()
        self._resource = None
        if self._typed is not None:
            self._typed.forget()

    def close(self) -> None:
        """``forget``, and the reader's reference cycles (its converters, its typed path), so that reference
        counting frees it as reading ends: the report builds its views with cyclic collection off. The telemetry
        stays; the reader reads no more."""
        self.forget()
        self._typed, self._convert = None, {}

    def read_file(self, path: str | Path) -> None:
        problems = self.telemetry.problems
        name = str(path)
        self.telemetry.files.append(name)
        try:
            with _file_lines(name) as (head, lines):
                if binary_counted(head, problems, name):
                    return
                for lineno, line in enumerate(lines, 1):
                    self.read_line(line, f"{name}:{lineno}")
        except (OSError, EOFError, UnicodeError) as exc:  # unreadable, or a .gz cut short
            problems.add("unreadable_file", name, str(exc)[:_MAX_DETAIL])

    def read_line(self, line: str, where: str) -> None:
        problems = self.telemetry.problems
        if not line or line.isspace():  # not ``strip``: a copy of every line
            return
        self.telemetry.lines += 1
        text, pinned = self._known_resource(line)
        if self._typed is not None and self._read_typed(line, text, pinned):
            return
        try:
            data = _loads(text)
        except ValueError as exc:
            if pinned is not None:  # the error as the whole line has it (a cut line's positions are shifted)
                exc = _error_of(line) or exc
            reason = "truncated_line" if not line.endswith("\n") else "malformed_json"
            problems.add(reason, where, str(exc)[:_MAX_DETAIL])
            return
        if not isinstance(data, dict):
            problems.add("not_otlp", where, f"a JSON {type(data).__name__}, not an object")
            return
        known = [key for key in data if key in _SIGNALS]
        unknown = [key for key in data if key not in _SIGNALS]
        if not known:
            keys = ", ".join(sorted(map(str, data))[:5]) or "none"
            problems.add("not_otlp", where, f"no resourceSpans/resourceLogs/resourceMetrics (keys: {keys})")
            return
        if unknown:
            problems.add("unknown_field", where, ", ".join(sorted(unknown)[:5]))
        for key in known:
            self._read_resources(key, data[key], where, pinned if key == known[0] else None)
        if pinned is None:
            self._learn_resource(line, data, known[0])

    # ---- a line's resource, as the last line's -------------------------------------------------------------------
    #
    # Every line a process writes repeats its resource (a third of a worker's bytes: 19 attributes); a file's lines
    # are mostly one process's. When a line begins with the very text of the last line's resource, that text is
    # not parsed again: it is cut out (an empty object in its place) and its process is the last line's. Only when
    # the line names its signal once (no second key of the same name could replace the first block) and the text
    # was checked to be exactly one JSON object, equal to the resource parsed from it.

    def _read_typed(self, line: str, text: str, pinned: Proc | None) -> bool:
        """The line read by the fast path (``typedlines``), if it takes it (False: nothing of it kept)."""
        typed = self._typed
        assert typed is not None
        try:
            parsed = typed.read(text, pinned, self._resource.signal if pinned is not None and self._resource else None)
        except typedlines.Bail:
            return False
        if pinned is None:
            self._learn_typed(line, typed, parsed)
        return True

    def _learn_typed(self, line: str, typed: typedlines.TypedLines, parsed: typedlines.Line) -> None:
        """``_learn_resource`` for a line the typed path read: its first resource's text and process are those
        the typed path found (the text as the parser delimited it, the process already made from it)."""
        self._resource = None
        key = _resource_first(line)
        if key is None:
            return
        text, proc = typed.first_resource(parsed, key)
        end = len(_HEADS[key]) + len(text)
        if text.startswith("{") and line.startswith(text, len(_HEADS[key])) and line[end : end + 1] in (",", "}"):
            self._resource = _KnownResource(line[:end], _HEADS[key], _QUOTED[key], proc)

    def _known_resource(self, line: str) -> tuple[str, Proc | None]:
        """(the text to parse, the process of its first resource block when its resource text was cut out)."""
        known = self._resource
        if known is None or not line.startswith(known.prefix):
            return line, None
        after = len(known.prefix)
        if line.count(known.key, after) != 0:
            return line, None
        return known.head + "{}" + line[after:], known.proc

    def _learn_resource(self, line: str, data: dict[str, object], key: str) -> None:
        """Remember the resource text this line begins with, if it begins with one (``_known_resource``)."""
        head = _HEADS[key]
        if _resource_first(line) != key:
            self._resource = None
            return
        try:
            resource, end = _DECODER.raw_decode(line, len(head))
            blocks = data[key]
            block = blocks[0] if isinstance(blocks, list) else None
            if (
                type(resource) is not dict
                or not isinstance(block, dict)
                or resource != block.get("resource")
                or line[end : end + 1] not in (",", "}")
            ):
                raise ValueError("not the block's resource")
            proc = self.procs.get(block["resource"])
        except (ValueError, TypeError, AttributeError, KeyError, IndexError):
            self._resource = None
            return
        self._resource = _KnownResource(line[:end], head, _QUOTED[key], proc)

    def _read_resources(self, key: str, blocks: object, where: str, pinned: Proc | None = None) -> None:
        """The blocks of one signal; the first one's process is ``pinned`` when its resource text was cut out."""
        scope_key, item_key, signal = _SIGNALS[key]
        convert = self._convert[signal]
        if not isinstance(blocks, list):
            self.telemetry.problems.add("invalid_otlp", where, f"{key} is not a list")
            return
        for index, block in enumerate(blocks):
            proc = pinned if index == 0 and pinned is not None else self._proc(block, where)
            if proc is None:
                continue
            scopes = block.get(scope_key) or []
            if not isinstance(scopes, list):
                self.telemetry.problems.add("invalid_otlp", where, f"{scope_key} is not a list")
                continue
            for scope in scopes:
                items = scope.get(item_key) if isinstance(scope, dict) else None
                for item in items if isinstance(items, list) else []:
                    try:
                        convert(item, proc)
                    except (TypeError, ValueError, AttributeError, KeyError) as exc:
                        self.telemetry.problems.add(f"invalid_{signal}_item", where, str(exc)[:_MAX_DETAIL])

    def _proc(self, block: Any, where: str) -> Proc | None:  # Any: a block as written, a dict or not (counted)
        try:
            return self.procs.get(block.get("resource") or {})
        except (TypeError, ValueError, AttributeError) as exc:
            self.telemetry.problems.add("invalid_resource", where, str(exc)[:_MAX_DETAIL])
            return None

    # ---- items ------------------------------------------------------------------------------------------------

    # The three below run once per record, millions of times on a large run: the common case (a dict, 64-bit
    # integers as decimal strings, ids already seen) is tested inline; anything else goes through the checks above,
    # in the same order, so a bad item fails with the same message.

    def _add_span(self, raw: object, proc: Proc) -> None:
        span = raw if type(raw) is dict else json_object(raw, "data")
        get = span.get
        status = get("status")
        status = (status if type(status) is dict else json_object(status, "status")) if status is not None else EMPTY
        start = int64(get("startTimeUnixNano"), "start_time_unix_nano")
        end = int64(get("endTimeUnixNano"), "end_time_unix_nano")
        events = NO_EVENTS
        raw_events = get("events")
        if raw_events is not None and (type(raw_events) is not list or raw_events):
            for event in json_list(raw_events, "events"):
                event = json_object(event, "data")
                events = [] if events is NO_EVENTS else events
                events.append(
                    SpanEvent(
                        intern(string(event.get("name"), "name")),
                        int64(event.get("timeUnixNano"), "time_unix_nano"),
                        self.sink.shared(attributes(event.get("attributes"))),
                    )
                )
        links = get("links")
        if links is not None and type(links) is not list:
            json_list(links, "links")
        self.sink.span(
            get("traceId"),
            get("spanId"),
            get("parentSpanId"),
            get("name"),
            start,
            end,
            get("attributes"),
            self.sink.json_attributes,
            status,
            events,
            proc,
        )

    def _add_log(self, raw: object, proc: Proc) -> None:
        record = raw if type(raw) is dict else json_object(raw, "data")
        get = record.get
        self.sink.log(
            get("timeUnixNano"),
            get("observedTimeUnixNano"),
            get("severityNumber"),
            get("severityText"),
            get("body"),
            get("eventName"),
            get("attributes"),
            self.sink.json_attributes,
            get("traceId"),
            get("spanId"),
            proc,
        )

    def _add_metric(self, raw: object, proc: Proc) -> None:
        metric = raw if type(raw) is dict else json_object(raw, "data")
        name, unit = metric.get("name"), metric.get("unit")
        name = intern(name if type(name) is str else string(name, "name"))
        unit = intern(unit if type(unit) is str else string(unit, "unit"))
        out = self.telemetry.points
        shared = self.sink.shared
        for kind, key in _METRIC_KINDS:
            data = metric.get(key)
            if data is None:
                continue
            data = json_object(data, kind)
            monotonic = bool(data.get("isMonotonic", False))
            for dp in json_list(data.get("dataPoints"), "data_points"):
                dp = dp if type(dp) is dict else json_object(dp, "data")
                number, count = point_value_of(kind, dp)
                point = Point(
                    name,
                    kind,
                    unit,
                    int64(dp.get("timeUnixNano"), "time_unix_nano"),
                    number,
                    shared(attributes(dp.get("attributes"))),
                    proc,
                    monotonic,
                    count,
                )
                if isinstance(point, Distribution):  # a histogram's (``Point``)
                    distribution_of(point, dp)
                    point.bounds = self.sink.shared_bounds(point.bounds)
                out.append(point)


_METRIC_KINDS = (
    ("gauge", "gauge"),
    ("sum", "sum"),
    ("histogram", "histogram"),
    ("exponential_histogram", "exponentialHistogram"),
    ("summary", "summary"),
)


def _loads(text: str) -> object:
    """``json.loads``, by msgspec's parser when it is installed (the ``report`` extra), which is faster (parsing is
    much of the reading time of a large run). Whatever it does not take (``NaN``, ``Infinity``, a number beyond a
    double, a lone surrogate, not JSON) the standard parser decides, so the result and the errors are
    ``json.loads``'s; on valid JSON both give equal values (the same Python types: dicts in key order, the last of
    two equal keys, ints of any size)."""
    if _FAST_LOADS is not None:
        try:
            return _FAST_LOADS(text)
        except ValueError:  # msgspec.DecodeError (and its ValidationError) is a ValueError
            pass
    return json.loads(text)


def _error_of(line: str) -> ValueError | None:
    """The error parsing ``line`` raises (None if it parses)."""
    try:
        json.loads(line)
    except ValueError as exc:
        return exc
    return None


def read(paths: Iterable[str | os.PathLike[str]], summary: bool = False) -> Telemetry:
    """Every span, log record and metric point in the OTLP JSON Lines files at ``paths`` (files or directories);
    with ``summary``, only what the summary (``training.summary``, ``report --json``) reads of a worker's plain
    spans and of the log records that are no event of the bridge's (``Reader``): less memory and time on a large
    run.

    Raises ``ReportError`` when a path does not exist or nothing in the files is OTLP.
    """
    reader = Reader(summary)
    collecting = gc.isenabled()
    gc.disable()  # millions of records, none in a cycle: the cyclic collector would only rescan them again and again
    try:
        _read_files(reader, _find(paths))
    finally:
        reader.close()
        if collecting:
            gc.enable()
    tel = reader.telemetry
    if not (tel.spans or tel.logs or tel.points):
        details = "; ".join(tel.problems.examples[:3])
        raise ReportError(
            f"no OTLP spans, log records or metric points in {len(tel.files)} file(s)"
            + (f" ({details})" if details else "")
        )
    figures.screen(tel)  # the bridge's figures no duration, size or count can be: left out, counted
    return tel


# ---- reading on two CPUs -------------------------------------------------------------------------------------

#: inputs smaller than this (bytes) are read in this process alone: a helper costs more than it saves
PARALLEL_BYTES = 64 * 1024 * 1024
#: records a helper pickles at a time (it never holds all of its half at once)
_BATCH = 20_000


def _read_files(reader: Reader, files: list[str]) -> None:
    """Read ``files`` in order into ``reader``: on a machine with more than one CPU and a large input, the second
    half in a forked helper process at the same time (it pickles its records, a batch at a time, into a temporary
    file, which is then loaded after the first half: the same records in the same order as one process reads them,
    in less wall time when a second core is free: decoding is most of the work, loading pickles a tenth of it; it
    costs CPU time, the helper's pickling). If the helper cannot start or fails, this process reads its files
    too: the result is the same, only slower."""
    sizes = [_size(path) for path in files]
    half = _split(sizes) if _parallel_worth(sum(sizes)) else len(files)
    helper = _Helper.start(files[half:], reader.summary) if half < len(files) else None
    try:
        for path in files[:half]:
            reader.read_file(path)
    except BaseException:  # interrupted (^C): no helper left behind, nor its file
        if helper is not None:
            helper.abandon()
        raise
    if helper is not None:
        reader.forget()  # the memory for the helper's records
    if helper is None or not helper.merge_into(reader):
        for path in files[half:]:
            reader.read_file(path)


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _parallel_worth(total: int) -> bool:
    """Whether files of ``total`` bytes are worth a helper."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cpus > 1 and hasattr(os, "fork") and total >= PARALLEL_BYTES


#: the share of the bytes the helper reads, so that both halves end together (tuned on a large run, docs/scale.md:
#: files are read in name order, so this process reads the logs and the first metrics files, the helper the other
#: metrics files, the dearest a byte, and the traces; the helper also pickles its records, and this process then
#: loads them: about as much work)
HELPER_SHARE = 0.50


def _split(sizes: list[int]) -> int:
    """The index of the file from which the helper reads (``HELPER_SHARE`` of the bytes, by whole files)."""
    total, seen = sum(sizes), 0
    for i, size in enumerate(sizes):
        seen += size
        if seen >= (1 - HELPER_SHARE) * total:
            return i + 1
    return len(sizes)


class _Helper:
    """A forked process reading some files into pickled batches in a temporary file (deleted when merged)."""

    def __init__(self, pid: int, path: str) -> None:
        self.pid, self.path = pid, path

    @classmethod
    def start(cls, files: list[str], summary: bool = False) -> _Helper | None:
        try:
            fd, path = tempfile.mkstemp(prefix="torchelastic-report-", suffix=".pickle")
        except OSError:
            return None
        try:
            pid = os.fork()
        except OSError:
            os.close(fd)
            os.unlink(path)
            return None
        if pid == 0:  # the helper: never returns
            status = 1
            try:
                with os.fdopen(fd, "wb") as out:
                    _read_into(files, out, summary)
                status = 0
            finally:
                os._exit(status)
        os.close(fd)
        return cls(pid, path)

    def abandon(self) -> None:
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    def merge_into(self, reader: Reader) -> bool:
        """Append the helper's records to ``reader``'s (False, nothing appended, if the helper failed)."""
        try:
            _, status = os.waitpid(self.pid, 0)
            if status != 0:
                return False
            tel = reader.telemetry
            sizes = (len(tel.spans), len(tel.logs), len(tel.points))
            try:
                with open(self.path, "rb") as fh:
                    _load_into(fh, reader)
            except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError, AttributeError):
                del tel.spans[sizes[0] :], tel.logs[sizes[1] :], tel.points[sizes[2] :]
                return False
            return True
        finally:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


def _read_into(files: list[str], out: IO[bytes], summary: bool = False) -> None:
    """The helper's work: read ``files``, pickle the records a batch at a time, then what else was read."""
    reader = Reader(summary)
    tel = reader.telemetry
    for path in files:
        reader.read_file(path)
        if len(tel.spans) + len(tel.logs) + len(tel.points) >= _BATCH:
            pickle.dump((tel.spans, tel.logs, tel.points), out, protocol=pickle.HIGHEST_PROTOCOL)
            tel.spans, tel.logs, tel.points = [], [], []
            reader.sink.restart_folds()  # the spans kept are handed over: none is folded into any more
    pickle.dump((tel.spans, tel.logs, tel.points), out, protocol=pickle.HIGHEST_PROTOCOL)
    pickle.dump((tel.files, tel.lines, tel.problems.counts, tel.problems.examples), out)


def _load_into(fh: IO[bytes], reader: Reader) -> None:
    """Append the helper's batches, each record's process made this reader's own, then its files and problems."""
    tel, procs = reader.telemetry, reader.procs
    while True:
        batch = pickle.load(fh)
        if len(batch) == 4:  # the last: files, lines, problems
            files, lines, counts, examples = batch
            tel.files.extend(files)
            tel.lines += lines
            tel.problems.counts.update(counts)
            room = tel.problems.max_examples - len(tel.problems.examples)
            tel.problems.examples.extend(examples[: max(0, room)])
            return
        spans, logs, points = batch
        canonical = _Canonical(procs)
        for span in spans:
            span.proc = canonical(span.proc)
        for log in logs:
            log.proc = canonical(log.proc)
        for point in points:
            point.proc = canonical(point.proc)
        tel.spans.extend(spans)
        tel.logs.extend(logs)
        tel.points.extend(points)


class _Canonical:
    """The reader's own object for each process of one unpickled batch: a batch's records share its processes
    (pickle keeps one object for each), so each is looked up once, by id (not compared field by field for each of
    the millions of records of a large run). The batch's objects are kept alive while it is loaded: their ids stay
    theirs."""

    def __init__(self, procs: Procs) -> None:
        self._procs = procs
        self._seen: dict[int, tuple[Proc, Proc]] = {}

    def __call__(self, proc: Proc) -> Proc:
        found = self._seen.get(id(proc))
        if found is None:
            found = self._seen[id(proc)] = (proc, self._procs.canonical(proc))
        return found[1]
