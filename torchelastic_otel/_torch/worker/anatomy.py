"""The anatomy of a rank's steps and where its time goes (goodput), with no code change.

**On the training path** two wrappers append ``(time.time_ns(), code)`` to the step marks' bounded deque
(``steps._pending``, the same one torch's optimizer step post hook appends a step's end to), nothing else:

- a ``DataLoader`` iterator's ``__next__`` (enter, exit): ``input``, the loop waiting for its data;
- ``torch.autograd.backward`` (``loss.backward()`` calls it): ``backward``;
- checkpoint saves and loads (``checkpoints``, through :func:`checkpoint_enter` / :func:`checkpoint_exit`).

The other phases are the time between them, by where the step is: after an input and before the backward, the
``forward`` (the model, the loss; all before the backward where the step had no input); after the backward until
the optimizer's step ends, the ``optimizer`` (unscaling, clipping, the update; Lightning runs the forward and the
backward inside ``optimizer.step(closure)``, which this reads right); before the step's input, ``other`` (the last
step's logging, ``zero_grad``, a scheduler). No hook on ``DistributedDataParallel.forward`` or on the optimizer's
step pre hook: each cost the step two or one more events (0.6-1 µs on a 2-core VM) for the same figures.

No module hook is added: a global ``nn.Module`` hook sends every module call through torch's slow path (about a
microsecond each), where these cost a few appends a step. Nothing wrapped is traced by ``torch.compile``: dynamo
breaks the graph at ``loss.backward()`` before it reaches ``torch.autograd.backward``, and does not trace a
``DataLoader``; a compiled model gets no graph break and no recompile (dynamo's counters, ``tests/unit``).

**On the drainer's thread** (``steps``' drain, every 0.5 s and before every metric collection) the events become, per
step (from the end of the step before, or for the first step from its first phase event, to its optimizer step):

- the seconds of each phase -- ``input``, ``forward``, ``backward``, ``optimizer``, ``collective_wait``, ``other``
  -- as histogram ``torchelastic.worker.step.phase.duration`` {``phase``}. ``collective_wait`` is carved from the
  phase in which the rank enqueued the step's last collective (torch's Flight Recorder, read by ``collectives``):
  from that moment to the phase's end the rank waits for the others (DDP's last gradient bucket, or an explicit
  ``all_reduce``). Where the recorder is read, the steps wait for its next read (every 10 s at least, and at exit);
- counter ``torchelastic.goodput.time`` {``cause``}: ``startup`` (the process's start to its first step),
  ``input_wait``, ``checkpoint_save``, ``checkpoint_load``, ``stalled`` (a step the watchdog reported stalled, from
  the last progress on) and ``productive`` (the rest of each step). The process's start plus these seconds is the
  end of its last step: the report gives the rest of the process's life its cause (``report.goodput``);
- gauge ``torchelastic.worker.progress.at_risk`` {``cause``}: the step seconds since the last completed
  checkpoint save (all of them when none was saved) -- what a failure now would throw away;
- a worker that dies of an exception or SIGTERM adds what was at risk, and the unfinished step, to
  ``torchelastic.goodput.time`` {``cause=lost_progress``} in its final words.
"""

from __future__ import annotations

import collections
import logging
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from torchelastic_otel import _names as names
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._process.start import process_start_ns

__all__ = [
    "checkpoint_enter",
    "checkpoint_exit",
    "checkpoint_committed",
    "PHASES",
    "CAUSES",
    "Ledger",
    "install",
]

_logger = logging.getLogger("torchelastic_otel")

#: The phases of a step, in the order a step goes through them.
PHASES = ("input", "forward", "backward", "optimizer", "collective_wait", "other")
#: The causes a worker's seconds are counted under (``lost_progress`` by its final words).
CAUSES = ("startup", "productive", "input_wait", "checkpoint_save", "checkpoint_load", "stalled", "lost_progress")

# Event codes: negative, so that they never collide with an optimizer's id (the marks of ``steps``) or EXPLICIT (0).
INPUT_ENTER, INPUT_EXIT = -1, -2
BACKWARD_ENTER, BACKWARD_EXIT = -5, -6
SAVE_ENTER, SAVE_EXIT = -9, -10
LOAD_ENTER, LOAD_EXIT = -11, -12
SAVE_COMMITTED = -13
#: Steps waiting for the Flight Recorder's next read before their phases are recorded.
MAX_UNRESOLVED = 20000
#: The recent steps the median of each phase is taken over.
MEDIAN_OF = 1001

_ENTER = {INPUT_ENTER: "input", BACKWARD_ENTER: "backward"}
#: Where a step is between two phases: before its input (or a loop's first backward), after a backward.
_PRE, _TAIL = "pre", "tail"
_EXIT = {INPUT_EXIT: "input", BACKWARD_EXIT: "backward"}
_CHECKPOINT = {SAVE_ENTER: ("save", 1), SAVE_EXIT: ("save", -1), LOAD_ENTER: ("load", 1), LOAD_EXIT: ("load", -1)}

_time_ns = time.time_ns


class _Marks:
    """Where the events go: the step marks' deque, its buffer (the count of what a full deque turned away) and the
    instruments, bound by ``steps`` when it is imported (this module imports neither ``steps`` nor torch)."""

    pending: Any = None
    buffer: Any = None
    instruments: Any = None
    limit = 0


_marks = _Marks()


def bind(pending: Any, buffer: Any, instruments: Any, limit: int) -> None:
    """``steps`` hands over its deque, buffer, instruments function and bound."""
    _marks.pending, _marks.buffer, _marks.instruments, _marks.limit = pending, buffer, instruments, limit


def _append(code: int) -> None:
    """The hot path: one append to the step marks' deque (bounded: a full one turns the event away, counted)."""
    pending = _marks.pending
    if pending is None:
        return
    if len(pending) < _marks.limit:
        pending.append((_time_ns(), code))
    else:
        _marks.buffer._overflow += 1


def checkpoint_enter(kind: str) -> None:
    """A checkpoint ``kind`` ("save" | "load") begins its blocking part on this thread."""
    _append(SAVE_ENTER if kind == "save" else LOAD_ENTER)


def checkpoint_exit(kind: str) -> None:
    """The blocking part of checkpoint ``kind`` ended (completed or raised)."""
    _append(SAVE_EXIT if kind == "save" else LOAD_EXIT)


def checkpoint_committed() -> None:
    """A save is durably complete: the steps before it are kept whatever happens next."""
    _append(SAVE_COMMITTED)


# ---- the drainer's side: from events to steps, phases and causes ------------------------------------------------


@dataclass
class Step:
    """One finished step: its bounds, its phases' seconds and where a collective could have been waited for."""

    start: int
    end: int
    phases: dict[str, float]
    # (phase, start_ns, end_ns) of the stretches a collective's wait is carved from: backward and unclaimed time
    segments: list[tuple[str, int, int]] = field(default_factory=list)


class Ledger:
    """Turns the events of one process into steps and seconds by cause (the drainer's thread, under the step
    buffer's lock). ``start_ns``: when the process started (its worker span's start)."""

    def __init__(self, start_ns: int) -> None:
        self.start_ns = start_ns
        self.until = start_ns  # the end of what was counted: the process's start, then each step's end
        self.started = False  # the first step began
        self.stack: list[str] = []  # open phases, innermost last
        self.mode = _PRE  # where the step is: before its input (_PRE), after an input ("forward"), after a backward
        self.checkpoint: dict[str, int] = {"save": 0, "load": 0}
        self.last = start_ns  # the time of the last event seen
        self.seconds: dict[str, float] = collections.defaultdict(float)  # the current stretch, by phase / cause
        self.segments: list[tuple[str, int, int]] = []
        self.totals: dict[str, float] = dict.fromkeys(CAUSES, 0.0)  # cumulative seconds by cause (the counter)
        self.added: dict[str, float] = collections.defaultdict(float)  # not yet added to the counter
        self.at_risk: dict[str, float] = {"productive": 0.0, "input_wait": 0.0, "stalled": 0.0}
        self.stalled_since: int | None = None
        self.steps: collections.deque[Step] = collections.deque(maxlen=MAX_UNRESOLVED)

    # -- the walk: time between two events goes to what was open in between, else to where the step is (``mode``)
    def _advance(self, now: int) -> None:
        if now <= self.last:
            return
        start, self.last = self.last, now
        seconds = (now - start) / 1e9
        if self.checkpoint["save"] or self.checkpoint["load"]:
            self.seconds["checkpoint_save" if self.checkpoint["save"] else "checkpoint_load"] += seconds
            return
        if not self.started:
            self.seconds["startup"] += seconds
            return
        label = self.stack[-1] if self.stack else self.mode
        self.seconds[label] += seconds
        last = self.segments[-1] if self.segments else None
        if last is not None and last[0] == label and last[2] == start:
            self.segments[-1] = (label, last[1], now)
        else:
            self.segments.append((label, start, now))

    def _relabel(self, old: str, new: str) -> None:
        """What was counted as ``old`` in this step turns out to be ``new`` (the forward of a loop with no input,
        the update before a further micro-batch)."""
        moved = self.seconds.pop(old, 0.0)
        if moved:
            self.seconds[new] += moved
        self.segments = [(new if label == old else label, a, b) for label, a, b in self.segments]

    def event(self, time_ns: int, code: int) -> None:
        """One phase or checkpoint event (not a step mark)."""
        self._advance(time_ns)
        phase = _ENTER.get(code)
        if phase is not None:
            if not self.started and not any(self.checkpoint.values()):
                self._start_first_step(time_ns)
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
            self.checkpoint[kind] = max(0, self.checkpoint[kind] + delta)
            return
        if code == SAVE_COMMITTED:
            self._commit()

    def _close(self, phase: str) -> None:
        """Close the innermost open ``phase`` (and what was left open inside it: an exception unwound it)."""
        if phase not in self.stack:
            return
        while self.stack:
            if self.stack.pop() == phase:
                return

    def _start_first_step(self, time_ns: int) -> None:
        self.started = True
        for cause in ("startup", "checkpoint_save", "checkpoint_load"):
            seconds = self.seconds.pop(cause, 0.0)
            if seconds:
                self.added[cause] += seconds
        self.until = time_ns

    def optimizer_exit(self, time_ns: int) -> None:
        """An optimizer's post hook (every optimizer's, before ``steps`` decides whether it marks a step): what
        followed the backward was this optimizer's update."""
        self._advance(time_ns)
        if self.mode == _TAIL:
            self._relabel(_TAIL, "optimizer")
            self.mode = _PRE

    def stall(self, since_ns: int) -> None:
        """The watchdog reported this rank stalled since ``since_ns`` (its last progress)."""
        if self.stalled_since is None:
            self.stalled_since = since_ns

    def step(self, time_ns: int) -> Step | None:
        """A step ended at ``time_ns``: count its seconds; the step (``None`` when none had begun)."""
        self._advance(time_ns)
        if not self.started:
            self._start_first_step(time_ns)  # no phase event before it: its time stays startup
            self.segments = []
            return None
        self._relabel(_TAIL, "optimizer")  # (the clock's own post hook came first: nothing is left here then)
        self._relabel(_PRE, "other")
        seconds, self.seconds = self.seconds, collections.defaultdict(float)
        start, self.until = self.until, time_ns
        phases = {phase: seconds.get(phase, 0.0) for phase in PHASES}
        step = Step(start, time_ns, phases, self.segments)
        self.segments, self.mode = [], _PRE
        checkpoint_save = seconds.get("checkpoint_save", 0.0)
        checkpoint_load = seconds.get("checkpoint_load", 0.0)
        input_wait = phases["input"]
        productive = max(0.0, (time_ns - start) / 1e9 - input_wait - checkpoint_save - checkpoint_load)
        stalled = 0.0
        if self.stalled_since is not None:
            stalled = min(productive, max(0.0, (time_ns - max(self.stalled_since, start)) / 1e9))
            self.stalled_since = None
        productive -= stalled
        for cause, value in (("productive", productive), ("input_wait", input_wait), ("stalled", stalled),
                             ("checkpoint_save", checkpoint_save), ("checkpoint_load", checkpoint_load)):  # fmt: skip
            if value:
                self.added[cause] += value
        for cause in ("productive", "input_wait", "stalled"):
            self.at_risk[cause] += {"productive": productive, "input_wait": input_wait, "stalled": stalled}[cause]
        self.steps.append(step)
        return step

    def _commit(self) -> None:
        """A completed save: what was at risk is kept."""
        for cause in self.at_risk:
            self.at_risk[cause] = 0.0

    def take_added(self) -> dict[str, float]:
        """The seconds by cause counted since the last call (for the counter)."""
        added, self.added = self.added, collections.defaultdict(float)
        for cause, seconds in added.items():
            self.totals[cause] = self.totals.get(cause, 0.0) + seconds
        return dict(added)

    def lost(self, now_ns: int) -> float:
        """What a failure at ``now_ns`` throws away: the steps at risk and the unfinished step."""
        return sum(self.at_risk.values()) + max(0.0, (now_ns - self.until) / 1e9) if self.started else 0.0


def carve_collective_wait(step: Step, created: list[int]) -> None:
    """Move the wait for the step's last collective out of the phase it was enqueued in (see the module's
    docstring). ``created``: the Flight Recorder's creation times, sorted."""
    import bisect

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


# ---- the process's ledger and its instruments ------------------------------------------------------------------


class _State:
    def __init__(self) -> None:
        self.ledger: Ledger | None = None
        self.lock = threading.Lock()
        self.recorder_enabled: Any = None  # ``collectives.enabled``, given by ``install``
        self.installed = False
        self.recent: dict[str, collections.deque[float]] = {}  # the last steps' seconds, by phase


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


def _process_start_ns() -> int:
    found = process_start_ns()
    return found if found is not None else time.time_ns()


def after_drain() -> None:
    """After a drain counted steps (drainer thread): the counter; the steps' phases now, or, where torch's Flight
    Recorder is read, at its next read (``resolve``)."""
    book = _state.ledger
    if book is None:
        return
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
        selftelemetry.count(selftelemetry.DROPPED, "metrics", "record_error")
        _logger.debug("torchelastic_otel: goodput dropped: %s", exc, exc_info=True)
    if book.steps and not _recorder_read():
        resolve(None)


def _recorder_read() -> bool:
    """Whether ``collectives`` reads torch's Flight Recorder in this process (its steps then wait for a read)."""
    enabled = _state.recorder_enabled
    return os.environ.get("TORCH_FR_BUFFER_SIZE", "") not in ("", "0") and enabled is not None and enabled()


def resolve(created: list[int] | None) -> int:
    """Record the phases of the steps waiting for the Flight Recorder (``created``: its entries' creation times,
    sorted; ``None``: nothing to carve). How many were recorded."""
    book = _state.ledger
    if book is None or not book.steps:
        return 0
    meters = _meters()
    waiting = []
    while book.steps:
        try:
            waiting.append(book.steps.popleft())
        except IndexError:
            break
    if created:
        for step in waiting:
            carve_collective_wait(step, created)
    if meters is not None:
        _record_phases(meters, waiting)
    return len(waiting)


def _record_phases(meters: Any, finished: list[Step]) -> None:
    """Each step's phases into the histogram, and the median of the recent steps' into the gauge: the histogram's
    buckets (1 ms, 2.5 ms, 5 ms, ... apart) bound a median within a factor of 2 to 2.5, the gauge says it."""
    if not finished:
        return
    recent = _state.recent
    for step in finished:
        for phase, seconds in step.phases.items():
            value = max(0.0, seconds)
            meters.phase.record(value, {names.PHASE: phase})
            recent.setdefault(phase, collections.deque(maxlen=MEDIAN_OF)).append(value)
    for phase, values in recent.items():
        meters.phase_median.set(statistics.median(values), {names.PHASE: phase})


def _meters() -> Any:
    if _marks.instruments is None:
        return None
    try:
        return _marks.instruments()
    except Exception:
        selftelemetry.count(selftelemetry.DROPPED, "metrics", "record_error")
        return None


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


def _around(original: Any, enter: int, leave: int) -> Any:
    """``original`` with an event before and after (also when it raises). The append is inlined, and the bound
    checked once (a wrapper's own cost is most of what a phase costs the step: two clock reads, two appends)."""
    import functools

    pending, limit, buffer, now = _marks.pending, _marks.limit, _marks.buffer, time.time_ns
    append = pending.append

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if len(pending) >= limit:
            buffer._overflow += 2
            return original(*args, **kwargs)
        append((now(), enter))
        try:
            return original(*args, **kwargs)
        finally:
            append((now(), leave))

    wrapper.__torchelastic_otel_original__ = original  # type: ignore[attr-defined]
    return wrapper


def _around_next(original: Any) -> Any:
    """``_around`` for a ``DataLoader`` iterator's ``__next__(self)``: no argument packing (a tenth of a microsecond
    of the step)."""
    import functools

    pending, limit, buffer, now = _marks.pending, _marks.limit, _marks.buffer, time.time_ns
    append = pending.append

    @functools.wraps(original)
    def __next__(self: Any) -> Any:
        if len(pending) >= limit:
            buffer._overflow += 2
            return original(self)
        append((now(), INPUT_ENTER))
        try:
            return original(self)
        finally:
            append((now(), INPUT_EXIT))

    __next__.__torchelastic_otel_original__ = original  # type: ignore[attr-defined]
    return __next__


def install(patches: Any, recorder_enabled: Any = None) -> None:
    """Wrap the phase boundaries once their modules are imported (installing imports no torch); undone by
    ``patches.restore()``. ``recorder_enabled``: whether the Flight Recorder is read now (``collectives``)."""
    from torchelastic_otel import _compat
    from torchelastic_otel._torch import imports

    _state.recorder_enabled = recorder_enabled
    _state.installed = True

    def dataloader(module: Any) -> None:
        cls = _compat.dataloader_iter_class(module)
        if cls is not None and "__next__" in cls.__dict__:
            patches.set(cls, "__next__", _around_next(cls.__dict__["__next__"]))

    def autograd(module: Any) -> None:
        original = getattr(module, "backward", None)
        if callable(original):
            patches.set(module, "backward", _around(original, BACKWARD_ENTER, BACKWARD_EXIT))

    hooks = (("torch.utils.data.dataloader", dataloader), ("torch.autograd", autograd))
    for module_name, hook in hooks:
        imports.when_imported(module_name, _guarded(hook, module_name))

    def undo() -> None:
        _state.installed = False
        for module_name, _hook in hooks:
            imports.cancel(module_name, _guarded_of.get(module_name))  # type: ignore[arg-type]

    patches.on_restore(undo)


_guarded_of: dict[str, Any] = {}


def _guarded(hook: Any, module_name: str) -> Any:
    """``hook`` that never raises into an import (a changed torch: counted)."""

    def guarded(module: Any) -> None:
        try:
            hook(module)
        except Exception as exc:
            selftelemetry.count(selftelemetry.FALLBACK, "all", f"anatomy {module_name}")
            _logger.debug("torchelastic_otel: phase hook of %s not installed: %s", module_name, exc)

    _guarded_of[module_name] = guarded
    return guarded
