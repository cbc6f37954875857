"""Step time per rank: each optimizer step of a worker, or each ``torchelastic_otel.step()``, marks a training step.

On the training path (torch's optimizer calls its global post hooks after every ``step()``) a mark is one append of
``(time.time_ns(), id(optimizer), event)`` to the worker's step timeline (``timeline``: a bounded deque; a full one
turns marks away and counts them, ``buffer_full``). The drainer thread (``_export.drainer``, every 0.5 s, and before
every metric collection) turns the marks into step durations: histogram ``torchelastic.worker.step.duration`` (s) and
counter ``torchelastic.worker.steps``, and gives them to the anatomy of each step (``anatomy``). They carry no rank
attribute: the worker's resource says which rank it is.

Which steps count, when a process has several optimizers (a GAN's two, one per parameter group): the *step clock* is
the first optimizer that steps; another one takes its place when it steps twice while the clock does not (the first
was replaced). Once ``torchelastic_otel.step()`` has been called in the process, it alone marks steps.

The recent marks are kept (:func:`recent_marks`): the Flight Recorder reader (``collectives``) places each rank's
collectives in its steps, and the stall watchdog (``stalls``) asks when the last step was (:func:`progress`).
"""

from __future__ import annotations

import collections
import os
import statistics
from typing import TYPE_CHECKING, Any

from torchelastic_otel import _names as names
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._export.meters import PerPipeline
from torchelastic_otel._torch.worker import anatomy
from torchelastic_otel._torch.worker.timeline import EXPLICIT, MAX_PENDING, timeline
from torchelastic_otel.metrics.rules import DURATION_BUCKETS_S
from torchelastic_otel.version import __version__

if TYPE_CHECKING:
    from opentelemetry.metrics import Histogram, Meter

#: The instrumentation scope of the worker's instruments.
SCOPE = "torchelastic_otel"

__all__ = [
    "step",
    "optimizer_hook",
    "progress",
    "recent_marks",
    "median_step_seconds",
    "instruments",
    "MAX_PENDING",
    "EXPLICIT",
]


#: Step ends kept for the Flight Recorder reader (a few minutes of fast steps).
MAX_MARKS = 4096
#: Step durations the median (stall threshold) is taken over.
MEDIAN_OF = 101


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


class Instruments:
    """The instruments of the worker's training telemetry, on one pipeline's meter."""

    def __init__(self, meter: Meter) -> None:
        def histogram(name: str, description: str) -> Histogram:
            return meter.create_histogram(
                name, unit="s", explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S, description=description
            )

        self.duration = histogram(
            names.WORKER_STEP_DURATION, "Time between two consecutive training steps of this rank (optimizer steps)"
        )
        self.steps = meter.create_counter(names.WORKER_STEPS, unit="{step}", description="Training steps of this rank")
        self.arrival = histogram(
            names.WORKER_STEP_ARRIVAL,
            "Time from the start of a step to this rank's arrival at the step's last collective (Flight Recorder): "
            "the rank's own work in the step, without its waits for other ranks",
        )
        self.seq = meter.create_gauge(
            names.WORKER_COLLECTIVE_SEQ,
            unit="{collective}",
            description="Sequence number of the last collective this rank enqueued, per process group",
        )
        self.phase = histogram(
            names.WORKER_STEP_PHASE_DURATION,
            "Seconds of each phase of a training step of this rank (attribute phase: input, forward, backward, "
            "optimizer, collective_wait, other; clock: device where the GPU's own)",
        )
        self.goodput = meter.create_counter(
            names.GOODPUT_TIME,
            unit="s",
            description="Where this process's time went, by cause (goodput: productive, startup, input_wait, "
            "checkpoint_save, checkpoint_load, stalled, lost_progress; the agent adds rendezvous and restart)",
        )
        self.phase_median = meter.create_gauge(
            names.WORKER_STEP_PHASE_MEDIAN,
            unit="s",
            description="Median seconds of each phase of this rank's last steps (up to 1,001; attribute phase): "
            "exact where the duration histogram's buckets only bound it",
        )
        self.gpu_idle = histogram(
            names.WORKER_STEP_GPU_IDLE,
            "Seconds the GPU waited for the host in each training step of this rank measured on the GPU's clock "
            "(CUDA events): a loader, a sync, the loop's Python",
        )
        self.arrival_median = meter.create_gauge(
            names.WORKER_STEP_ARRIVAL_MEDIAN,
            unit="s",
            description="Median arrival of this rank's last steps (up to 1,001) at their last collective",
        )
        # A synchronous gauge, set at each drain: an observable one registered here -- under the timeline's lock,
        # which a metric collection's drain waits for -- deadlocks with a collection that holds the SDK's consumer
        # lock (a worker hung in destroy_process_group).
        self.at_risk = meter.create_gauge(
            names.WORKER_PROGRESS_AT_RISK,
            unit="s",
            description="Step seconds since this rank's last completed checkpoint save: what a failure now would "
            "throw away (attribute cause: productive, input_wait, stalled)",
        )
        if anatomy.installed():  # every series from its first export: Prometheus's rate() skips a first value
            for cause in anatomy.CAUSES:
                self.goodput.add(0, {names.CAUSE: cause})


_instruments = PerPipeline(lambda pipeline: Instruments(pipeline.meter_provider.get_meter(SCOPE, __version__)))


def instruments() -> Instruments:
    """The instruments, (re)created for the current pipeline (after a fork's rebuild, a ``setup()``)."""
    return _instruments.get()


class _Steps:
    """The step clock and the instruments' feed: consumes the timeline's marks (the drainer's thread, under the
    timeline's lock)."""

    def __init__(self) -> None:
        self.clock = _Clock()

    def consume(self, marks: list[tuple[int, int, object]]) -> None:
        """Turn drained marks into steps and record them (one counter call, one histogram call a step)."""
        durations: list[float] = []
        count = 0
        clock = self.clock
        book = anatomy.active()
        release = timeline.device.release
        for time_ns, who, event in marks:
            if who < 0:
                if book is not None:
                    book.event(time_ns, who, event)
                elif event is not None:
                    release(event)
                continue
            if book is not None:
                if who != EXPLICIT:
                    book.optimizer_exit(time_ns, event)
            if not clock.is_step(who):
                if book is None and event is not None:
                    release(event)
                continue
            count += 1
            duration = clock.mark(time_ns)
            if book is not None:
                book.step(time_ns, event)
            elif event is not None:
                release(event)
            if duration is not None:
                durations.append(duration)
        if count:
            self._record(count, durations)
        if book is not None and (marks or book.on_device):
            anatomy.after_drain()

    @staticmethod
    def _record(count: int, durations: list[float]) -> None:
        """The counter counts every step; the duration histogram, a fast loop's even sample (``sample``)."""
        try:
            meters = instruments()
            meters.steps.add(count)
            record = meters.duration.record
            for duration in sample(durations, sum(durations)):
                record(duration)
        except Exception as exc:
            selftelemetry.count_exception("metrics", "record_error", exc)

    def reset(self) -> None:
        """A forked child (a data loader worker) takes no steps of its parent's; tests start afresh."""
        self.clock = _Clock()
        anatomy.reset_after_fork()


def sample(values: list[Any], span_seconds: float) -> list[Any]:
    """At most ``anatomy.PHASE_STEPS_PER_SECOND`` of ``values`` a second of the ``span_seconds`` they cover (a batch
    of ``anatomy.PHASE_STEPS_AT_ONCE`` whole, whatever its pace): an even sample of a fast loop's steps, so that
    recording them costs the job a bounded share of its time (each SDK call costs microseconds)."""
    allowed = max(float(anatomy.PHASE_STEPS_AT_ONCE), span_seconds * anatomy.PHASE_STEPS_PER_SECOND)
    if len(values) <= allowed:
        return values
    every = len(values) / allowed
    return [values[int(i * every)] for i in range(int(allowed))]


_steps = _Steps()
timeline.consume_with(_steps.consume)
anatomy.use_instruments(instruments)
_step_mark = timeline.step_mark
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_steps.reset)


def optimizer_hook(optimizer: object, args: object, kwargs: object) -> None:
    """torch's global optimizer step post hook: mark a step (the hot path: one append)."""
    _step_mark(id(optimizer))


def step() -> None:
    """Mark the end of a training step of this rank, for loops that do not step a ``torch.optim`` optimizer.

    Once called, only these calls mark steps in this process (optimizer steps no longer do). Costs about as much as
    an optimizer's own mark (an append to a bounded buffer); never raises.
    """
    _step_mark(EXPLICIT)


def reset() -> None:
    """Forget every mark and step so far (tests)."""
    with timeline.lock:
        timeline.discard("reset")
        _steps.reset()


def progress() -> tuple[int, int | None]:
    """``(steps so far, when the last one ended in ns since the epoch or None)``, as of the last drain."""
    clock = _steps.clock
    return clock.count, clock.last_ns


def pending_marks() -> bool:
    """Whether marks wait for the next drain (a step happened since :func:`progress` was last brought up to date)."""
    return timeline.waiting()


def recent_marks() -> list[int]:
    """The ends of the last steps (ns since the epoch, oldest first), up to ``MAX_MARKS``."""
    with timeline.lock:
        return list(_steps.clock.marks)


def median_step_seconds() -> float | None:
    """The median duration of the last ``MEDIAN_OF`` steps; ``None`` before the second step."""
    with timeline.lock:
        durations = list(_steps.clock.durations)
    return statistics.median(durations) if durations else None


def lock() -> Any:
    """The lock a drain holds (the ledger of ``anatomy`` is the drain's: take it to touch the ledger elsewhere)."""
    return timeline.lock


def drain() -> None:
    """Bring :func:`progress` up to date now (the watchdog's tick runs between two drains)."""
    try:
        timeline.drain()
    except Exception:
        selftelemetry.count(selftelemetry.DROPPED, "metrics", "drain_error")
