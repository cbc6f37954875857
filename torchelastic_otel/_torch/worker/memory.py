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
  statistics are host-side counters).

A callback never raises: what it cannot read is counted (``torchelastic_otel.dropped``, signal ``metrics``).
The instruments are created on the current pipeline's meter provider once it is ready and again after every
rebuild (a forked child's own pipeline, a ``setup()``), as ``steps`` does: keyed on ``pipeline._generation``.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from torchelastic_otel import _names as names
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel import pipeline
from torchelastic_otel._torch.patches import Patches
from torchelastic_otel.version import __version__

__all__ = ["install", "installed", "rss_bytes"]

STATM = "/proc/self/statm"
DEVICE = "device"
_CUDA_MODULE = "torch.cuda"
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
    """Whether the instruments report, on which providers they are, and the CUDA devices seen in use."""

    def __init__(self) -> None:
        self.active = False
        self.lock = threading.Lock()
        self.generation = -1
        self.providers: weakref.WeakSet[Any] = weakref.WeakSet()
        self.provider_ids: set[int] = set()  # providers that cannot be weakly referenced
        self.devices: set[int] = set()


_state = _State()


def _after_fork_in_child() -> None:
    _state.lock = threading.Lock()  # another thread may have held it at the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def installed() -> bool:
    return _state.active


def _devices(cuda: Any) -> list[int]:
    """The devices whose allocator has reserved memory at some point of the process (looked for at each call)."""
    devices = _state.devices
    for device in range(cuda.device_count()):
        if device not in devices and cuda.memory_reserved(device) > 0:
            devices.add(device)
    return sorted(devices)


def _observe_rss(options: Any) -> Iterable[Any]:
    if not _state.active:
        return []
    try:
        from opentelemetry.metrics import Observation

        rss = rss_bytes()
        if rss is None:
            selftelemetry.count(selftelemetry.DROPPED, "metrics", "process_memory_unreadable")
            return []
        return [Observation(rss)]
    except Exception:
        selftelemetry.count(selftelemetry.DROPPED, "metrics", "process_memory_error")
        return []


def _observe_cuda(function: str) -> Callable[[Any], Iterable[Any]]:
    def callback(options: Any) -> Iterable[Any]:
        if not _state.active:
            return []
        try:
            from opentelemetry.metrics import Observation

            cuda = sys.modules.get(_CUDA_MODULE)
            if cuda is None or not cuda.is_initialized():
                return []
            read = getattr(cuda, function)
            return [Observation(int(read(device)), {DEVICE: device}) for device in _devices(cuda)]
        except Exception:
            selftelemetry.count(selftelemetry.DROPPED, "metrics", "cuda_memory_error")
            return []

    return callback


def _known(provider: Any) -> bool:
    try:
        return provider in _state.providers
    except TypeError:
        return id(provider) in _state.provider_ids


def _remember(provider: Any) -> None:
    try:
        _state.providers.add(provider)
    except TypeError:
        _state.provider_ids.add(id(provider))


def _ensure(*_: Any) -> None:
    """Create the instruments on the ready pipeline's meter provider, once per pipeline (generation) and provider."""
    if not _state.active:
        return
    generation = pipeline._generation[0]
    if generation == _state.generation:
        return
    current = pipeline.ready()
    if current is None:
        return
    with _state.lock:
        provider = current.meter_provider
        if _known(provider):
            _state.generation = generation
            return
        try:
            meter = provider.get_meter("torchelastic_otel", __version__)
            meter.create_observable_up_down_counter(
                names.PROCESS_MEMORY_USAGE, callbacks=[_observe_rss], unit="By",
                description="The amount of physical memory in use (resident set size) of this worker process",
            )  # fmt: skip
            for name, function, description in _CUDA_GAUGES:
                meter.create_observable_gauge(name, callbacks=[_observe_cuda(function)], unit="By",
                                              description=description)  # fmt: skip
        except Exception:
            selftelemetry.count(selftelemetry.DROPPED, "metrics", "memory_instruments_error")
        _remember(provider)
        _state.generation = generation


def install(patches: Patches) -> None:
    """Report this worker's memory (see the module's docstring); ``patches.restore()`` stops it. Idempotent."""
    if _state.active:
        return
    _state.active = True
    _state.generation = -1

    def on_phase(phase: Any) -> None:
        if phase is pipeline.Phase.READY:
            _ensure()

    pipeline.add_listener(on_phase)
    pipeline.when_ready(_ensure)

    def undo() -> None:
        pipeline.remove_listener(on_phase)
        _state.active = False  # the instruments stay on their provider (the SDK cannot drop them) and report nothing

    patches.on_restore(undo)
