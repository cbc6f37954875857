"""Memory per rank: the worker's resident set size and, where the job uses CUDA, its caching allocator's figures.

Observable instruments on the worker's meter, read only when metrics are collected (the SDK's reader thread, or a
flush), never on the training path:

- ``process.memory.usage`` (By), as OpenTelemetry's semantic conventions define it (an observable UpDownCounter):
  the process's resident set size, from ``/proc/self/statm`` (resident pages x page size). Where there is no
  ``/proc`` nothing is reported and every collection counts ``dropped`` (``metrics``,
  ``process_memory_unreadable``): ``resource.getrusage``'s ``ru_maxrss`` is the *peak*, which cannot show memory
  that comes and goes, nor a creep after a peak, so it is no stand-in;
- ``torchelastic.worker.cuda.memory.allocated`` / ``.reserved`` / ``.peak`` (By), gauges with attribute ``device``
  (the device index): ``torch.cuda.memory_allocated`` / ``memory_reserved`` / ``max_memory_allocated``, only when the
  job itself has imported ``torch.cuda`` and initialised CUDA (``sys.modules`` and ``torch.cuda.is_initialized()``:
  the bridge never imports torch nor initialises CUDA), for each device whose allocator has reserved memory at some
  point of the process (a device the process never touched gets no series, and no context: the allocator's
  statistics are host-side counters);
- ``torchelastic.worker.cuda.memory.total`` (By), gauge with ``device``: the device's memory
  (``torch.cuda.get_device_properties(device).total_memory``, read once per device);
- ``torchelastic.worker.cuda.memory.full_in`` (s), gauge with ``device``: the OOM forecast, the seconds until the
  device's allocated memory reaches its total at the rate it grows now. Each collection reads ``memory_allocated``
  and keeps the reading (the last ``FORECAST_WINDOW_S`` seconds, at most ``FORECAST_READINGS`` of them); a
  least-squares line through them gives the rate. There is an observation only while the memory grows steadily,
  by the rule the report's creep uses (``report.memory``) on this shorter window: at least
  ``FORECAST_MIN_READINGS`` readings, a rise of ``FORECAST_MIN_GROWTH_BYTES`` or more over them, a straight line
  (R² at least ``FORECAST_MIN_R2``: a loop's allocated memory sampled at any point of its step swings by its
  activations, which a flat series leaves unexplained) that still rises in the window's second half (at least
  ``FORECAST_MIN_LATE_SHARE`` of the rate: a warm-up that stopped is no forecast); no share of the start is asked
  for, how far from full the device is being what the forecast says. Ten minutes: at the SDK's
  default export interval (60 s) the fifth reading comes in the fifth minute, and a rate that changed (a leak that
  begins at an epoch) is followed within minutes;
  the forecast runs from the line at the latest reading: ``(total - line) / rate``, 0 once the line reached it.
  The total includes what the allocator can never have (the CUDA context, other processes on the device), so the
  OOM comes a little before the forecast says.

When the exception that ends a worker is a CUDA out-of-memory error (``torch.cuda.OutOfMemoryError``, the class
taken from the already imported ``torch.cuda``), ``oom_figures`` reads the allocator's figures for its device
(allocated, reserved, peak, total) for the worker's failure file and exception record (``hooks``): only when CUDA
is initialised, each call guarded, nothing made that was not there.

A callback never raises: what it cannot read is counted (``torchelastic_otel.dropped``, signal ``metrics``).
The instruments are created on the current pipeline's meter provider once it is ready and again after every
rebuild (a forked child's own pipeline, a ``setup()``): ``_export.meters.Observed``, as ``devices`` does.
"""

from __future__ import annotations

import collections
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry.metrics import Observation

from torchelastic_otel import _names as names
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._export.meters import Observed
from torchelastic_otel._torch.patches import Patches

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter

__all__ = [
    "cuda_in_use",
    "devices_in_use",
    "forecast",
    "install",
    "installed",
    "oom_attributes",
    "oom_figures",
    "rss_bytes",
]

STATM = "/proc/self/statm"
DEVICE = names.DEVICE
_CUDA_MODULE = "torch.cuda"
_CUDA_ERROR = "cuda_memory_error"  # what a failed read of the allocator is counted as
#: (instrument name, torch.cuda function, description) of the CUDA gauges.
_CUDA_GAUGES = (
    (names.WORKER_CUDA_MEMORY_ALLOCATED, "memory_allocated",
     "Memory occupied by tensors on this CUDA device (torch.cuda.memory_allocated)"),
    (names.WORKER_CUDA_MEMORY_RESERVED, "memory_reserved",
     "Memory held by the caching allocator on this CUDA device (torch.cuda.memory_reserved)"),
    (names.WORKER_CUDA_MEMORY_PEAK, "max_memory_allocated",
     "Peak memory occupied by tensors on this CUDA device since the start or the last reset "
     "(torch.cuda.max_memory_allocated)"),
)  # fmt: skip
#: The OOM forecast's window and rule (see the module's docstring).
FORECAST_WINDOW_S = 600.0
FORECAST_READINGS = 120
FORECAST_MIN_READINGS = 5
FORECAST_MIN_GROWTH_BYTES = 64 << 20
FORECAST_MIN_R2 = 0.8
FORECAST_MIN_LATE_SHARE = 0.5
#: The figures of an out-of-memory error, as the failure file holds them, and their attributes on the exception
#: record.
OOM_ATTRIBUTES = {
    "device": names.CUDA_MEMORY_DEVICE,
    "allocated": names.CUDA_MEMORY_ALLOCATED,
    "reserved": names.CUDA_MEMORY_RESERVED,
    "peak": names.CUDA_MEMORY_PEAK,
    "total": names.CUDA_MEMORY_TOTAL,
}
_clock = time.monotonic  # the readings' clock (a test scripts it)
_OOM_DEVICE = re.compile(r"\bGPU (\d+)\b")  # torch's message: "... GPU 0 has a total capacity of ..."

try:
    _PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
except (AttributeError, OSError, ValueError):
    _PAGE_SIZE = 4096


def rss_bytes() -> int | None:
    """This process's resident set size in bytes (``/proc/self/statm``), ``None`` where it cannot be read."""
    try:
        fd = os.open(STATM, os.O_RDONLY)
        try:
            raw = os.read(fd, 256)
        finally:
            os.close(fd)
        return int(raw.split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None


class _State:
    """The CUDA devices seen in use, their totals, and the forecast's readings."""

    def __init__(self) -> None:
        self.devices: set[int] = set()
        self.totals: dict[int, int] = {}  # each device's total memory, read once
        self.readings_lock = threading.Lock()  # collections of two readers may run at once
        self.readings: dict[int, collections.deque[tuple[float, float]]] = {}  # (monotonic s, allocated bytes)


_state = _State()


def _after_fork_in_child() -> None:
    _state.readings_lock = threading.Lock()
    _state.readings = {}  # the parent's: not this process's allocator


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def installed() -> bool:
    return _observed.active


def _rss() -> list[Observation]:
    rss = rss_bytes()
    if rss is None:
        selftelemetry.count(selftelemetry.DROPPED, "metrics", "process_memory_unreadable")
        return []
    return [Observation(rss)]


def _per_device(value: Callable[[object, int], float | None]) -> Callable[[], list[Observation]]:
    """The observations of ``value(cuda, device)`` for each device in use (none where it is ``None``)."""

    def observe() -> list[Observation]:
        cuda = cuda_in_use()
        if cuda is None:
            return []
        out = []
        for device in _devices(cuda):
            found = value(cuda, device)
            if found is not None:
                out.append(Observation(found, {DEVICE: device}))
        return out

    return observe


def _figure(function: str) -> Callable[[object, int], float | None]:
    """One of the allocator's figures: ``torch.cuda.<function>(device)``."""
    return lambda cuda, device: int(getattr(cuda, function)(device))


def cuda_in_use() -> object:
    """The job's ``torch.cuda`` once it has initialised CUDA; ``None`` before (never imports it)."""
    module = sys.modules.get(_CUDA_MODULE)
    return module if module is not None and module.is_initialized() else None


def devices_in_use(cuda: Any, seen: set[int]) -> list[int]:
    """The devices whose allocator has reserved memory at some point of the process, in order: ``seen`` (the
    caller's, kept across calls) and those found now (added to it)."""
    for device in range(cuda.device_count()):
        if device not in seen and cuda.memory_reserved(device) > 0:
            seen.add(device)
    return sorted(seen)


def _devices(cuda: object) -> list[int]:
    return devices_in_use(cuda, _state.devices)


def _total(cuda: Any, device: int) -> int | None:
    """The device's total memory, read once (``get_device_properties`` asks the driver); ``None`` if unreadable."""
    total = _state.totals.get(device)
    if total is None:
        try:
            total = int(cuda.get_device_properties(device).total_memory)
        except Exception:
            selftelemetry.count(selftelemetry.DROPPED, "metrics", _CUDA_ERROR)
            return None
        if total <= 0:
            return None
        _state.totals[device] = total
    return total


def _full_in(cuda: Any, device: int) -> float | None:
    """Keep this collection's reading of the device's allocated memory; the forecast where it grows steadily."""
    readings = _keep(device, _clock(), float(cuda.memory_allocated(device)))
    total = _total(cuda, device)
    return forecast(readings, total) if total is not None else None


def _keep(device: int, now: float, allocated: float) -> list[tuple[float, float]]:
    """Add a reading to the device's window (the last ``FORECAST_WINDOW_S`` s, ``FORECAST_READINGS`` at most)."""
    with _state.readings_lock:
        window = _state.readings.get(device)
        if window is None:
            window = _state.readings[device] = collections.deque(maxlen=FORECAST_READINGS)
        window.append((now, allocated))
        while window and window[0][0] < now - FORECAST_WINDOW_S:
            window.popleft()
        return list(window)


def _line(readings: Sequence[tuple[float, float]]) -> tuple[float, float, float]:
    """The least-squares line through ``(s, bytes)``: (slope in bytes/s, value at the first time, R²)."""
    t0 = readings[0][0]
    xs = [t - t0 for t, _ in readings]
    ys = [v for _, v in readings]
    n = len(readings)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    if sxx <= 0 or syy <= 0:
        return 0.0, my, 0.0
    slope = sxy / sxx
    return slope, my - slope * mx, (sxy * sxy) / (sxx * syy)


def forecast(readings: Sequence[tuple[float, float]], total: float) -> float | None:
    """Seconds until allocated memory reaches ``total`` at the rate fitted over ``readings`` (``(s, bytes)``, in
    time order), from the latest; ``None`` unless it grows steadily (the module's docstring)."""
    if len(readings) < FORECAST_MIN_READINGS or not total > 0:
        return None
    slope, first, r2 = _line(readings)
    span = readings[-1][0] - readings[0][0]
    if slope <= 0 or slope * span < FORECAST_MIN_GROWTH_BYTES or r2 < FORECAST_MIN_R2:
        return None
    middle = readings[0][0] + span / 2
    late = [r for r in readings if r[0] >= middle]
    if len(late) < 2 or _line(late)[0] < FORECAST_MIN_LATE_SHARE * slope:
        return None  # it grew, and then stopped
    return max(0.0, (total - (first + slope * span)) / slope)


def oom_figures(exc: BaseException) -> dict[str, int] | None:
    """The allocator's figures for the device of ``exc`` if it is a CUDA out-of-memory error: ``{"device",
    "allocated", "reserved", "peak", "total"}`` (bytes; those that could be read), else ``None``. Never imports
    torch, never initialises CUDA, never raises: called by a dying worker's excepthook."""
    try:
        cuda: Any = sys.modules.get(_CUDA_MODULE)
        oom = getattr(cuda, "OutOfMemoryError", None) if cuda is not None else None
        if not isinstance(oom, type) or not isinstance(exc, oom) or not cuda.is_initialized():
            return None
        device = _oom_device(cuda, exc)
    except Exception:
        return None
    if device is None:
        return None
    figures = {"device": device}
    reads: tuple[tuple[str, Callable[[], Any]], ...] = (
        ("allocated", lambda: cuda.memory_allocated(device)),
        ("reserved", lambda: cuda.memory_reserved(device)),
        ("peak", lambda: cuda.max_memory_allocated(device)),
        ("total", lambda: _total(cuda, device)),
    )
    for key, read in reads:
        try:
            value = read()
            if value is not None and int(value) >= 0:
                figures[key] = int(value)
        except Exception:
            pass
    return figures


def _oom_device(cuda: Any, exc: BaseException) -> int | None:
    """The device the allocation failed on: the one the message names ("GPU 1 has a total capacity of ..."),
    else the current device."""
    try:
        match = _OOM_DEVICE.search(str(exc))
        count = int(cuda.device_count())
        if match is not None and int(match.group(1)) < count:
            return int(match.group(1))
    except Exception:
        pass
    try:
        return int(cuda.current_device())
    except Exception:
        return None


def oom_attributes(figures: dict[str, int] | None) -> dict[str, int]:
    """``oom_figures``' figures as the exception record's attributes (``torchelastic.cuda_memory.*``)."""
    return {OOM_ATTRIBUTES[key]: value for key, value in (figures or {}).items() if key in OOM_ATTRIBUTES}


def _create(meter: Meter) -> None:
    meter.create_observable_up_down_counter(
        names.PROCESS_MEMORY_USAGE,
        callbacks=[_observed.callback(_rss, "process_memory_error")],
        unit="By",
        description="The amount of physical memory in use (resident set size) of this worker process",
    )
    for name, function, description in _CUDA_GAUGES:
        meter.create_observable_gauge(
            name,
            callbacks=[_observed.callback(_per_device(_figure(function)), _CUDA_ERROR)],
            unit="By",
            description=description,
        )
    meter.create_observable_gauge(
        names.WORKER_CUDA_MEMORY_TOTAL,
        callbacks=[_observed.callback(_per_device(_total), _CUDA_ERROR)],
        unit="By",
        description="The memory of this CUDA device (torch.cuda.get_device_properties(device).total_memory)",
    )
    meter.create_observable_gauge(
        names.WORKER_CUDA_MEMORY_FULL_IN,
        callbacks=[_observed.callback(_per_device(_full_in), _CUDA_ERROR)],
        unit="s",
        description="Seconds until the memory allocated on this CUDA device reaches its total at its current "
        "rate of growth (only while it grows steadily)",
    )


_observed = Observed(_create, "memory_instruments_error")


def install(patches: Patches) -> None:
    """Report this worker's memory (see the module's docstring); ``patches.restore()`` stops it. Idempotent."""
    if not _observed.active:
        patches.on_restore(_observed.start())
