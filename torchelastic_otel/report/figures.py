"""The bridge's own figures the report computes with, and the values each can take.

The reader keeps every number OTLP's JSON encoding allows -- ``NaN``, ``Infinity``, a negative duration, an
integer beyond 64 bits -- since they are valid OTLP, and a user's own metric may well be NaN (a loss that
diverged): the metric table shows those as they are. The report's arithmetic, though (goodput, the step's phases,
the verdict, stragglers, memory), reads a few metrics of the bridge's own, whose values are durations, sizes and
counts. A point of one of those whose value no such figure can take -- not finite, negative, beyond any job's
size (``MAX_SECONDS``, ``MAX_BYTES``, ``MAX_COUNT``), a histogram with impossible bounds -- is left out by
:func:`screen` and counted in the telemetry's problems (``implausible_value``, with the process and the value), as
an unreadable line is: the report never computes with it, never shows it, never fails on it. A value a writer
put as a string that is no number never gets this far: the reader counts its item (``invalid_metrics_item``).
"""

from __future__ import annotations

import itertools
import math

from torchelastic_otel import _names as names
from torchelastic_otel.report.records import Point, Telemetry

__all__ = ["MAX_SECONDS", "MAX_BYTES", "MAX_COUNT", "PROBLEM", "implausible", "screen"]

#: No duration, nor a sum of a job's durations, is longer: about 32 years.
MAX_SECONDS = 1e9
#: No memory is larger: 4 EiB.
MAX_BYTES = float(2**62)
#: No count is larger: the largest integer a double holds exactly (OTLP's counts are 64-bit; JSON's readers' not).
MAX_COUNT = 2**53
#: The reason the problems count such a point under.
PROBLEM = "implausible_value"

_SECONDS = (
    names.WORKER_STEP_PHASE_DURATION,
    names.WORKER_STEP_PHASE_MEDIAN,
    names.WORKER_STEP_DURATION,
    names.WORKER_STEP_ARRIVAL,
    names.WORKER_STEP_ARRIVAL_MEDIAN,
    names.WORKER_STEP_GPU_IDLE,
    names.GOODPUT_TIME,
    names.WORKER_PROGRESS_AT_RISK,
    names.WORKER_CUDA_MEMORY_FULL_IN,
)
_BYTES = (
    names.PROCESS_MEMORY_USAGE,
    names.WORKER_CUDA_MEMORY_ALLOCATED,
    names.WORKER_CUDA_MEMORY_RESERVED,
    names.WORKER_CUDA_MEMORY_PEAK,
    names.WORKER_CUDA_MEMORY_TOTAL,
)
_COUNTS = (names.WORKER_STEPS,)
#: metric name -> the largest value it can take
_LIMITS: dict[str, float] = {
    **dict.fromkeys(_SECONDS, MAX_SECONDS),
    **dict.fromkeys(_BYTES, MAX_BYTES),
    **dict.fromkeys(_COUNTS, float(MAX_COUNT)),
}


def implausible(point: Point) -> str | None:
    """What no figure of ``point``'s metric can be (``"value nan"``, ``"count -1"``...); ``None`` when it fits, or
    when the metric is none the report computes with."""
    limit = _LIMITS.get(point.name)
    if limit is None:
        return None
    value, count = point.value, point.count
    if count is None:  # a number point (the common case, on the short path)
        return None if value is None or 0.0 <= value <= limit else f"value {value!r}"
    total, low, high, buckets = point.total, point.low, point.high, point.buckets
    if (
        (value is None or 0.0 <= value <= limit)
        and 0 <= count <= MAX_COUNT
        and (total is None or 0.0 <= total <= limit)
        and (low is None or 0.0 <= low <= limit)
        and (high is None or 0.0 <= high <= limit)
        and (not buckets or (0 <= min(buckets) and max(buckets) <= MAX_COUNT and _ascending(point.bounds)))
    ):
        return None
    return f"value {value!r}, count {count!r}, sum {total!r}, min {low!r}, max {high!r} or its buckets"


#: bounds already checked, by identity (the reader keeps one tuple for a metric's bounds on all of its points)
_CHECKED_BOUNDS: dict[int, tuple[tuple[float, ...], bool]] = {}


def _ascending(bounds: tuple[float, ...]) -> bool:
    """Finite, strictly ascending bounds, none below 0 (the figures are durations, sizes and counts)."""
    known = _CHECKED_BOUNDS.get(id(bounds))
    if known is not None and known[0] is bounds:
        return known[1]
    ok = all(0.0 <= b and math.isfinite(b) for b in bounds) and all(a < b for a, b in itertools.pairwise(bounds))
    if len(_CHECKED_BOUNDS) < 1024:
        _CHECKED_BOUNDS[id(bounds)] = (bounds, ok)  # the tuple kept: its id is not reused meanwhile
    return ok


def screen(tel: Telemetry) -> None:
    """Leave out the points of ``tel`` that are ``implausible``, each counted in ``tel.problems``."""
    points = tel.points
    limit = _LIMITS.get
    bad = [
        p
        for p in points
        if (most := limit(p.name)) is not None
        # a number point that fits (the common case, millions on a large run) on the shortest path
        and not (p.count is None and (p.value is None or 0.0 <= p.value <= most))
        and implausible(p) is not None
    ]
    if not bad:
        return
    for point in bad:
        tel.problems.add(PROBLEM, point.proc.label, f"{point.name}: {implausible(point)}")
    gone = set(map(id, bad))
    tel.points = [p for p in points if id(p) not in gone]
