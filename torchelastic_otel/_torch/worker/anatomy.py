"""The anatomy of a rank's steps and where its time goes (goodput), with no code change.

**On the training path** two wrappers put marks on the worker's step timeline (``timeline``: one append, and on a
sampled step of a CUDA job one pooled CUDA event recorded on the current stream), nothing else:

- a ``DataLoader`` iterator's ``__next__`` (enter, exit): ``input``, the loop waiting for its data;
- ``torch.autograd.backward`` (``loss.backward()`` calls it): ``backward``;
- checkpoint saves and loads (``checkpoints``, through :func:`checkpoint_enter` / :func:`checkpoint_exit`).

torch's optimizer step post hook marks a step's end (``steps``). The other phases are the time between the marks,
by where the step is: after an input and before the backward, the ``forward`` (the model, the loss; all before the
backward where the step had no input); after the backward until the optimizer's step ends, the ``optimizer``
(unscaling, clipping, the update; Lightning runs the forward and the backward inside ``optimizer.step(closure)``,
which this reads right); before the step's input, ``other`` (the last step's logging, ``zero_grad``, a scheduler).
No module hook is added: a global ``nn.Module`` hook sends every module call through torch's slow path. Nothing
wrapped is traced by ``torch.compile``: dynamo breaks the graph at ``loss.backward()`` before it reaches
``torch.autograd.backward``, and does not trace a ``DataLoader``. A wrapper leaves no frame of its own in a
traceback that passes through it: the user's console is plain torchrun's.

**On the drainer's thread** the marks become, per step (from the end of the step before, or for the first step from
its first phase event, to its optimizer step), the step's phases on one of two clocks:

- *host*: the host's own clock, on a CPU job (and on a CUDA job's steps before it initialised CUDA);
- *device*: on a job that uses CUDA, the GPU's own clock (``device_clock``): the host runs ahead of the GPU, so its
  clock shows the GPU's time wherever it next waits. One step in ``timeline.SAMPLE_EVERY`` carries a CUDA event at
  each of its marks; once the GPU has reached its last one (a non-blocking ``query()``), its phases are the GPU's,
  ``input`` is only the input wait during which the GPU was idle, and the GPU's idle time in the step is measured.

and these instruments:

- histogram ``torchelastic.worker.step.phase.duration`` {``phase``, and ``clock="device"`` on the GPU's clock}: the
  seconds of each phase -- ``input``, ``forward``, ``backward``, ``optimizer``, ``collective_wait``, ``other`` --
  and gauge ``torchelastic.worker.step.phase.median`` their median over the recent steps. ``collective_wait`` is
  carved from the phase in which the rank enqueued the step's last collective (torch's Flight Recorder, read by
  ``collectives``): on the host clock from that moment to the phase's end (the rank waits for the others); on the
  GPU's clock the collective's own GPU duration, where NCCL times its collectives. Where the recorder is read, the
  steps wait for its next read (every 10 s at least, at ``destroy_process_group`` and at exit; a group destroyed
  before the pipeline was ready leaves its last entries for the steps, ``collectives.awaiting_read``);
- histogram ``torchelastic.worker.step.gpu_idle.duration``: the GPU's idle seconds in each device-clock step;
- counter ``torchelastic.goodput.time`` {``cause``}: ``startup`` (the process's start to its first step),
  ``input_wait`` (on a CUDA job: the part of the input waits the GPU spent idle; the rest of them the GPU was
  computing, which is ``productive``), ``checkpoint_save``, ``checkpoint_load``, ``stalled`` (a step the watchdog
  reported stalled, from the last progress on) and ``productive`` (the rest of each step). The process's start plus
  these seconds is the end of its last step: the report gives the rest of the process's life its cause;
- gauge ``torchelastic.worker.progress.at_risk`` {``cause``}: the step seconds since the last completed checkpoint
  save (all of them when none was saved) -- what a failure now would throw away;
- a worker that dies of an exception or SIGTERM adds what was at risk, and the unfinished step, to
  ``torchelastic.goodput.time`` {``cause=lost_progress``} in its final words.
"""

from __future__ import annotations

import bisect
import collections
import functools
import logging
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from torchelastic_otel import _names as names
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._process.start import process_start_ns
from torchelastic_otel._torch import tracebacks
from torchelastic_otel._torch.patches import Patches
from torchelastic_otel._torch.worker import device_clock
from torchelastic_otel._torch.worker.timeline import MAX_PENDING, timeline

__all__ = [
    "checkpoint_enter",
    "checkpoint_exit",
    "checkpoint_committed",
    "PHASES",
    "CAUSES",
    "Ledger",
    "Step",
    "Collective",
    "install",
    "resolve",
    "on_device_clock",
    "poll_device",
    "start_device_clock",
]

_logger = logging.getLogger("torchelastic_otel")

#: The phases of a step, in the order a step goes through them.
PHASES = names.STEP_PHASES
#: The causes a worker's seconds are counted under (``lost_progress`` by its final words).
CAUSES = ("startup", "productive", "input_wait", "checkpoint_save", "checkpoint_load", "stalled", "lost_progress")

# Event codes: negative, so that they never collide with an optimizer's id (the marks of ``steps``) or EXPLICIT (0).
INPUT_ENTER, INPUT_EXIT = -1, -2
BACKWARD_ENTER, BACKWARD_EXIT = -5, -6
SAVE_ENTER, SAVE_EXIT = -9, -10
LOAD_ENTER, LOAD_EXIT = -11, -12
SAVE_COMMITTED = -13
#: Steps waiting for the Flight Recorder's next read (or the GPU) before their phases are recorded.
MAX_UNRESOLVED = 20000
#: The recent steps the median of each phase is taken over.
MEDIAN_OF = 1001
#: The recent sampled steps whose input waits say how much of an unsampled step's input wait the GPU idled.
IDLE_SHARE_OF = 32
#: A sampled step whose events the GPU has not reached after this long is counted on the host's figures.
DEVICE_PATIENCE_S = 120.0
#: The steps a second whose phases are recorded, at most: a faster loop's are an even sample (``_sample``); a batch
#: of this many steps is recorded whole, whatever its pace.
PHASE_STEPS_PER_SECOND = 100
PHASE_STEPS_AT_ONCE = 50

HOST, DEVICE = "host", "device"
_ENTER = {INPUT_ENTER: "input", BACKWARD_ENTER: "backward"}
#: Where a step is between two phases: before its input (or a loop's first backward), after a backward.
_PRE, _TAIL = "pre", "tail"
_EXIT = {INPUT_EXIT: "input", BACKWARD_EXIT: "backward"}
_CHECKPOINT = {SAVE_ENTER: ("save", 1), SAVE_EXIT: ("save", -1), LOAD_ENTER: ("load", 1), LOAD_EXIT: ("load", -1)}

#: A collective as the Flight Recorder saw it: its creation (host ns) and, where NCCL timed it, its GPU seconds.
Collective = tuple[int, "float | None"]


def checkpoint_enter(kind: str) -> None:
    """A checkpoint ``kind`` ("save" | "load") begins its blocking part on this thread."""
    timeline.mark(SAVE_ENTER if kind == "save" else LOAD_ENTER)


def checkpoint_exit(kind: str) -> None:
    """The blocking part of checkpoint ``kind`` ended (completed or raised)."""
    timeline.mark(SAVE_EXIT if kind == "save" else LOAD_EXIT)


def checkpoint_committed() -> None:
    """A save is durably complete: the steps before it are kept whatever happens next."""
    timeline.mark(SAVE_COMMITTED)


# ---- the drainer's side: from marks to steps, phases and causes ------------------------------------------------


@dataclass(slots=True)
class Step:
    """One finished step: its bounds, its phases' seconds, and what its goodput causes are made of."""

    start: int
    end: int
    phases: dict[str, float]
    # (phase, start_ns, end_ns) of the step's stretches (not its checkpoints'), in order
    segments: list[tuple[str, int, int]] = field(default_factory=list)
    # (host ns, CUDA event or None) of every mark from the step's start to its end
    bounds: list[tuple[int, object]] = field(default_factory=list)
    input_host: float = 0.0
    checkpoint_save: float = 0.0
    checkpoint_load: float = 0.0
    stalled_for: float = 0.0  # the stall reported in it, before it is bounded by the step's own work
    clock: str = HOST
    idle: float | None = None  # the GPU's idle seconds in it (device clock)
    device: device_clock.DeviceStep | None = None
    waiting_since: float = 0.0
    host_only_on_device: bool = False  # a CUDA job's step not measured on the GPU's clock: its phases not recorded

    @property
    def seconds(self) -> float:
        return (self.end - self.start) / 1e9

    @property
    def sampled(self) -> bool:
        """Every mark of the step carries a CUDA event: its figures can be the GPU's."""
        return len(self.bounds) > 1 and all(event is not None for _, event in self.bounds)

    def events(self) -> list[object]:
        return [event for _, event in self.bounds if event is not None]


class Ledger:
    """Turns the marks of one process into steps and seconds by cause (the drainer's thread, under the timeline's
    lock). ``start_ns``: when the process started (its worker span's start)."""

    def __init__(self, start_ns: int) -> None:
        self.start_ns = start_ns
        self.until = start_ns  # the end of what was counted: the process's start, then each step's end
        self.started = False  # the first step began
        self.stack: list[str] = []  # open phases, innermost last
        self.mode = _PRE  # where the step is: before its input (_PRE), after an input ("forward"), after a backward
        self.saving = 0  # checkpoint saves open (their blocking part), and loads
        self.loading = 0
        self.last = start_ns  # the time of the last event seen
        self.seconds: dict[str, float] = collections.defaultdict(float)  # the current stretch, by phase / cause
        self.segments: list[tuple[str, int, int]] = []
        self.bounds: list[tuple[int, object]] = []
        self.holders: dict[int, int] = {}  # id(event) -> the steps (and the step in progress) that hold it
        self.totals: dict[str, float] = dict.fromkeys(CAUSES, 0.0)  # cumulative seconds by cause (the counter)
        self.added: dict[str, float] = collections.defaultdict(float)  # not yet added to the counter
        self.at_risk: dict[str, float] = {"productive": 0.0, "input_wait": 0.0, "stalled": 0.0}
        self.committed_at = 0  # when the last save completed
        self.stalled_since: int | None = None
        self.steps: collections.deque[Step] = collections.deque(maxlen=MAX_UNRESOLVED)  # for the Flight Recorder
        self.on_device: collections.deque[Step] = collections.deque()  # sampled steps the GPU has not reached yet
        self.device_clock = False  # the job records CUDA events (its phases are the GPU's from then on)
        self.idle_shares: collections.deque[tuple[float, float]] = collections.deque(maxlen=IDLE_SHARE_OF)

    # -- the walk: time between two events goes to what was open in between, else to where the step is (``mode``)
    def _advance(self, now: int) -> None:
        last = self.last
        if now <= last:
            return
        self.last = now
        seconds = (now - last) / 1e9
        if self.saving or self.loading:
            self.seconds["checkpoint_save" if self.saving else "checkpoint_load"] += seconds
            return
        if not self.started:
            self.seconds["startup"] += seconds
            return
        stack = self.stack
        label = stack[-1] if stack else self.mode
        self.seconds[label] += seconds
        segments = self.segments
        if segments:
            previous = segments[-1]
            if previous[0] == label and previous[2] == last:
                segments[-1] = (label, previous[1], now)
                return
        segments.append((label, last, now))

    def _bound(self, time_ns: int, event: object) -> None:
        """A mark of the step in progress (its event held by it). Only a job on the GPU's clock keeps them."""
        if not self.device_clock:
            return
        bounds = self.bounds
        if bounds and bounds[-1][0] == time_ns and bounds[-1][1] is event:
            return  # the same mark twice (an optimizer's post hook that also ends the step)
        if event is not None:
            self.holders[id(event)] = self.holders.get(id(event), 0) + 1
        bounds.append((time_ns, event))

    def _relabel(self, old: str, new: str) -> None:
        """What was counted as ``old`` in this step turns out to be ``new`` (the forward of a loop with no input,
        the update before a further micro-batch)."""
        moved = self.seconds.pop(old, 0.0)
        if moved:
            self.seconds[new] += moved
            self.segments = [(new if label == old else label, a, b) for label, a, b in self.segments]

    def event(self, time_ns: int, code: int, device_event: object = None) -> None:
        """One phase or checkpoint mark (not a step's end)."""
        self._advance(time_ns)
        if self.started:
            if self.device_clock:
                self._bound(time_ns, device_event)
        elif device_event is not None:
            self.release_later([device_event])
        phase = _ENTER.get(code)
        if phase is not None:
            if not self.started and not self.saving and not self.loading:
                self._start_first_step(time_ns, device_event)
            if phase == "input" and self.mode == _TAIL:
                self._relabel(_TAIL, _PRE)  # another micro-batch: what followed the backward was not the update
            elif phase == "backward" and self.mode == _PRE:
                self._relabel(_PRE, "forward")  # no input in this step: all before the backward is its forward
            self.stack.append(phase)
            return
        phase = _EXIT.get(code)
        if phase is not None:
            self._close(phase)
            self.mode = "forward" if phase == "input" else _TAIL
            return
        checkpoint = _CHECKPOINT.get(code)
        if checkpoint is not None:
            kind, delta = checkpoint
            if kind == "save":
                self.saving = max(0, self.saving + delta)
            else:
                self.loading = max(0, self.loading + delta)
            return
        if code == SAVE_COMMITTED:
            self._commit(time_ns)

    def _close(self, phase: str) -> None:
        """Close the innermost open ``phase`` (and what was left open inside it: an exception unwound it)."""
        if phase not in self.stack:
            return
        while self.stack:
            if self.stack.pop() == phase:
                return

    def _start_first_step(self, time_ns: int, device_event: object = None) -> None:
        self.started = True
        for cause in ("startup", "checkpoint_save", "checkpoint_load"):
            seconds = self.seconds.pop(cause, 0.0)
            if seconds:
                self.added[cause] += seconds
        self.until = time_ns
        self.bounds = []
        self._bound(time_ns, device_event)

    def optimizer_exit(self, time_ns: int, device_event: object = None) -> None:
        """An optimizer's post hook (every optimizer's, before ``steps`` decides whether it marks a step): what
        followed the backward was this optimizer's update."""
        self._advance(time_ns)
        if self.started and self.device_clock:
            self._bound(time_ns, device_event)
        if self.mode == _TAIL:
            self._relabel(_TAIL, "optimizer")
            self.mode = _PRE

    def stall(self, since_ns: int) -> None:
        """The watchdog reported this rank stalled since ``since_ns`` (its last progress)."""
        if self.stalled_since is None:
            self.stalled_since = since_ns

    def step(self, time_ns: int, device_event: object = None) -> Step | None:
        """A step ended at ``time_ns``: its figures; the step (``None`` when none had begun). Its causes are
        counted now, or for a step sampled on the GPU's clock once the GPU has reached it (:meth:`settle`)."""
        self._advance(time_ns)
        if not self.started:
            self._start_first_step(time_ns, device_event)  # no phase event before it: its time stays startup
            self.segments = []
            return None
        self._bound(time_ns, device_event)
        self._relabel(_TAIL, "optimizer")  # (the clock's own post hook came first: nothing is left here then)
        self._relabel(_PRE, "other")
        seconds, self.seconds = self.seconds, collections.defaultdict(float)
        start, self.until = self.until, time_ns
        phases = {phase: seconds.get(phase, 0.0) for phase in PHASES}
        step = Step(
            start,
            time_ns,
            phases,
            self.segments,
            self.bounds,
            phases["input"],
            seconds.get("checkpoint_save", 0.0),
            seconds.get("checkpoint_load", 0.0),
        )
        self.segments, self.mode = [], _PRE
        self.bounds = []
        self._bound(time_ns, device_event)  # the next step starts where this one ended
        if self.stalled_since is not None:
            step.stalled_for = max(0.0, (time_ns - max(self.stalled_since, start)) / 1e9)
            self.stalled_since = None
        if self.device_clock:
            if step.sampled:
                step.waiting_since = time.monotonic()
                self.on_device.append(step)
                return step
            step.host_only_on_device = True  # its host figures would mislead: the GPU ran its phases elsewhere
        self.settle(step, self._input_wait(step))
        self.steps.append(step)
        return step

    def _input_wait(self, step: Step) -> float:
        """The input wait of a step on the host's clock: all of it on a CPU job; on a CUDA job, the share of it the
        GPU idled in the recent sampled steps."""
        if not self.device_clock or not self.idle_shares:
            return step.input_host
        idle = sum(i for i, _ in self.idle_shares)
        waited = sum(w for _, w in self.idle_shares)
        return step.input_host * (min(1.0, idle / waited) if waited > 0 else 1.0)

    def settle(self, step: Step, input_wait: float) -> None:
        """Count the step's seconds by cause: ``input_wait`` of them waiting for input, the rest productive (less
        its checkpoints and a stall)."""
        save, load = step.checkpoint_save, step.checkpoint_load
        productive = step.seconds - input_wait - save - load
        if productive < 0.0:
            productive = 0.0
        stalled = step.stalled_for
        if stalled:
            stalled = min(productive, stalled)
            productive -= stalled
            self.added["stalled"] += stalled
        added = self.added
        added["productive"] += productive
        if input_wait:
            added["input_wait"] += input_wait
        if save:
            added["checkpoint_save"] += save
        if load:
            added["checkpoint_load"] += load
        if step.end > self.committed_at:
            at_risk = self.at_risk
            at_risk["productive"] += productive
            at_risk["input_wait"] += input_wait
            at_risk["stalled"] += stalled

    def learn_idle(self, step: Step) -> None:
        """A sampled step's input wait on both clocks (for the unsampled steps' :meth:`_input_wait`)."""
        if step.input_host > 0:
            self.idle_shares.append((step.phases.get("input", 0.0), step.input_host))

    def finished(self, step: Step) -> list[object]:
        """The step is done with: the events no step holds any more (to go back to the pool)."""
        free = []
        holders = self.holders
        for event in step.events():
            key = id(event)
            left = holders.get(key, 1) - 1
            if left > 0:
                holders[key] = left
            else:
                holders.pop(key, None)
                free.append(event)
        return free

    def release_later(self, events: Iterable[object]) -> None:
        """Events that belong to no step: back to the pool (re-recording an event is allowed)."""
        for event in events:
            timeline.device.release(event)

    def _commit(self, time_ns: int) -> None:
        """A completed save: what was at risk is kept."""
        self.committed_at = time_ns
        for cause in self.at_risk:
            self.at_risk[cause] = 0.0

    def take_added(self) -> dict[str, float]:
        """The seconds by cause counted since the last call (for the counter)."""
        added, self.added = self.added, collections.defaultdict(float)
        for cause, seconds in added.items():
            self.totals[cause] = self.totals.get(cause, 0.0) + seconds
        return dict(added)

    def lost(self, now_ns: int) -> float:
        """What a failure at ``now_ns`` throws away: the steps at risk (those the GPU has not reached yet too) and
        the unfinished step."""
        if not self.started:
            return 0.0
        waiting = sum(
            s.seconds - s.checkpoint_save - s.checkpoint_load for s in list(self.on_device) if s.end > self.committed_at
        )
        return sum(self.at_risk.values()) + max(0.0, waiting) + max(0.0, (now_ns - self.until) / 1e9)


def carve_collective_wait(step: Step, created: list[int]) -> None:
    """Move the wait for the step's last collective out of the phase it was enqueued in (host clock: see the
    module's docstring). ``created``: the Flight Recorder's creation times, sorted."""
    last = bisect.bisect_right(created, step.end) - 1
    if last < 0 or created[last] <= step.start:
        return
    at = created[last]
    for phase, seg_start, seg_end in step.segments:
        if seg_start <= at < seg_end and phase in ("forward", "backward", "optimizer", "other"):
            wait = min((seg_end - at) / 1e9, step.phases.get(phase, 0.0))
            step.phases[phase] -= wait
            step.phases["collective_wait"] += wait
            return


def _last_collective(step: Step, collectives: list[Collective], created: list[int]) -> Collective | None:
    last = bisect.bisect_right(created, step.end) - 1
    if last < 0 or created[last] <= step.start:
        return None
    return collectives[last]


# ---- the process's ledger and its instruments ------------------------------------------------------------------


class _State:
    def __init__(self) -> None:
        self.ledger: Ledger | None = None
        self.lock = threading.Lock()
        self.recorder_enabled: Any = None  # ``collectives.awaiting_read``, given by ``install``
        self.instruments: Any = None  # ``steps.instruments``, given by ``steps``
        self.installed = False
        self.recent: dict[tuple[str, str], collections.deque[float]] = {}  # the last steps' seconds, by phase
        self.attributes: dict[tuple[str, str], dict[str, str]] = {}
        self.lost: float | None = None  # what the failure threw away, once counted (``lost_progress``)


_state = _State()


def installed() -> bool:
    return _state.installed


def active() -> Ledger | None:
    """This process's ledger, where ``install`` ran (``None``: the goodput telemetry is off)."""
    return ledger() if _state.installed else None


def ledger() -> Ledger:
    """This process's ledger (made at the first event)."""
    found = _state.ledger
    if found is None:
        with _state.lock:
            if _state.ledger is None:
                _state.ledger = Ledger(_process_start_ns())
            found = _state.ledger
    return found


def reset_after_fork() -> None:
    """A forked child (a data loader worker) takes no steps of its parent's."""
    _state.ledger = None
    _state.recent = {}
    _state.lock = threading.Lock()


def use_instruments(instruments: Callable[[], object]) -> None:
    """Where the instruments come from (``steps.instruments``: this module does not import ``steps``)."""
    _state.instruments = instruments


def on_device_clock() -> bool:
    """Whether this process's steps are measured on the GPU's clock (the job uses CUDA)."""
    book = _state.ledger
    return book is not None and book.device_clock


def _process_start_ns() -> int:
    found = process_start_ns()
    return found if found is not None else time.time_ns()


def after_drain() -> None:
    """After a drain counted steps (drainer thread, under the timeline's lock): the sampled steps the GPU has
    reached, the counter; the steps' phases now, or, where torch's Flight Recorder is read, at its next read
    (:func:`resolve`)."""
    book = _state.ledger
    if book is None:
        return
    if book.on_device:
        _reach_device(book)
    added = book.take_added()
    meters = _meters()
    if meters is None:
        return
    try:
        for cause, seconds in added.items():
            meters.goodput.add(seconds, {names.CAUSE: cause})
        if book.started:
            for cause, seconds in book.at_risk.items():
                meters.at_risk.set(seconds, {names.CAUSE: cause})
    except Exception as exc:
        selftelemetry.count_exception("metrics", "record_error", exc)
    if book.steps and not _recorder_read():
        resolve(None)


def _reach_device(book: Ledger) -> None:
    """The sampled steps whose events the GPU has completed, in order: their figures on the GPU's clock. Never
    waits: a step the GPU has not reached stays for the next drain (after ``DEVICE_PATIENCE_S``, counted and
    taken on the host's figures). No query while a CUDA graph is being captured (``timeline``)."""
    device = timeline.device
    if device.capturing or not device.gate.acquire(blocking=False):
        return
    try:
        if device.capturing:
            return
        waiting = book.on_device
        while waiting:
            step = waiting[0]
            try:
                reached = device_clock.completed(step.events())
                found = device_clock.figures(step.bounds, step.segments, PHASES) if reached else None
            except Exception as exc:
                reached, found = True, None
                _logger.debug("torchelastic_otel: a step's CUDA events unreadable: %s", exc)
            if not reached:
                if time.monotonic() - step.waiting_since < DEVICE_PATIENCE_S:
                    return
                selftelemetry.count(selftelemetry.DROPPED, "metrics", "device_step_unreached")
            elif found is None:
                selftelemetry.count(selftelemetry.SANITIZED, "metrics", "device_step_unusable")
            waiting.popleft()
            if found is not None:
                step.clock, step.device, step.idle = DEVICE, found, found.idle
                step.phases = found.phases
                book.learn_idle(step)
                book.settle(step, found.phases.get("input", 0.0))
            else:
                book.settle(step, step.input_host)
            for event in book.finished(step):
                device.release(event)
            if found is not None or reached:
                book.steps.append(step)
    finally:
        device.gate.release()


def _recorder_read() -> bool:
    """Whether ``collectives`` reads torch's Flight Recorder in this process (its steps then wait for a read)."""
    enabled = _state.recorder_enabled
    return os.environ.get("TORCH_FR_BUFFER_SIZE", "") not in ("", "0") and enabled is not None and enabled()


def resolve(collectives: list[Collective] | None) -> list[float] | None:
    """Record the phases of the steps waiting for the Flight Recorder (``collectives``: its entries, oldest
    first; ``None``: nothing to carve). On the GPU's clock, the arrival of each of those steps at its last
    collective (seconds, for ``collectives``); ``None`` on the host's clock."""
    book = _state.ledger
    if book is None:
        return None
    device = book.device_clock
    if not book.steps:
        return [] if device else None
    meters = _meters()
    waiting = []
    while book.steps:
        try:
            waiting.append(book.steps.popleft())
        except IndexError:
            break
    arrivals: list[float] = []
    found = sorted(c for c in collectives or () if c[0] > 0)
    created = [c[0] for c in found]
    for step in waiting:
        if step.device is not None:
            last = _last_collective(step, found, created) if found else None
            if last is not None:
                if last[1] is not None:
                    step.device.carve(last[0], last[1])
                arrival = step.device.arrival(last[0], last[1])
                if arrival is not None:
                    arrivals.append(arrival)
        elif created and not device:
            carve_collective_wait(step, created)
    if meters is not None:
        _record_phases(meters, waiting)
    return arrivals if device else None


def _attributes(phase: str, clock: str) -> dict[str, str]:
    key = (phase, clock)
    found = _state.attributes.get(key)
    if found is None:
        found = {names.PHASE: phase} if clock == HOST else {names.PHASE: phase, names.CLOCK: clock}
        _state.attributes[key] = found
    return found


def _sample(finished: list[Step]) -> list[Step]:
    """At most ``PHASE_STEPS_PER_SECOND`` steps a second of the steps' own time (``PHASE_STEPS_AT_ONCE`` at least): a
    fast loop's phases are an even sample of its steps, so that recording them costs the job a bounded share of its
    time."""
    span = (finished[-1].end - finished[0].start) / 1e9
    allowed = max(float(PHASE_STEPS_AT_ONCE), span * PHASE_STEPS_PER_SECOND)
    if len(finished) <= allowed:
        return finished
    every = len(finished) / allowed
    return [finished[int(i * every)] for i in range(int(allowed))]


def _record_phases(meters: Any, finished: list[Step]) -> None:
    """Each step's phases into the histogram, and the median of the recent steps' into the gauge: the histogram's
    buckets (1 ms, 2.5 ms, 5 ms, ... apart) bound a median within a factor of 2 to 2.5, the gauge says it. On a CUDA
    job only the steps measured on the GPU's clock are recorded; in a loop faster than ``PHASE_STEPS_PER_SECOND``
    steps a second, an even sample of its steps (``_sample``)."""
    finished = [s for s in finished if not s.host_only_on_device]
    if not finished:
        return
    finished = _sample(finished)
    recent = _state.recent
    record, idle = meters.phase.record, meters.gpu_idle.record
    changed: set[tuple[str, str]] = set()
    for step in finished:
        clock = step.clock
        for phase, seconds in step.phases.items():
            value = seconds if seconds > 0.0 else 0.0
            record(value, _attributes(phase, clock))
            key = (phase, clock)
            values = recent.get(key)
            if values is None:
                values = recent[key] = collections.deque(maxlen=MEDIAN_OF)
            values.append(value)
            changed.add(key)
        if step.idle is not None:
            idle(max(0.0, step.idle))
    for key in changed:
        meters.phase_median.set(statistics.median(recent[key]), _attributes(*key))


def _meters() -> Any:
    instruments = _state.instruments
    if instruments is None:
        return None
    try:
        return instruments()
    except Exception:
        selftelemetry.count(selftelemetry.DROPPED, "metrics", "record_error")
        return None


def lost_progress() -> float | None:
    """:func:`add_lost_progress`, once: the first final record that asks counts it (before the first step there is
    nothing to lose yet, and the next record asks again)."""
    if _state.lost is None:
        _state.lost = add_lost_progress()
    return _state.lost


def add_lost_progress() -> float | None:
    """The final words of a failing worker (excepthook, SIGTERM): count what the failure threw away; its seconds,
    ``None`` before the first step (nothing to lose yet: the final words may be asked earlier, while ``import torch``
    runs). Reads the ledger without its lock (the interrupted thread may hold it); never raises."""
    try:
        book = _state.ledger
        if book is None or not book.started:
            return None
        lost = book.lost(time.time_ns())
        meters = _meters()
        if lost > 0 and meters is not None:
            meters.goodput.add(lost, {names.CAUSE: "lost_progress"})
        return lost
    except Exception:
        selftelemetry.count(selftelemetry.DROPPED, "metrics", "lost_progress_error")
        return None


# ---- the device clock: on once the job has initialised CUDA ------------------------------------------------------


def poll_device() -> None:
    """The drainer's tick: once the job has initialised CUDA itself (the bridge never does), its sampled steps are
    measured on the GPU's clock. Never raises."""
    device = timeline.device
    if device.on or not _state.installed:
        return
    cuda = sys.modules.get("torch.cuda")
    try:
        if cuda is None or not cuda.is_initialized():
            return
    except Exception:
        return
    from torchelastic_otel import _compat

    factory = _compat.cuda_event_factory(sys.modules.get("torch"))
    if factory is not None:
        start_device_clock(factory)


def start_device_clock(factory: Callable[[], object]) -> None:
    """Measure this process's sampled steps on the GPU's clock from now on, with events ``factory()`` makes
    (:func:`poll_device`, once the job uses CUDA; a test's scripted device)."""
    with timeline.lock:
        ledger().device_clock = True
    timeline.device.enable(factory)


# ---- the wrappers ----------------------------------------------------------------------------------------------


def _around(original: Any, enter: int, leave: int) -> object:
    """``original`` with a mark before and after (also when it raises, leaving no frame of its own in the
    traceback). The timeline's append is inlined, and its bound checked once: a wrapper's own cost is most of what
    a phase costs the step."""
    append, pending, device = timeline.appender()
    limit, now = MAX_PENDING, time.time_ns

    @functools.wraps(original)
    def wrapper(*args: object, **kwargs: object) -> object:
        if len(pending) >= limit:
            timeline.turned_away(2)
            try:
                return original(*args, **kwargs)
            except BaseException as exc:
                tracebacks.drop_own_frame(exc)
                raise
        append((now(), enter, device.record() if device.armed else None))
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            append((now(), leave, device.record() if device.armed else None))
            tracebacks.drop_own_frame(exc)
            raise
        append((now(), leave, device.record() if device.armed else None))
        return result

    wrapper.__torchelastic_otel_original__ = original  # type: ignore[attr-defined]
    return wrapper


def _around_next(original: Any) -> object:
    """``_around`` for a ``DataLoader`` iterator's ``__next__(self)``: no argument packing. ``StopIteration`` ends
    a loop, not a step's input: its marks are those of any other call."""
    append, pending, device = timeline.appender()
    limit, now = MAX_PENDING, time.time_ns

    @functools.wraps(original)
    def __next__(self: object) -> object:
        if len(pending) >= limit:
            timeline.turned_away(2)
            try:
                return original(self)
            except BaseException as exc:
                tracebacks.drop_own_frame(exc)
                raise
        append((now(), INPUT_ENTER, device.record() if device.armed else None))
        try:
            result = original(self)
        except BaseException as exc:
            append((now(), INPUT_EXIT, device.record() if device.armed else None))
            tracebacks.drop_own_frame(exc)
            raise
        append((now(), INPUT_EXIT, device.record() if device.armed else None))
        return result

    __next__.__torchelastic_otel_original__ = original  # type: ignore[attr-defined]
    return __next__


def install(patches: Patches, recorder_enabled: object = None) -> None:
    """Wrap the phase boundaries once their modules are imported (installing imports no torch); undone by
    ``patches.restore()``. ``recorder_enabled``: whether the Flight Recorder will be read for the steps so far
    (``collectives``)."""
    from torchelastic_otel import _compat
    from torchelastic_otel._torch import imports

    _state.recorder_enabled = recorder_enabled
    _state.installed = True

    def dataloader(module: object) -> None:
        cls = _compat.dataloader_iter_class(module)
        if cls is not None and "__next__" in cls.__dict__:
            patches.set(cls, "__next__", _around_next(cls.__dict__["__next__"]))

    def autograd(module: object) -> None:
        original = getattr(module, "backward", None)
        if callable(original):
            patches.set(module, "backward", _around(original, BACKWARD_ENTER, BACKWARD_EXIT))

    def graphs(module: object) -> None:
        _gate_captures(patches, module)

    hooks = (("torch.utils.data.dataloader", dataloader), ("torch.autograd", autograd), ("torch.cuda.graphs", graphs))
    for module_name, hook in hooks:
        imports.when_imported(module_name, _guarded(hook, module_name))

    def undo() -> None:
        _state.installed = False
        timeline.device.disable()
        for module_name, _hook in hooks:
            imports.cancel(module_name, _guarded_of.get(module_name))  # type: ignore[arg-type]

    patches.on_restore(undo)


def _gate_captures(patches: Patches, module: object) -> None:
    """No CUDA event is recorded or queried while a CUDA graph is captured (``timeline``'s capture gate):
    ``CUDAGraph.capture_begin`` / ``capture_end`` tell the timeline."""
    cls = getattr(module, "CUDAGraph", None)
    if not isinstance(cls, type):
        return
    device = timeline.device
    begin, end = cls.__dict__.get("capture_begin"), cls.__dict__.get("capture_end")
    if not callable(begin) or not callable(end):
        from torchelastic_otel import _compat

        _compat.fallback("torch.cuda.graphs.CUDAGraph.capture_begin / capture_end", "not defined")
        device.disable()  # no gate, no events: a query during a capture could invalidate it
        return

    @functools.wraps(begin)
    def capture_begin(self: object, *args: object, **kwargs: object) -> object:
        device.capture_begins()
        try:
            return begin(self, *args, **kwargs)
        except BaseException as exc:
            device.capture_ends()
            tracebacks.drop_own_frame(exc)
            raise

    @functools.wraps(end)
    def capture_end(self: object, *args: object, **kwargs: object) -> object:
        try:
            result = end(self, *args, **kwargs)
        except BaseException as exc:
            device.capture_ends()
            tracebacks.drop_own_frame(exc)
            raise
        device.capture_ends()
        return result

    patches.set(cls, "capture_begin", capture_begin)
    patches.set(cls, "capture_end", capture_end)


_guarded_of: dict[str, object] = {}


def _guarded(hook: Any, module_name: str) -> Any:
    """``hook`` that never raises into an import (a changed torch: counted)."""

    def guarded(module: object) -> None:
        try:
            hook(module)
        except Exception as exc:
            selftelemetry.count(selftelemetry.FALLBACK, "all", f"anatomy {module_name}")
            _logger.debug("torchelastic_otel: phase hook of %s not installed: %s", module_name, exc)

    _guarded_of[module_name] = guarded
    return guarded
