"""Step time per rank: each optimizer step of a worker, or each ``torchelastic_otel.step()``, marks a training step.

On the training path (torch's optimizer calls its global post hooks after every ``step()``) a mark is one append of
``(time.time_ns(), id(optimizer))`` to a bounded deque: well under the 2 µs a step the bridge may cost
(``bench/bench_steps.py``). A full deque turns marks away and counts them (``buffer_full``), as the bridge's metric
buffers do. The drainer thread (``_export.drainer``, every 0.5 s, and before every metric collection) turns the marks
into step durations: histogram ``torchelastic.worker.step.duration`` (s) and counter ``torchelastic.worker.steps``. They
carry no rank attribute: the worker's resource says which rank it is.

Which steps count, when a process has several optimizers (a GAN's two, one per parameter group): the *step clock* is
the first optimizer that steps; another one takes its place when it steps twice while the clock does not (the first
was replaced). Once ``torchelastic_otel.step()`` has been called in the process, it alone marks steps.

The recent marks are kept (:func:`recent_marks`): the Flight Recorder reader (``collectives``) places each rank's
collectives in its steps, and the stall watchdog (``stalls``) asks when the last step was (:func:`progress`).
"""

from __future__ import annotations

import collections
import logging
import statistics
import threading
import time
from typing import Any

from torchelastic_otel import _names as names
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel import pipeline
from torchelastic_otel._export import drainer as _drainer
from torchelastic_otel._torch.worker import anatomy
from torchelastic_otel.metrics.rules import DURATION_BUCKETS_S
from torchelastic_otel.version import __version__

__all__ = ["step", "optimizer_hook", "progress", "recent_marks", "median_step_seconds", "instruments"]

_logger = logging.getLogger("torchelastic_otel")

#: Marks buffered between two drains before new ones are turned away (and counted).
MAX_PENDING = 65536
#: Step ends kept for the Flight Recorder reader (a few minutes of fast steps).
MAX_MARKS = 4096
#: Step durations the median (stall threshold) is taken over.
MEDIAN_OF = 101
#: The "optimizer" of an explicit ``step()`` call.
EXPLICIT = 0


class _Clock:
    """Which marks are steps (see the module's docstring), and what the steps so far were."""

    def __init__(self) -> None:
        self.optimizer: int | None = None
        self.explicit = False
        self.streak: dict[int, int] = {}
        self.last_ns: int | None = None
        self.count = 0
        self.durations: collections.deque[float] = collections.deque(maxlen=MEDIAN_OF)
        self.marks: collections.deque[int] = collections.deque(maxlen=MAX_MARKS)

    def is_step(self, who: int) -> bool:
        if who == EXPLICIT:
            self.explicit, self.optimizer = True, EXPLICIT
            return True
        if self.explicit:
            return False
        if self.optimizer is None:
            self.optimizer = who
        if who == self.optimizer:
            self.streak.clear()
            return True
        self.streak[who] = self.streak.get(who, 0) + 1
        if self.streak[who] < 2:
            return False
        self.optimizer = who
        self.streak.clear()
        return True

    def mark(self, time_ns: int) -> float | None:
        """Count a step that ended at ``time_ns``; its duration in seconds (``None`` for the first)."""
        previous, self.last_ns = self.last_ns, time_ns
        self.count += 1
        self.marks.append(time_ns)
        if previous is None:
            return None
        duration = (time_ns - previous) / 1e9
        if duration < 0:  # the wall clock was set back
            selftelemetry.count(selftelemetry.SANITIZED, "metrics", "step_clock_backwards")
            return None
        self.durations.append(duration)
        return duration


class _Instruments:
    """The instruments of the worker's training telemetry, on the current pipeline's meter provider."""

    def __init__(self) -> None:
        self._generation = -1
        self._lock = threading.Lock()
        self.duration: Any = None
        self.steps: Any = None
        self.arrival: Any = None
        self.seq: Any = None
        self.phase: Any = None
        self.goodput: Any = None
        self.at_risk: Any = None
        self.phase_median: Any = None

    def get(self) -> _Instruments:
        generation = pipeline._generation[0]
        if self.duration is not None and generation == self._generation:
            return self
        with self._lock:
            provider = pipeline.get_pipeline().meter_provider
            meter = provider.get_meter("torchelastic_otel", __version__)
            self.duration = meter.create_histogram(
                names.WORKER_STEP_DURATION, unit="s", explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
                description="Time between two consecutive training steps of this rank (optimizer steps)",
            )  # fmt: skip
            self.steps = meter.create_counter(
                names.WORKER_STEPS, unit="{step}", description="Training steps of this rank"
            )
            self.arrival = meter.create_histogram(
                names.WORKER_STEP_ARRIVAL, unit="s", explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
                description="Time from the start of a step to this rank's arrival at the step's last collective "
                "(Flight Recorder): the rank's own work in the step, without its waits for other ranks",
            )  # fmt: skip
            self.seq = meter.create_gauge(
                names.WORKER_COLLECTIVE_SEQ, unit="{collective}",
                description="Sequence number of the last collective this rank enqueued, per process group",
            )  # fmt: skip
            self.phase = meter.create_histogram(
                names.WORKER_STEP_PHASE_DURATION, unit="s", explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
                description="Seconds of each phase of a training step of this rank (attribute phase: input, "
                "forward, backward, optimizer, collective_wait, other)",
            )  # fmt: skip
            self.goodput = meter.create_counter(
                names.GOODPUT_TIME, unit="s",
                description="Where this process's time went, by cause (goodput: productive, startup, input_wait, "
                "checkpoint_save, checkpoint_load, stalled, lost_progress; the agent adds rendezvous and restart)",
            )  # fmt: skip
            self.phase_median = meter.create_gauge(
                names.WORKER_STEP_PHASE_MEDIAN, unit="s",
                description="Median seconds of each phase of this rank's last steps (up to 1,001; attribute phase): "
                "exact where the duration histogram's buckets only bound it",
            )  # fmt: skip
            # A synchronous gauge, set at each drain: an observable one registered here -- under the step buffer's
            # lock, which a metric collection's drain waits for -- deadlocks with a collection that holds the SDK's
            # consumer lock (seen: a worker hung in destroy_process_group).
            self.at_risk = meter.create_gauge(
                names.WORKER_PROGRESS_AT_RISK, unit="s",
                description="Step seconds since this rank's last completed checkpoint save: what a failure now "
                "would throw away (attribute cause: productive, input_wait, stalled)",
            )  # fmt: skip
            if anatomy.installed():  # every series from its first export: Prometheus's rate() skips a first value
                for cause in anatomy.CAUSES:
                    self.goodput.add(0, {names.CAUSE: cause})
            self._generation = generation
        return self


_instruments = _Instruments()


def instruments() -> _Instruments:
    """The instruments, (re)created for the current pipeline (after a fork's rebuild, a ``setup()``)."""
    return _instruments.get()


class _StepBuffer(_drainer.Buffer):
    """Step marks on their way to the instruments (see the module's docstring)."""

    signal = "metrics"

    def __init__(self) -> None:
        super().__init__(MAX_PENDING)
        self.clock = _Clock()
        _drainer.register(self)

    def drain(self, deadline: float | None = None) -> int:
        """Turn the buffered marks into steps and record them (one counter call, one histogram call a step)."""
        with self._lock:
            self._count_overflow()
            pending = self._pending
            if not pending:
                return 0
            durations: list[float] = []
            steps = 0
            clock = self.clock
            book = anatomy.active()
            events = False
            while pending:
                try:
                    time_ns, who = pending.popleft()
                except IndexError:
                    break
                events = True
                if who < 0:
                    if book is not None:
                        book.event(time_ns, who)
                    continue
                if who != EXPLICIT and book is not None:
                    book.optimizer_exit(time_ns)
                if not clock.is_step(who):
                    continue
                steps += 1
                duration = clock.mark(time_ns)
                if book is not None:
                    book.step(time_ns)
                if duration is not None:
                    durations.append(duration)
            if steps:
                self._record(steps, durations)
            if events and book is not None:
                anatomy.after_drain()
            return steps

    @staticmethod
    def _record(steps: int, durations: list[float]) -> None:
        try:
            meters = instruments()
            meters.steps.add(steps)
            for duration in durations:
                meters.duration.record(duration)
        except Exception as exc:
            selftelemetry.count(selftelemetry.DROPPED, "metrics", "record_error")
            _logger.debug("torchelastic_otel: step metrics dropped: %s", exc, exc_info=True)

    def after_fork_in_child(self) -> None:
        super().after_fork_in_child()
        self.clock = _Clock()  # a forked child (a data loader worker) takes no steps of its parent's
        anatomy.reset_after_fork()


_buffer = _StepBuffer()
_pending = _buffer._pending  # the same deque for the life of the process (a fork clears it in place)
_time_ns = time.time_ns
anatomy.bind(_pending, _buffer, instruments, MAX_PENDING)


def optimizer_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    """torch's global optimizer step post hook: mark a step (the hot path: one append)."""
    if len(_pending) < MAX_PENDING:
        _pending.append((_time_ns(), id(optimizer)))
    else:
        _buffer._overflow += 1


def step() -> None:
    """Mark the end of a training step of this rank, for loops that do not step a ``torch.optim`` optimizer.

    Once called, only these calls mark steps in this process (optimizer steps no longer do). Costs about as much as
    an optimizer's own mark (an append to a bounded buffer); never raises.
    """
    if len(_pending) < MAX_PENDING:
        _pending.append((_time_ns(), EXPLICIT))
    else:
        _buffer._overflow += 1


def progress() -> tuple[int, int | None]:
    """``(steps so far, when the last one ended in ns since the epoch or None)``, as of the last drain."""
    clock = _buffer.clock
    return clock.count, clock.last_ns


def pending_marks() -> bool:
    """Whether marks wait for the next drain (a step happened since :func:`progress` was last brought up to date)."""
    return bool(_pending)


def recent_marks() -> list[int]:
    """The ends of the last steps (ns since the epoch, oldest first), up to ``MAX_MARKS``."""
    with _buffer._lock:
        return list(_buffer.clock.marks)


def median_step_seconds() -> float | None:
    """The median duration of the last ``MEDIAN_OF`` steps; ``None`` before the second step."""
    with _buffer._lock:
        durations = list(_buffer.clock.durations)
    return statistics.median(durations) if durations else None


def lock() -> Any:
    """The lock a drain holds (the ledger of ``anatomy`` is the drain's: take it to touch the ledger elsewhere)."""
    return _buffer._lock


def drain() -> None:
    """Bring :func:`progress` up to date now (the watchdog's tick runs between two drains)."""
    try:
        _buffer.drain()
    except Exception:
        selftelemetry.count(selftelemetry.DROPPED, "metrics", "drain_error")
