"""The plain records a report is built from: spans, log records and metric points, each with its process.

The reader (``otlpjson``) turns OTLP JSON into these once, so the model and the renderers never see the wire
format: times are integers in ns since the epoch, ids lower-case hex, attribute values plain Python values.
"""

from __future__ import annotations

import collections
import dataclasses
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeAlias

#: An attribute's value (or a log record's body) as the reader makes it of OTLP JSON's ``AnyValue``: a string, a
#: number, a bool, ``None`` (absent), a list of values, or a dict (a key-value list); bytes become hex text.
AttrValue: TypeAlias = str | int | float | bool | None | list["AttrValue"] | dict[str, "AttrValue"]
#: A record's attributes (read-only: equal sets are one shared dict).
Attrs = dict[str, AttrValue]

#: OTLP's status code of a failed span (``STATUS_CODE_ERROR``).
STATUS_ERROR = 2
#: ``SeverityNumber`` ranges (OTLP logs data model): WARN 13-16, ERROR 17-20, FATAL 21-24.
SEVERITY_WARN, SEVERITY_ERROR = 13, 17


class _Pickled:
    """A record pickled as the tuple of its fields (``otlpjson`` passes half the records of a large run from the
    process that read them): the default for a slots class, a dict per record, is twice the work."""

    __slots__ = ()

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return (type(self), _FIELDS[type(self)](self))


@dataclass(frozen=True, slots=True)
class Proc:
    """One process, as its resource tells it: a torchrun agent, one worker (rank, restart) or anything else."""

    kind: str  # "agent" | "worker" | "process"
    host: str
    pid: int | None
    run_id: str | None
    rank: int | None
    local_rank: int | None
    restart: int | None
    service: str
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        fields = (self.kind, self.host, self.pid, self.run_id, self.rank, self.local_rank, self.restart, self.service)
        object.__setattr__(self, "_hash", hash(fields))

    def __hash__(self) -> int:
        """Computed once: a process keys the records of a run in sets and dicts, millions of times on 1,000 nodes."""
        return self._hash

    @property
    def label(self) -> str:
        """How the report names the process: ``rank 1, restart 0``, ``agent vm`` or ``<service> pid N``."""
        if self.kind == "worker":
            return f"rank {self.rank}, restart {self.restart}"
        if self.kind == "agent":
            return f"agent {self.host}"
        return f"{self.service} pid {self.pid}" if self.pid is not None else self.service


@dataclass(slots=True)
class SpanEvent(_Pickled):
    name: str
    time: int
    attrs: Attrs


@dataclass(slots=True)
class Span(_Pickled):
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    start: int
    end: int
    attrs: Attrs
    status_code: int
    status_message: str
    events: list[SpanEvent]
    proc: Proc

    @property
    def failed(self) -> bool:
        return self.status_code == STATUS_ERROR


@dataclass(slots=True)
class LogRecord(_Pickled):
    time: int  # the record's time, or its observed time when the writer left it out
    severity: int
    severity_text: str
    body: AttrValue
    event_name: str
    attrs: Attrs
    trace_id: str
    span_id: str
    proc: Proc

    @property
    def name(self) -> str:
        """The event name, or (torch's events before ``event_name`` existed) a string body."""
        return self.event_name or (self.body if isinstance(self.body, str) and len(self.body) < 200 else "")


class Point(_Pickled):
    """One data point of a metric; ``value`` is the number a chart plots (a histogram's mean).

    A histogram point also keeps its distribution: ``total`` (the sum), and for an explicit-bucket histogram its
    ``bounds`` (upper bounds, ascending) and ``buckets`` (one count more than bounds: the last is above the last
    bound), and ``low`` / ``high`` (its min and max, when the writer recorded them), so that a quantile can be
    interpolated (``quantile``).

    Most points of a large run are numbers (a gauge's, a sum's), millions of them: such a point holds no
    distribution (its fields read as their defaults, and cannot be set). ``Point(...)`` of a histogram, or given a
    distribution, makes a ``Distribution``, a ``Point`` that holds one.
    """

    __slots__ = ("name", "kind", "unit", "time", "value", "attrs", "proc", "monotonic", "count")

    name: str
    kind: str  # "gauge" | "sum" | "histogram" | "exponential_histogram" | "summary"
    unit: str
    time: int
    value: float | None
    attrs: Attrs
    proc: Proc
    monotonic: bool
    count: int | None
    # a distribution's fields (``Distribution``): on a number point, the defaults of the class
    total: float | None = None
    bounds: tuple[float, ...] = ()
    buckets: tuple[int, ...] = ()
    low: float | None = None
    high: float | None = None

    def __new__(
        cls,
        name: str,
        kind: str,
        unit: str,
        time: int,
        value: float | None,
        attrs: Attrs,
        proc: Proc,
        monotonic: bool = False,
        count: int | None = None,
        total: float | None = None,
        bounds: tuple[float, ...] = (),
        buckets: tuple[int, ...] = (),
        low: float | None = None,
        high: float | None = None,
    ) -> Point:
        if cls is Point and (
            kind == "histogram" or total is not None or bounds or buckets or low is not None or high is not None
        ):
            cls = Distribution
        return object.__new__(cls)

    def __init__(
        self,
        name: str,
        kind: str,
        unit: str,
        time: int,
        value: float | None,
        attrs: Attrs,
        proc: Proc,
        monotonic: bool = False,
        count: int | None = None,
        total: float | None = None,
        bounds: tuple[float, ...] = (),
        buckets: tuple[int, ...] = (),
        low: float | None = None,
        high: float | None = None,
    ) -> None:
        self.name, self.kind, self.unit, self.time, self.value = name, kind, unit, time, value
        self.attrs, self.proc, self.monotonic, self.count = attrs, proc, monotonic, count

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return _POINT_FIELDS(self) == _POINT_FIELDS(other)

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value (as a dataclass)

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in _POINT_NAMES)
        return f"{type(self).__name__}({fields})"

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (0..1) of a histogram point, interpolated linearly inside the bucket where it falls
        (the first bucket from ``low``, else 0, since the bridge's histograms are of durations; the last bucket up
        to ``high``); the mean (``value``) when the point has no usable buckets (none, a negative count) or the
        quantile falls in an unbounded bucket whose maximum is unknown."""
        count = sum(self.buckets)
        if not self.buckets or len(self.buckets) != len(self.bounds) + 1 or count <= 0 or min(self.buckets) < 0:
            return self.value
        rank = q * count
        seen = 0
        for i, n in enumerate(self.buckets):
            if n <= 0 or seen + n < rank:
                seen += n
                continue
            if i < len(self.bounds):
                upper = self.bounds[i]
            elif self.high is not None:
                upper = self.high
            else:
                return self.value
            lower = self.bounds[i - 1] if i > 0 else (self.low if self.low is not None else 0.0)
            if self.low is not None:
                lower = max(lower, self.low)
            if self.high is not None:
                upper = min(upper, self.high)
            lower = min(lower, upper)
            return lower + (upper - lower) * max(0.0, min(1.0, (rank - seen) / n))
        return self.value

    def count_above(self, x: float) -> float | None:
        """How many of a histogram point's observations exceed ``x``, estimated as ``quantile`` interpolates: each
        bucket's observations spread evenly between its bounds (the first from ``low``, else 0; the last up to
        ``high``; both clamped to ``low`` / ``high``). ``None`` without usable buckets, or where ``x`` falls in the
        unbounded last bucket and its maximum is unknown."""
        if not self.buckets or len(self.buckets) != len(self.bounds) + 1 or sum(self.buckets) <= 0:
            return None
        if min(self.buckets) < 0:
            return None
        above = 0.0
        for i, n in enumerate(self.buckets):
            if n <= 0:
                continue
            lower = self.bounds[i - 1] if i > 0 else (self.low if self.low is not None else 0.0)
            upper = self.bounds[i] if i < len(self.bounds) else self.high
            if self.low is not None:
                lower = max(lower, self.low)
            if upper is None:  # the unbounded bucket without a maximum: only whether x is below it is known
                if x >= lower:
                    return None
                above += n
                continue
            if self.high is not None:
                upper = min(upper, self.high)
            lower = min(lower, upper)
            if x < lower or (x == lower and upper > lower):
                above += n
            elif x < upper:
                above += n * (upper - x) / (upper - lower)
        return above


class Distribution(Point):
    """A point with a distribution: a histogram's (``Point``). Its parameters are ``Point``'s: ``Point(...)`` given a
    distribution makes one."""

    __slots__ = ("total", "bounds", "buckets", "low", "high")

    def __init__(
        self,
        name: str,
        kind: str,
        unit: str,
        time: int,
        value: float | None,
        attrs: Attrs,
        proc: Proc,
        monotonic: bool = False,
        count: int | None = None,
        total: float | None = None,
        bounds: tuple[float, ...] = (),
        buckets: tuple[int, ...] = (),
        low: float | None = None,
        high: float | None = None,
    ) -> None:
        Point.__init__(self, name, kind, unit, time, value, attrs, proc, monotonic, count)
        self.total, self.bounds, self.buckets, self.low, self.high = total, bounds, buckets, low, high


#: a point's fields, in order (its ``__init__``'s)
_POINT_NAMES = (*Point.__slots__, *Distribution.__slots__)
_POINT_FIELDS = operator.attrgetter(*_POINT_NAMES)

#: each record class's fields, in order, as one C call (``__reduce__``)
_FIELDS: dict[type, Callable[[object], tuple[object, ...]]] = {
    cls: operator.attrgetter(*(f.name for f in dataclasses.fields(cls))) for cls in (SpanEvent, Span, LogRecord)
}
_FIELDS[Point] = operator.attrgetter(*Point.__slots__)
_FIELDS[Distribution] = _POINT_FIELDS


@dataclass
class Problems:
    """What could not be read as it was: counted by reason, with the first few places (``file:line: what``)."""

    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    examples: list[str] = field(default_factory=list)
    max_examples: int = 20

    def add(self, reason: str, where: str, detail: str = "", n: int = 1) -> None:
        self.counts[reason] += n
        if len(self.examples) < self.max_examples:
            self.examples.append(f"{where}: {reason}{': ' + detail if detail else ''}")

    def __bool__(self) -> bool:
        return bool(self.counts)


@dataclass
class Telemetry:
    """Everything read from a set of files."""

    spans: list[Span] = field(default_factory=list)
    logs: list[LogRecord] = field(default_factory=list)
    points: list[Point] = field(default_factory=list)
    problems: Problems = field(default_factory=Problems)
    files: list[str] = field(default_factory=list)
    lines: int = 0
