"""A worker's step timeline: the marks its training thread makes, in order, each with the GPU's own clock on a CUDA job.

A *mark* is ``(time.time_ns(), code, event)``: the end of an optimizer step (``code`` is the optimizer's ``id``) or
of an explicit ``torchelastic_otel.step()`` (``EXPLICIT``), or a phase boundary (negative codes, ``anatomy``): a
``DataLoader``'s ``__next__`` entered and left, ``autograd.backward`` entered and left, a checkpoint's blocking
part entered and left, a save committed. ``event`` is ``None``, or on a job that uses CUDA a CUDA event recorded on
the current stream at that moment (:class:`DeviceEvents`): where the GPU was when the host got there.

**The training thread** only appends to one bounded deque (a full one turns marks away, counted as ``buffer_full``)
and, on the steps that are sampled, records a pooled CUDA event: never a ``synchronize()``, never a blocking call.
**The drainer's thread** (``_export.drainer``: every 0.5 s and before every metric collection) takes the marks and
hands them to the one consumer ``steps`` registers (:meth:`Timeline.consume_with`); the events come back to the
pool once ``anatomy`` has read them with a non-blocking ``query()`` and ``elapsed_time``.

Why sampled: recording a CUDA event costs a driver call (about as much as the rest of a mark together, see
``bench/bench_gpu.py``), and a step has five or six marks. One step in ``SAMPLE_EVERY`` is recorded whole (its
start, the previous step's end, included), so the events cost a fraction of a microsecond a step, and the phases
are medians over the sampled steps.

Why the capture gate: while a CUDA graph is being captured an event may not be recorded into the capture, and
in the default "global" capture mode a ``query()`` from another thread invalidates it. ``torch.cuda.CUDAGraph``'s
``capture_begin`` / ``capture_end`` are wrapped (``install_capture_gate``): marks record no event during a capture,
and the drainer queries only outside one, holding :attr:`DeviceEvents.gate` so that no capture begins meanwhile.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any

from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._export import drainer as _drainer

__all__ = ["Timeline", "DeviceEvents", "timeline", "EXPLICIT", "MAX_PENDING", "SAMPLE_EVERY"]

#: Marks buffered between two drains before new ones are turned away (and counted).
MAX_PENDING = 65536
#: The "optimizer" of an explicit ``step()`` call.
EXPLICIT = 0
#: One step in this many is recorded on the GPU's clock.
SAMPLE_EVERY = 8
#: CUDA events a process may hold (in flight and pooled): when the GPU falls this far behind, marks get none.
MAX_EVENTS = 4096

_time_ns = time.time_ns


class DeviceEvents:
    """The CUDA events of the timeline's marks: a pool, which steps are sampled, and the capture gate.

    ``on`` is set by the drainer's thread once the job has initialised CUDA (:meth:`enable`); from then on a mark
    made while ``armed`` (the step is sampled) takes an event from the pool and records it on the current stream.
    A mark that should have had an event and has none (the pool is empty: the GPU is far behind; a capture is in
    progress; recording failed) is counted in ``missed``; its step is left out of the device figures, never waited
    for."""

    def __init__(self) -> None:
        self.on = False
        self.armed = False
        self.every = SAMPLE_EVERY
        self.calls = 0  # the lead's steps seen by the training thread
        self.lead: int | None = None  # whose marks count the steps (``step_ends``)
        self.behind = 0  # marks of others since the lead's last
        self.capturing = 0  # CUDA graph captures in progress
        self.gate = threading.Lock()  # held by the drainer while it queries, and by a capture's start
        self.free: list[Any] = []
        self.made = 0
        self.limit = MAX_EVENTS
        self.missed = 0
        self.missed_counted = 0
        self.failed = 0
        self.failed_counted = 0
        self.factory: Callable[[], object] | None = None

    def enable(self, factory: Callable[[], object]) -> None:
        """Record events from now on; ``factory()`` makes one (a ``torch.Event`` with timing, or a test's)."""
        self.factory = factory
        self.on = True

    def disable(self) -> None:
        self.on = self.armed = False

    def record(self) -> object:
        """An event recorded on the current stream now, or ``None`` (counted). The training thread only."""
        if self.capturing:
            self.missed += 1
            return None
        free = self.free
        try:
            event = free.pop()
        except IndexError:
            factory = self.factory
            if self.made >= self.limit or factory is None:
                self.missed += 1
                return None
            try:
                event = factory()
            except Exception:
                self._failure()
                return None
            self.made += 1
        try:
            event.record()
        except Exception:
            free.append(event)
            self._failure()
            return None
        return event

    def _failure(self) -> None:
        self.failed += 1
        if self.failed >= 16:  # a changed torch, a device switched under us: stop trying, counted
            self.disable()

    def step_ends(self, who: int) -> object:
        """The event of a step's end marked by ``who``, or ``None``; decides whether the next step is sampled.

        The steps are counted on one *lead* (the first optimizer to step, or explicit steps): a sampled step runs
        from one of its marks to its next, whatever other optimizers step in between (a GAN's two); a lead that
        no longer steps (replaced) hands over to the one that does."""
        lead = self.lead
        if lead is None or who == lead:
            self.lead = who
            self.behind = 0
            self.calls += 1
            begins = self.calls % self.every == 0
            event = self.record() if (begins or self.armed) else None
            self.armed = begins
            return event
        self.behind += 1
        if self.behind > 2 * self.every:
            self.lead = None
        return self.record() if self.armed else None

    def release(self, event: object) -> None:
        """``event`` has been read: back to the pool (the drainer's thread)."""
        self.free.append(event)

    def take_counts(self) -> tuple[int, int]:
        """``(missed, failed)`` since the last call (the drainer's thread; the training thread only adds)."""
        missed, failed = self.missed - self.missed_counted, self.failed - self.failed_counted
        self.missed_counted += missed
        self.failed_counted += failed
        return missed, failed

    def capture_begins(self) -> None:
        with self.gate:
            self.capturing += 1

    def capture_ends(self) -> None:
        self.capturing = max(0, self.capturing - 1)

    def reset_after_fork(self) -> None:
        """A forked child (a data loader worker) records nothing of its parent's on its parent's device."""
        self.__init__()  # type: ignore[misc]


class Timeline(_drainer.Buffer):
    """The marks (see the module's docstring): appended by the training thread, taken by the drainer's."""

    signal = "metrics"

    def __init__(self) -> None:
        super().__init__(MAX_PENDING)
        self.device = DeviceEvents()
        self._consumer: Callable[[list[tuple[int, int, object]]], None] | None = None
        _drainer.register(self)

    # ---- the training thread --------------------------------------------------------------------------------------

    def mark(self, code: int) -> None:
        """A phase or checkpoint boundary now."""
        pending = self._pending
        if len(pending) < MAX_PENDING:
            device = self.device
            if device.armed:
                now = _time_ns()
                pending.append((now, code, device.record()))
            else:
                pending.append((_time_ns(), code, None))
        else:
            self._overflow += 1

    def step_mark(self, who: int) -> None:
        """An optimizer step (``who``: its ``id``) or an explicit step ended now; where the sampled steps begin."""
        pending = self._pending
        if len(pending) < MAX_PENDING:
            device = self.device
            if device.on:
                now = _time_ns()
                pending.append((now, who, device.step_ends(who)))
            else:
                pending.append((_time_ns(), who, None))
        else:
            self._overflow += 1

    def put(self, time_ns: int, code: int, event: object = None) -> None:
        """A mark made at ``time_ns`` (tests and replays: the training thread uses :meth:`mark`)."""
        if len(self._pending) < MAX_PENDING:
            self._pending.append((time_ns, code, event))
        else:
            self._overflow += 1

    def turned_away(self, count: int) -> None:
        """``count`` marks did not fit (a wrapper's inlined append found the deque full)."""
        self._overflow += count

    def appender(self) -> tuple[Callable[[tuple[int, int, object]], None], collections.deque, DeviceEvents]:
        """What a wrapper inlines: the deque's ``append``, the deque (for its length) and the device events."""
        return self._pending.append, self._pending, self.device

    # ---- the drainer's thread -------------------------------------------------------------------------------------

    def consume_with(self, consumer: Callable[[list[tuple[int, int, object]]], None]) -> None:
        """``consumer(marks)`` gets every drained batch, in order, under :attr:`lock` (``steps``): at every drain,
        an empty one too (steps wait there for the GPU to reach them)."""
        self._consumer = consumer

    @property
    def lock(self) -> Any:
        """The lock a drain holds: whoever reads what the consumer builds takes it too."""
        return self._lock

    def waiting(self) -> bool:
        """Whether marks wait for the next drain."""
        return bool(self._pending)

    def __len__(self) -> int:
        """The marks waiting for the next drain."""
        return len(self._pending)

    def drain(self, deadline: float | None = None) -> int:
        with self._lock:
            self._count_overflow()
            pending = self._pending
            marks = []
            popleft = pending.popleft
            while pending:
                try:
                    marks.append(popleft())
                except IndexError:
                    break
            consumer = self._consumer
            if consumer is not None:
                consumer(marks)
            else:
                for _, _, event in marks:
                    if event is not None:
                        self.device.release(event)
            return len(marks)

    def after_fork_in_child(self) -> None:
        super().after_fork_in_child()
        self.device.reset_after_fork()


#: This process's timeline.
timeline = Timeline()


def count_device_misses() -> None:
    """Count the marks that went without their CUDA event since the last call (the drainer's thread)."""
    missed, failed = timeline.device.take_counts()
    if missed:
        selftelemetry.count(selftelemetry.DROPPED, "metrics", "device_event_missed", missed)
    if failed:
        selftelemetry.count(selftelemetry.FALLBACK, "metrics", "device_event_failed", failed)
