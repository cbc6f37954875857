"""The job's metrics for the report: a table of last values per process, and per-rank series to chart.

A metric stream is a name plus its point attributes (``metric_group`` left out of the label: it is the group the
value was put in). The table gives each stream's last value in the agent and in each rank (from the rank's latest
worker); the charts follow the streams the workers exported, one line per worker process (rank and restart), a
distribution as its mean. Both are bounded: ``max_rows`` streams, ``max_ranks`` rank columns, ``max_charts``
charts of ``max_points`` points a line (evenly thinned, first and last kept).
"""

from __future__ import annotations

import collections
import itertools
import json
import operator
from dataclasses import dataclass, field

from torchelastic_otel.report.records import Attrs, Point, Proc


@dataclass
class Stream:
    name: str
    attrs: Attrs
    kind: str
    unit: str
    points: list[Point] = field(default_factory=list)

    @property
    def label(self) -> str:
        """``name{key=value, ...}`` without ``metric_group``."""
        shown = {k: v for k, v in self.attrs.items() if k != "metric_group"}
        return self.name + ("{" + ", ".join(f"{k}={v}" for k, v in shown.items()) + "}" if shown else "")

    @property
    def short_label(self) -> str:
        """``name{value, ...}``: the attribute values only, for narrow columns."""
        shown = [str(v) for k, v in self.attrs.items() if k != "metric_group"]
        return self.name + ("{" + ", ".join(shown) + "}" if shown else "")

    @property
    def user(self) -> bool:
        """Put by the job itself (any group but torch's own ``torchelastic``, and not the bridge's health)."""
        group = self.attrs.get("metric_group")
        return group not in (None, "torchelastic") and not self.name.startswith("torchelastic_otel.")


@dataclass
class Table:
    columns: list[str]
    rows: list[tuple[Stream, list[str]]]
    left_out_rows: int = 0
    left_out_columns: int = 0


_PROC_OF = operator.attrgetter("proc")


def streams(points: list[Point]) -> list[Stream]:
    """The points by stream (name and attributes), the job's own streams first."""
    by_key: dict[tuple[str, str], Stream] = {}
    texts: dict[int, str] = {}  # id of an attribute dict -> its canonical JSON: the reader shares equal attribute
    # dicts (a few hundred for the millions of points of a large run), so each is serialized once; all live as long as
    # the points
    for point in points:
        attrs = point.attrs
        text = texts.get(id(attrs))
        if text is None:
            text = texts[id(attrs)] = json.dumps(attrs, sort_keys=True, default=str)
        key = (point.name, text)
        stream = by_key.get(key)
        if stream is None:
            stream = by_key[key] = Stream(point.name, point.attrs, point.kind, point.unit)
        stream.points.append(point)
    return sorted(by_key.values(), key=lambda s: (not s.user, s.name, s.label))


def column(proc: Proc) -> str:
    if proc.kind == "worker":
        return f"rank {proc.rank}"
    if proc.kind == "agent":
        return "agent"
    return proc.label


def fmt(value: float | None, unit: str = "") -> str:
    """A short number (4 significant digits, thousands separated); seconds under one as ms."""
    if value is None or value != value:
        return "" if value is None else "NaN"
    if unit == "s" and 0 < abs(value) < 1:
        value, unit = value * 1000, "ms"
    if abs(value) < 1e15 and value == int(value):
        text = f"{int(value):,}"
    else:
        text = f"{value:.4g}"
    return f"{text} {unit}" if unit and not unit.startswith("{") else text


def _last(points: list[Point]) -> Point:
    return max(points, key=lambda p: ((p.proc.restart or 0), p.time))


def _procs_by_id(all_streams: list[Stream]) -> dict[int, Proc]:
    """Every process of the points, by id (a run's processes are one object each: the reader's ``Proc`` s), listed
    at C speed: a large run has millions of points."""
    procs: dict[int, Proc] = {}
    for stream in all_streams:
        procs.update(zip(map(id, map(_PROC_OF, stream.points)), map(_PROC_OF, stream.points), strict=True))
    return procs


def table(all_streams: list[Stream], max_rows: int = 200, max_ranks: int = 16) -> Table:
    procs = _procs_by_id(all_streams)
    ranks = sorted({p.rank for p in procs.values() if p.kind == "worker" and p.rank is not None})
    others = sorted({column(p) for p in procs.values() if p.kind != "worker"})
    columns = others + [f"rank {r}" for r in ranks[:max_ranks]]
    shown = set(columns)
    column_of = {i: name for i, name in ((i, column(p)) for i, p in procs.items()) if name in shown}
    rows = []
    for stream in all_streams[:max_rows]:
        per_column: dict[str, list[Point]] = collections.defaultdict(list)
        points = stream.points  # those of the columns shown (most ranks are not), in their order
        for point in itertools.compress(points, map(column_of.__contains__, map(id, map(_PROC_OF, points)))):
            per_column[column_of[id(point.proc)]].append(point)
        cells = []
        for name in columns:
            pts = per_column.get(name)
            last = _last(pts) if pts else None
            cells.append(_cell(last, stream.unit) if last is not None else "")
        rows.append((stream, cells))
    return Table(columns, rows, max(0, len(all_streams) - max_rows), max(0, len(ranks) - max_ranks))


def _cell(point: Point, unit: str) -> str:
    """The value (a distribution: its mean)."""
    return fmt(point.value, unit)


@dataclass
class Series:
    label: str
    rank: int | None
    restart: int | None
    points: list[tuple[int, float]]


@dataclass
class Chart:
    stream: Stream
    series: list[Series]


def charts(all_streams: list[Stream], max_charts: int = 16, max_series: int = 16, max_points: int = 150) -> list[Chart]:
    """Charts of the streams the workers exported (a worker with two points at least), the job's own first."""
    out = []
    for stream in all_streams:
        per_proc: dict[Proc, list[Point]] = collections.defaultdict(list)
        for point in stream.points:
            if point.proc.kind == "worker" and point.value is not None:
                per_proc[point.proc].append(point)
        if max((len(v) for v in per_proc.values()), default=0) < 2:
            continue  # nothing to draw a line through
        procs = sorted(per_proc, key=lambda p: (p.rank if p.rank is not None else -1, p.restart or 0))[:max_series]
        series = [
            Series(f"rank {p.rank}, restart {p.restart}", p.rank, p.restart, _line(per_proc[p], max_points))
            for p in procs
        ]
        out.append(Chart(stream, series))
        if len(out) >= max_charts:
            break
    return out


def _line(points: list[Point], max_points: int) -> list[tuple[int, float]]:
    return thin([(p.time, p.value) for p in sorted(points, key=lambda p: p.time) if p.value is not None], max_points)


def thin(points: list[tuple[int, float]], limit: int) -> list[tuple[int, float]]:
    """At most ``limit`` points, evenly spaced by index, the first and last always kept."""
    if len(points) <= limit:
        return points
    step = (len(points) - 1) / (limit - 1)
    return [points[round(i * step)] for i in range(limit)]
