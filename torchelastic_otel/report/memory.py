"""What the report says about the workers' memory: each worker's resident set size over time, the ranks whose
memory creeps (grows steadily over their run: a leak that ends in an OOM if the job runs long enough), when a
creeping CUDA device is full at that rate, and the figures of a CUDA out-of-memory error.

From the workers' own points (``torchelastic_otel._torch.worker.memory``): ``process.memory.usage`` (the resident
set size at each export; a gauge-like sum, so each point is the value at its time), per CUDA device
``torchelastic.worker.cuda.memory.allocated`` (what the job's tensors occupy) and ``.total`` (the device's memory),
and, to find the training part of a process's life, its ``torchelastic.worker.steps`` points (a cumulative
counter).

**Creep**, per worker process (one rank in one attempt) for its resident set, and per worker process and CUDA
device for the device's allocated memory: a least-squares line is fitted to its points over the *window*, and it
creeps when all of these hold:

- the window has at least ``MIN_POINTS`` (5) points;
- growth over the window (the fitted line's rise) is at least ``MIN_GROWTH_BYTES`` (64 MiB) **and** at least
  ``MIN_GROWTH_RATIO`` (20 %) of the line's value at the window's start -- for a CUDA device whose total is known,
  of that or of the room the device had left at the start (total less start), whichever is smaller;
- the growth is steady: the line explains at least ``MIN_R2`` (0.8) of the variance (R²);
- it still grows at the end: the line fitted to the window's second half alone rises at least ``MIN_LATE_SHARE``
  (half) as fast.

The *window* is the training: from the first export that counted a step to the last export before the one that
counted the last step (that export may come after the loop let go of what it kept: a process's last export, at its
exit, where a leaking GPU job's allocated memory was back at its start); a process that marked no steps
(steps off, a loop without an optimizer) is fitted over its run without the first ``WARM_UP_SHARE`` (20 %) and the
last ``TAIL_SHARE`` (5 %) of its points' time span.

Why these (what real jobs on CPU showed: ``tests/support/workers/mem_worker.py``):

- before the first step a worker's RSS climbs almost linearly while it imports torch and sets up its process
  group: by its shape alone it is a leak. Hence the window starts at the first step, and without steps the first
  20 % of the run is left out (for a run much longer than its start-up, the 20 % hold all of it);
- a healthy loop grows over its first steps (gradients, DDP's buckets, the allocator's arenas) and then not at all.
  The first step's export comes after some of that warm-up, not all of it: the 64 MiB floor is above what is left
  of it, and a warm-up followed by a plateau is no line (R² well below 0.8);
- at exit Python frees what the loop kept: a leaking rank's last points are back at its start, which is why the
  window ends at the last step (without steps: the last 5 % are left out);
- R² >= 0.8 rules out a single jump (a dataset loaded once, a cache filled once) wherever it lies in the window:
  points evenly spread over a window with one step from a to b at a fraction p of it have R² = 3p(1-p) <= 0.75,
  where a steady leak fits a line with R² near 1;
- a ramp that stops is no creep, however straight it was: without steps, the 20 % cut of a short run still holds
  part of the start-up's ramp, and its second half is flat; a leak's second half rises as fast as the whole;
- 20 % of the start: the growth must matter against the process's own size (a process of 20 GiB that grows 100 MiB
  while its caches fill is not what ends in an OOM), and it must be far above the measurement's noise (RSS of a
  flat process moves by a few MiB between exports: the 64 MiB floor).

The same rule holds for a CUDA device's allocated memory, for these reasons:

- *allocated*, not reserved nor peak: reserved is the caching allocator's pool, which grows by whole segments
  during the first steps and keeps them until ``empty_cache`` (a warm-up that steps up and stays), and holds any
  leak of allocated anyway; peak is a running maximum, which only rises;
- allocated counts the tensors' bytes exactly, but an export samples it at any point of a step: between the step's
  low (parameters, gradients, optimizer states) and its high (with the activations), a swing of up to gigabytes
  for a large model. A flat loop sampled so is noise around a level, with no line in it (R² near 0), and a leak
  stands out of it: 32 MiB kept a step for 300 steps under a 2 GiB swing fits a line with R² about 0.95 (the
  rise's spread, 9 GiB / sqrt(12), against the swing's, 2 GiB / sqrt(12)). R² >= 0.8 keeps ruling out one
  jump: the optimizer's states, allocated at the first step (twice the parameters for Adam), are one;
- the window is the training, as for RSS: before the first step the model moves to the device (a jump), and at
  exit the tensors are freed;
- 20 % of the start, or of the room that was left: on a device the start is not the measure of the risk -- a job
  that starts at 60 GiB of 80 and grows 10 GiB (17 % of its start) is half way to an OOM -- so with the device's
  total the smaller of the start and the room left counts; a small job on a large device still needs 20 % of its
  start, as for RSS. 64 MiB: no device is at risk from less, and the swing above is far larger anyway;
- still growing at the end: a cache on the device that fills and stops (a ramp) is no leak.

**Forecast**: for a creeping device with a known total, the seconds from the window's end until the fitted line
reaches the total: ``(total - line at the end) / rate`` (0 if it reached it), in the creep's text ("at this rate
cuda:0 is full in 7 min"). The total is the worker's last ``torchelastic.worker.cuda.memory.total``; files without
it give the creep without a forecast.

Points that are no memory size (not finite, negative, a device that is no index) are left out and counted
(``left_out``).
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass

from torchelastic_otel import _names as names
from torchelastic_otel.report.model import CudaMemory, Job, as_int
from torchelastic_otel.report.records import Point, Proc

__all__ = [
    "Creep",
    "MemorySeries",
    "creep",
    "creep_json",
    "creeping",
    "cuda_memory_json",
    "fit",
    "full_in_text",
    "left_out",
    "memory_series",
    "oom_text",
    "MIN_GROWTH_BYTES",
]

USAGE = names.PROCESS_MEMORY_USAGE
CUDA_ALLOCATED = names.WORKER_CUDA_MEMORY_ALLOCATED
CUDA_TOTAL = names.WORKER_CUDA_MEMORY_TOTAL
STEPS = names.WORKER_STEPS
MIB = 1 << 20
MIN_POINTS = 5
MIN_GROWTH_BYTES = 64 * MIB
MIN_GROWTH_RATIO = 0.2
MIN_R2 = 0.8
MIN_LATE_SHARE = 0.5
WARM_UP_SHARE = 0.2
TAIL_SHARE = 0.05


@dataclass
class Creep:
    """A worker process whose memory -- its resident set, or a CUDA device's allocated memory -- grows steadily over
    its run (see the module's docstring)."""

    rank: int
    restart: int
    host: str
    first_bytes: float  # the fitted line at the window's start
    last_bytes: float  # the fitted line at the window's end
    growth_bytes_per_s: float  # the line's slope
    seconds: float  # the window's length
    text: str  # "rank 1 grew 310 MiB in 42 s (+7.4 MiB/s), 1.9x its start"
    pid: int | None = None
    r2: float = 0.0
    start: int = 0  # the window, ns since the epoch
    end: int = 0
    memory: str = "rss"  # "rss" (process.memory.usage) | "cuda" (a device's allocated memory)
    device: int | None = None  # the CUDA device's index
    total_bytes: float | None = None  # the CUDA device's memory, where the files tell it
    full_in_s: float | None = None  # the forecast: seconds from the window's end until the device is full

    @property
    def growth_bytes(self) -> float:
        return self.last_bytes - self.first_bytes


@dataclass
class MemorySeries:
    """One worker process's resident set size over time (thinned for a chart)."""

    label: str
    rank: int
    restart: int
    host: str
    pid: int | None
    points: list[tuple[int, float]]  # (time ns since the epoch, bytes)


def fit(points: list[tuple[int, float]]) -> tuple[float, float, float]:
    """The least-squares line through ``(time ns, bytes)``: ``(slope in bytes/s, value at the first time, R²)``.
    R² is 0 for a flat series (nothing to explain)."""
    t0 = points[0][0]
    xs = [(t - t0) / 1e9 for t, _ in points]
    ys = [v for _, v in points]
    n = len(points)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    if sxx <= 0:
        return 0.0, my, 0.0
    slope = sxy / sxx
    r2 = (sxy * sxy) / (sxx * syy) if syy > 0 else 0.0
    return slope, my - slope * mx, r2


def creeping(
    points: list[tuple[int, float]], steps: list[tuple[int, float]] | None = None, total: float | None = None
) -> Creep | None:
    """Whether one series of memory points (``(time ns, bytes)``) creeps, given its process's steps counter's points
    (``(time ns, cumulative steps)``, if any) and, for a CUDA device, its ``total`` bytes (if known); the ``Creep``
    (rank and names left blank; with the forecast where ``total`` is known) or ``None``."""
    window = _window(sorted(points), sorted(steps or []))
    if len(window) < MIN_POINTS:
        return None
    slope, first, r2 = fit(window)
    seconds = (window[-1][0] - window[0][0]) / 1e9
    growth = slope * seconds
    base = min(first, total - first) if total is not None and total > first else first
    if growth < MIN_GROWTH_BYTES or first <= 0 or growth < MIN_GROWTH_RATIO * base or r2 < MIN_R2:
        return None
    late = [p for p in window if p[0] >= (window[0][0] + window[-1][0]) / 2]
    if len(late) < 2 or fit(late)[0] < MIN_LATE_SHARE * slope:
        return None  # it grew, and then stopped: a warm-up, not a creep
    full_in = max(0.0, (total - (first + growth)) / slope) if total is not None else None
    return Creep(
        rank=-1,
        restart=0,
        host="",
        first_bytes=first,
        last_bytes=first + growth,
        growth_bytes_per_s=slope,
        seconds=seconds,
        text="",
        r2=r2,
        start=window[0][0],
        end=window[-1][0],
        total_bytes=total,
        full_in_s=full_in,
    )


def _window(points: list[tuple[int, float]], steps: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """The points of the process's training (see the module's docstring)."""
    if not points:
        return []
    counted = [(t, v) for t, v in steps if v > 0]
    start: float
    end: float
    if counted:
        final = max(v for _, v in counted)
        first_final = min(t for t, v in counted if v >= final)
        # the export that first counted the last step may come after the loop let go of what it kept (at exit, a
        # process's last export): the window ends at the one before it
        before = [t for t, v in counted if t < first_final]
        start, end = counted[0][0], (max(before) if before else first_final)
    else:
        t0, t1 = points[0][0], points[-1][0]
        start, end = t0 + WARM_UP_SHARE * (t1 - t0), t1 - TAIL_SHARE * (t1 - t0)
    return [(t, v) for t, v in points if start <= t <= end]


def _by_process(job: Job, name: str) -> dict[Proc, list[tuple[int, float]]]:
    """``(time, value)`` of the points of ``name`` per worker process, one per time (the last written wins)."""
    out: dict[Proc, dict[int, float]] = collections.defaultdict(dict)
    for point in job.named(name):
        if _usable(point, name):
            out[point.proc][point.time] = point.value  # type: ignore[assignment]  # (_usable: not None)
    return {proc: sorted(values.items()) for proc, values in out.items()}


def _by_device(job: Job, name: str) -> dict[tuple[Proc, int], list[tuple[int, float]]]:
    """``_by_process`` per worker process and CUDA device (the points' ``device`` attribute)."""
    out: dict[tuple[Proc, int], dict[int, float]] = collections.defaultdict(dict)
    for point in job.named(name):
        device = _device(point)
        if device is not None and _usable(point, name):
            out[(point.proc, device)][point.time] = point.value  # type: ignore[assignment]  # (_usable: not None)
    return {key: sorted(values.items()) for key, values in out.items()}


def _device(point: Point) -> int | None:
    raw = point.attrs.get(names.DEVICE)
    device = None if isinstance(raw, (bool, float)) else as_int(raw)
    return device if device is not None and device >= 0 else None


def _usable(point: Point, name: str) -> bool:
    proc = point.proc
    return (
        point.name == name
        and point.kind in ("sum", "gauge")
        and _size(point.value)
        and bool(point.time)
        and proc.kind == "worker"
        and proc.rank is not None
    )


def _size(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value >= 0


def left_out(job: Job) -> int:
    """The workers' memory points that are no memory size (not finite, negative; a CUDA point without a device
    index): left out of the series and the creep, counted here."""
    count = 0
    for name in (USAGE, CUDA_ALLOCATED, CUDA_TOTAL):
        for point in job.named(name):
            if point.proc.kind != "worker" or point.kind not in ("sum", "gauge") or point.value is None:
                continue
            if not _size(point.value) or (name != USAGE and _device(point) is None):
                count += 1
    return count


def _totals(job: Job) -> dict[tuple[Proc, int], float]:
    """Each worker process's CUDA devices' total memory (the last point of each; a device has one)."""
    return {key: values[-1][1] for key, values in _by_device(job, CUDA_TOTAL).items() if values[-1][1] > 0}


def _labels(procs: list[Proc]) -> dict[Proc, str]:
    """``rank 1, restart 0``; with the pid where a rank has several processes in one attempt (its helpers)."""
    count = collections.Counter((p.restart or 0, p.rank, p.host) for p in procs)
    return {p: p.label + (f", pid {p.pid}" if count[(p.restart or 0, p.rank, p.host)] > 1 else "") for p in procs}


def _order(proc: Proc) -> tuple[int, int, str, int]:
    return (proc.restart or 0, proc.rank if proc.rank is not None else -1, proc.host, proc.pid or 0)


def memory_series(job: Job, max_points: int = 150) -> list[MemorySeries]:
    """Each worker process's resident set size over time, for charts (at most ``max_points`` points each)."""
    usage = _by_process(job, USAGE)
    labels = _labels(list(usage))
    out = []
    for proc in sorted(usage, key=_order):
        out.append(
            MemorySeries(
                labels[proc], proc.rank or 0, proc.restart or 0, proc.host, proc.pid, _thin(usage[proc], max_points)
            )
        )
    return out


def creep(job: Job) -> list[Creep]:
    """The worker processes whose memory creeps -- their resident set, or a CUDA device's allocated memory -- fastest
    first (see the module's docstring for the rule), a CUDA device's with its forecast where its total is known."""
    usage = _by_process(job, USAGE)
    allocated = _by_device(job, CUDA_ALLOCATED)
    totals = _totals(job)
    steps = _by_process(job, STEPS)
    procs = set(usage) | {proc for proc, _ in allocated}
    several = len({a.restart for a in job.attempts}) > 1 or any((p.restart or 0) > 0 for p in procs)
    series: list[tuple[Proc, int | None, list[tuple[int, float]]]] = [(proc, None, usage[proc]) for proc in usage]
    series += [(proc, device, points) for (proc, device), points in allocated.items()]
    found = []
    for proc, device, points in sorted(series, key=lambda s: (_order(s[0]), -1 if s[1] is None else s[1])):
        found_here = creeping(points, steps.get(proc), totals.get((proc, device)) if device is not None else None)
        if found_here is None:
            continue
        found_here.rank, found_here.restart = proc.rank or 0, proc.restart or 0
        found_here.host, found_here.pid = proc.host, proc.pid
        if device is not None:
            found_here.memory, found_here.device = "cuda", device
        found_here.text = _text(found_here, several, len([p for p in procs if _same_worker(p, proc)]) > 1)
        found.append(found_here)
    return sorted(found, key=lambda c: -c.growth_bytes_per_s)


def _same_worker(a: Proc, b: Proc) -> bool:
    return (a.restart or 0, a.rank, a.host) == (b.restart or 0, b.rank, b.host)


def _text(c: Creep, with_restart: bool, with_pid: bool) -> str:
    who = f"rank {c.rank}"
    details = [f"restart {c.restart}"] if with_restart else []
    details += [f"pid {c.pid}"] if with_pid and c.pid is not None else []
    if details:
        who += f" ({', '.join(details)})"
    if c.device is not None:
        who += f" cuda:{c.device} allocated"
    ratio = c.last_bytes / c.first_bytes if c.first_bytes > 0 else float("inf")
    text = (
        f"{who} grew {_bytes(c.growth_bytes)} in {_duration(c.seconds)} ({_rate(c.growth_bytes_per_s)}), "
        f"{ratio:.1f}x its start"
    )
    forecast = full_in_text(c)
    return f"{text}; {forecast}" if forecast else text


def full_in_text(c: Creep) -> str:
    """``at this rate cuda:0 is full in 7 min`` (empty without a forecast)."""
    if c.full_in_s is None or c.device is None:
        return ""
    if c.full_in_s < 1:
        return f"at this rate cuda:{c.device} is full now"
    return f"at this rate cuda:{c.device} is full in {_duration(c.full_in_s)}"


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def creep_json(creeps: list[Creep]) -> list[dict[str, object]]:
    """The creeps as ``report --json`` gives them (``memory_creep``), fastest first: per creep its process and
    memory (``rss``, or ``cuda`` with its ``device``), the fitted line (bytes), the window and the forecast
    (``full_in_seconds``: null for RSS and for a device whose total the files do not tell)."""
    return [
        {
            "rank": c.rank,
            "restart": c.restart,
            "host": c.host,
            "pid": c.pid,
            "memory": c.memory,
            "device": c.device,
            "start_bytes": round(c.first_bytes),
            "end_bytes": round(c.last_bytes),
            "growth_bytes": round(c.growth_bytes),
            "growth_bytes_per_s": round(c.growth_bytes_per_s, 1),
            "seconds": _round(c.seconds),
            "r2": _round(c.r2, 4),
            "total_bytes": None if c.total_bytes is None else round(c.total_bytes),
            "full_in_seconds": _round(c.full_in_s, 1),
            "text": c.text,
        }
        for c in creeps
    ]


def oom_text(memory: CudaMemory) -> str:
    """A CUDA out-of-memory error's figures: ``cuda:0 when it died: 78.1 GiB allocated, 79.0 GiB reserved, peak
    78.5 GiB, of 79.2 GiB``."""
    parts = [
        f"{_bytes(value)} {label}"
        for label, value in (("allocated", memory.allocated), ("reserved", memory.reserved))
        if value is not None
    ]
    if memory.peak is not None:
        parts.append(f"peak {_bytes(memory.peak)}")
    text = f"cuda:{memory.device} when it died: " + (", ".join(parts) or "no allocator figures")
    if memory.total is not None:
        text += f", of {_bytes(memory.total)}"
    if memory.invalid:
        text += f" ({memory.invalid} unreadable value{'s' if memory.invalid != 1 else ''} left out)"
    return text


def cuda_memory_json(memory: CudaMemory | None) -> dict[str, int | None] | None:
    """A root cause's ``cuda_memory`` in ``report --json``: the device and the allocator's figures (bytes, null
    where not recorded), ``invalid`` the values left out; null for a failure that is no CUDA OOM."""
    if memory is None:
        return None
    return {
        "device": memory.device,
        "allocated_bytes": memory.allocated,
        "reserved_bytes": memory.reserved,
        "peak_bytes": memory.peak,
        "total_bytes": memory.total,
        "invalid": memory.invalid,
    }


def _bytes(value: float) -> str:
    return f"{value / MIB:.0f} MiB" if value < 1024 * MIB else f"{value / (1024 * MIB):.1f} GiB"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _rate(bytes_per_s: float) -> str:
    per_s = bytes_per_s / MIB
    if per_s >= 0.1:
        return f"+{per_s:.1f} MiB/s"
    if per_s * 60 >= 0.1:
        return f"+{per_s * 60:.1f} MiB/min"
    return f"+{per_s * 3600:.1f} MiB/h"


def _thin(points: list[tuple[int, float]], limit: int) -> list[tuple[int, float]]:
    if len(points) <= limit or limit < 2:
        return points
    step = (len(points) - 1) / (limit - 1)
    return [points[round(i * step)] for i in range(limit)]
