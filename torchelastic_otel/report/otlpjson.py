"""Reading OTLP JSON Lines: the OTLP File Exporter format, from any writer.

One JSON object a line, each a ``TracesData``, ``LogsData`` or ``MetricsData`` in OTLP's JSON encoding (ids in
hex, 64-bit integers as strings, lowerCamelCase keys). Written by ``opentelemetry-exporter-otlp-json-file``
(one signal a file) and by the Collector's ``file`` exporter (signals may share a file); ``.gz`` files are read
too. The decoding is the OpenTelemetry library's own (``opentelemetry.proto_json``), one span, log record or
metric at a time, so one bad item costs only itself.

Nothing read raises: a line that is not JSON, is cut short, is not OTLP, or holds an item the library rejects is
skipped and counted in ``Telemetry.problems`` with where it was; unknown top-level keys are counted and ignored.
A path that does not exist or holds no OTLP JSON Lines file is a ``ReportError`` with a clear message.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from torchelastic_otel import _names as names
from torchelastic_otel.report.records import LogRecord, Point, Proc, Span, SpanEvent, Telemetry

__all__ = ["ReportError", "read", "find_files"]

#: File names a directory is searched for (recursively).
PATTERNS = ("*.jsonl", "*.json", "*.jsonl.gz", "*.json.gz", "*.ndjson")
_MAX_DETAIL = 160


class ReportError(Exception):
    """Input the report cannot use at all (no such path, nothing readable); its message is for the user."""


def _library() -> Any:
    """``opentelemetry.proto_json``'s message classes; a clear error where the package is missing."""
    try:
        from opentelemetry.proto_json.common.v1.common import InstrumentationScope
        from opentelemetry.proto_json.logs.v1.logs import LogRecord as OtlpLogRecord
        from opentelemetry.proto_json.metrics.v1.metrics import Metric
        from opentelemetry.proto_json.resource.v1.resource import Resource
        from opentelemetry.proto_json.trace.v1.trace import Span as OtlpSpan
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ReportError(
            f"reading OTLP JSON needs opentelemetry-proto-json ({exc}); "
            'install it with: pip install --pre "torchelastic-otel[file]"'
        ) from None
    return Resource, InstrumentationScope, OtlpSpan, OtlpLogRecord, Metric


# ---- finding files -------------------------------------------------------------------------------------------


def find_files(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The files named, and those under the directories named (sorted); a missing path is a ``ReportError``."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            inside = sorted({p for pattern in PATTERNS for p in path.rglob(pattern) if p.is_file()})
            if not inside:
                raise ReportError(f"{path}: no OTLP JSON Lines files ({', '.join(PATTERNS)}) in this directory")
            found.extend(inside)
        elif path.is_file():
            found.append(path)
        else:
            raise ReportError(f"{path}: no such file or directory")
    if not found:
        raise ReportError("no input: name OTLP JSON Lines files or directories holding them")
    return list(dict.fromkeys(found))


def _open(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")


# ---- values --------------------------------------------------------------------------------------------------


def value(any_value: Any) -> Any:
    """A plain Python value from an ``AnyValue`` (bytes as hex, key-value lists as dicts)."""
    if any_value is None:
        return None
    if any_value.string_value is not None:
        return any_value.string_value
    if any_value.int_value is not None:
        return any_value.int_value
    if any_value.double_value is not None:
        return any_value.double_value
    if any_value.bool_value is not None:
        return any_value.bool_value
    if any_value.array_value is not None:
        return [value(v) for v in any_value.array_value.values]
    if any_value.kvlist_value is not None:
        return attributes(any_value.kvlist_value.values)
    if any_value.bytes_value is not None:
        return any_value.bytes_value.hex()
    return None


def attributes(key_values: Iterable[Any]) -> dict[str, Any]:
    return {kv.key: value(kv.value) for kv in key_values}


def _int(raw: Any) -> int | None:
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None


class _Procs:
    """One ``Proc`` per distinct resource (every batch of a process repeats its resource)."""

    def __init__(self) -> None:
        self._cache: dict[str, Proc] = {}

    def get(self, resource: dict[str, Any]) -> Proc:
        key = json.dumps(resource, sort_keys=True, default=str)
        proc = self._cache.get(key)
        if proc is None:
            proc = self._cache[key] = self._make(resource)
        return proc

    @staticmethod
    def _make(res: dict[str, Any]) -> Proc:
        rank = _int(res.get(names.RANK))
        kind = str(res.get(names.PROCESS_KIND) or ("worker" if rank is not None else "process"))
        return Proc(
            kind=kind if kind in ("agent", "worker") else "process",
            host=str(res.get("host.name", "")),
            pid=_int(res.get("process.pid")),
            run_id=None if res.get(names.RUN_ID) is None else str(res[names.RUN_ID]),
            rank=rank,
            local_rank=_int(res.get(names.LOCAL_RANK)),
            restart=_int(res.get(names.RESTART_COUNT)),
            service=str(res.get("service.name", "unknown_service")),
        )


# ---- one line ------------------------------------------------------------------------------------------------

#: top-level key -> (scope list key, item list key, signal)
_SIGNALS = {
    "resourceSpans": ("scopeSpans", "spans", "traces"),
    "resourceLogs": ("scopeLogs", "logRecords", "logs"),
    "resourceMetrics": ("scopeMetrics", "metrics", "metrics"),
}


class Reader:
    """Reads files into one ``Telemetry``; each item decoded by the library, converted to a plain record."""

    def __init__(self) -> None:
        self.telemetry = Telemetry()
        self._procs = _Procs()
        (self._Resource, self._Scope, self._Span, self._LogRecord, self._Metric) = _library()
        self._convert: dict[str, Callable[[Any, Proc], None]] = {
            "traces": self._add_span,
            "logs": self._add_log,
            "metrics": self._add_metric,
        }

    def read_file(self, path: Path) -> None:
        problems = self.telemetry.problems
        self.telemetry.files.append(str(path))
        try:
            with _open(path) as fh:
                head = fh.read(256)
                if "\x00" in head or "\ufffd" in head:  # binary, e.g. the Collector's protobuf file format
                    problems.add("not_json_lines", str(path), "a binary file, not UTF-8 JSON lines")
                    return
                fh.seek(0)
                for lineno, line in enumerate(fh, 1):
                    self.read_line(line, f"{path}:{lineno}")
        except (OSError, EOFError, UnicodeError) as exc:  # unreadable, or a .gz cut short
            problems.add("unreadable_file", str(path), str(exc)[:_MAX_DETAIL])

    def read_line(self, line: str, where: str) -> None:
        problems = self.telemetry.problems
        if not line.strip():
            return
        self.telemetry.lines += 1
        try:
            data = json.loads(line)
        except ValueError as exc:
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
            self._read_resources(key, data[key], where)

    def _read_resources(self, key: str, blocks: Any, where: str) -> None:
        scope_key, item_key, signal = _SIGNALS[key]
        convert = self._convert[signal]
        if not isinstance(blocks, list):
            self.telemetry.problems.add("invalid_otlp", where, f"{key} is not a list")
            return
        for block in blocks:
            proc = self._proc(block, where)
            if proc is None:
                continue
            for scope in block.get(scope_key) or []:
                items = scope.get(item_key) if isinstance(scope, dict) else None
                for item in items if isinstance(items, list) else []:
                    try:
                        convert(item, proc)
                    except (TypeError, ValueError, AttributeError, KeyError) as exc:
                        self.telemetry.problems.add(f"invalid_{signal}_item", where, str(exc)[:_MAX_DETAIL])

    def _proc(self, block: Any, where: str) -> Proc | None:
        try:
            resource = self._Resource.from_dict(block.get("resource") or {})
        except (TypeError, ValueError, AttributeError) as exc:
            self.telemetry.problems.add("invalid_resource", where, str(exc)[:_MAX_DETAIL])
            return None
        return self._procs.get(attributes(resource.attributes))

    # ---- items ------------------------------------------------------------------------------------------------

    def _add_span(self, raw: Any, proc: Proc) -> None:
        span = self._Span.from_dict(raw)
        status = span.status
        self.telemetry.spans.append(
            Span(
                trace_id=(span.trace_id or b"").hex(),
                span_id=(span.span_id or b"").hex(),
                parent_id=(span.parent_span_id or b"").hex(),
                name=span.name or "",
                start=span.start_time_unix_nano or 0,
                end=max(span.end_time_unix_nano or 0, span.start_time_unix_nano or 0),
                attrs=attributes(span.attributes),
                status_code=int(status.code or 0) if status is not None else 0,
                status_message=(status.message or "") if status is not None else "",
                events=[SpanEvent(e.name or "", e.time_unix_nano or 0, attributes(e.attributes)) for e in span.events],
                proc=proc,
            )
        )

    def _add_log(self, raw: Any, proc: Proc) -> None:
        record = self._LogRecord.from_dict(raw)
        self.telemetry.logs.append(
            LogRecord(
                time=record.time_unix_nano or record.observed_time_unix_nano or 0,
                severity=int(record.severity_number or 0),
                severity_text=record.severity_text or "",
                body=value(record.body),
                event_name=record.event_name or "",
                attrs=attributes(record.attributes),
                trace_id=(record.trace_id or b"").hex(),
                span_id=(record.span_id or b"").hex(),
                proc=proc,
            )
        )

    def _add_metric(self, raw: Any, proc: Proc) -> None:
        metric = self._Metric.from_dict(raw)
        name, unit, out = metric.name or "", metric.unit or "", self.telemetry.points
        for kind in ("gauge", "sum", "histogram", "exponential_histogram", "summary"):
            data = getattr(metric, kind)
            if data is None:
                continue
            monotonic = bool(getattr(data, "is_monotonic", False))
            for dp in data.data_points:
                number, count = _point_value(kind, dp)
                point = Point(name, kind, unit, dp.time_unix_nano or 0, number, attributes(dp.attributes), proc,
                              monotonic, count)  # fmt: skip
                if kind == "histogram":
                    _distribution(point, dp)
                out.append(point)


def _point_value(kind: str, dp: Any) -> tuple[float | None, int | None]:
    """(the number to plot, the count of a histogram/summary): a number point's value, a distribution's mean."""
    if kind in ("gauge", "sum"):
        raw = dp.as_double if dp.as_double is not None else dp.as_int
        return (None if raw is None else float(raw)), None
    count = dp.count or 0
    total = dp.sum
    return (float(total) / count if count and total is not None else None), count


def _distribution(point: Point, dp: Any) -> None:
    """An explicit-bucket histogram point's sum, bounds, bucket counts, min and max (buckets that do not match
    their bounds are dropped: the point keeps its mean)."""
    point.total = None if dp.sum is None else float(dp.sum)
    bounds = tuple(float(b) for b in dp.explicit_bounds or ())
    buckets = tuple(int(n) for n in dp.bucket_counts or ())
    if buckets and len(buckets) == len(bounds) + 1 and all(n >= 0 for n in buckets):
        point.bounds, point.buckets = bounds, buckets
    point.low = None if dp.min is None else float(dp.min)
    point.high = None if dp.max is None else float(dp.max)


def read(paths: Iterable[str | os.PathLike[str]]) -> Telemetry:
    """Every span, log record and metric point in the OTLP JSON Lines files at ``paths`` (files or directories).

    Raises ``ReportError`` when a path does not exist or nothing in the files is OTLP.
    """
    reader = Reader()
    for path in find_files(paths):
        reader.read_file(path)
    tel = reader.telemetry
    if not (tel.spans or tel.logs or tel.points):
        details = "; ".join(tel.problems.examples[:3])
        raise ReportError(
            f"no OTLP spans, log records or metric points in {len(tel.files)} file(s)"
            + (f" ({details})" if details else "")
        )
    return tel
