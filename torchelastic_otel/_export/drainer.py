"""One background thread per process that moves buffered telemetry into the OpenTelemetry SDK.

The adapters' hot paths (``put_metric``, ``record``) only append to bounded buffers, because an SDK call costs
more than torch's whole null path. Every ``TORCHELASTIC_OTEL_DRAIN_INTERVAL`` seconds (default 0.5), at every
flush (exit, SIGTERM, ``torchelastic_otel.flush()``) and at the start of every metric collection, the drainer
calls ``drain()`` on each registered buffer. A flush drains for at most half of its time (the exporters get the
rest); what an exiting process could not drain in time is counted as dropped (``exit_timeout``). After ``fork``
the child starts with empty buffers (what was buffered belongs to the parent, which exports it) and a new thread.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Generic, Protocol, TypeVar

from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel import _settings

__all__ = [
    "Drainable",
    "Buffer",
    "ItemBuffer",
    "register",
    "enable",
    "drain_all",
    "discard_all",
    "paused",
    "interval",
    "add_periodic",
]

T = TypeVar("T")


class Drainable(Protocol):
    #: "metrics" or "logs": before a metric collection, the metric buffers are drained completely, events briefly
    signal: str

    def drain(self, deadline: float | None = None) -> int:
        """Move buffered items into the SDK, stopping once ``time.monotonic()`` passes ``deadline``."""
        ...

    def discard(self, reason: str) -> int:
        """Drop what is still buffered, counted as dropped with ``reason`` (at exit, when time ran out)."""
        ...

    def after_fork_in_child(self) -> None: ...


class Buffer:
    """What the adapters' buffers share: a bounded deque, the count of what did not fit, the lock a drain holds,
    and what becomes of them at exit and after a fork. Subclasses append on their hot path themselves (inline:
    ``if len(self._pending) < self.max_pending: append, else self._overflow += 1``) and implement ``drain``,
    which starts with :meth:`_count_overflow` under ``self._lock``."""

    signal = "all"

    def __init__(self, max_pending: int) -> None:
        self._pending: collections.deque = collections.deque()
        self.max_pending = max_pending
        self._overflow = 0
        self._lock = threading.RLock()

    def _count_overflow(self) -> None:
        """Count what the full buffer turned away since the last drain (``buffer_full``)."""
        overflow, self._overflow = self._overflow, 0
        if overflow:
            selftelemetry.count(selftelemetry.DROPPED, self.signal, "buffer_full", overflow)

    def discard(self, reason: str) -> int:
        """Forget what is buffered, counted as dropped with ``reason`` (the process ends before it could go)."""
        lost = len(self._pending) + self._overflow
        self._pending.clear()
        self._overflow = 0
        if lost:
            selftelemetry.count(selftelemetry.DROPPED, self.signal, reason, lost)
        return lost

    def after_fork_in_child(self) -> None:
        """What was buffered before a fork belongs to the parent, which exports it."""
        self._pending.clear()
        self._overflow = 0
        self._lock = threading.RLock()

    def _hand_over_items(
        self, keep: Callable[[dict[str, object], Any], object], portable: Callable[[Any], Any]
    ) -> bool:
        """Give each buffered item, as ``portable(item) -> (fields, ctx)``, to ``keep(fields, ctx)``, oldest first;
        ``True`` if every one was kept. The lock is waited for briefly only: on SIGTERM the interrupted thread may
        hold it (a drain), and the final words must not spend their bound on it."""
        if not self._lock.acquire(timeout=HAND_OVER_LOCK_SECONDS):
            return False
        try:
            pending = self._pending
            while pending:
                if keep(*portable(pending[0])) is None:
                    return False
                pending.popleft()
            return True
        finally:
            self._lock.release()


class ItemBuffer(Buffer, Generic[T]):
    """A buffer whose items are exported one at a time, in order, by ``export``; an item that fails is given to
    ``failed`` (which counts it) and the drain goes on. A drain empties the buffer, whatever its deadline: these
    buffers are small, and a metric collection needs them drained. Registered with the drainer when made."""

    def __init__(
        self, max_pending: int, signal: str, export: Callable[[T], object], failed: Callable[[Exception], object]
    ) -> None:
        super().__init__(max_pending)
        self.signal = signal
        self._export = export
        self._failed = failed
        register(self)

    def put(self, item: T) -> None:
        if len(self._pending) < self.max_pending:
            self._pending.append(item)
        else:
            self._overflow += 1

    def put_always(self, item: T) -> None:
        """An item that must not be turned away, full or not (a span's end: an open span would leak)."""
        self._pending.append(item)

    def drain(self, deadline: float | None = None) -> int:
        with self._lock:
            self._count_overflow()
            pending, done = self._pending, 0
            while pending:
                try:
                    item = pending.popleft()
                except IndexError:
                    break
                try:
                    self._export(item)
                except Exception as exc:
                    self._failed(exc)
                done += 1
            return done

    def drain_now(self) -> None:
        """Export what is buffered now, in the caller's thread; never raises (a failure goes to ``failed``)."""
        try:
            self.drain()
        except Exception as exc:
            self._failed(exc)


def _interval() -> float:
    if _settings.DRAIN_INTERVAL.raw() is None:
        return _settings.METRICS_DRAIN_INTERVAL.get()
    return _settings.DRAIN_INTERVAL.get()


interval = _interval()


class _Drainer:
    """The drainer's state, in one owner: the buffers it drains (held weakly), its thread, whether a pipeline is
    READY (the thread starts only then, never because of an import), pauses, and the periodic callbacks it runs.
    A forked child gets fresh locks and no thread (:func:`after_fork_in_child`)."""

    def __init__(self) -> None:
        self.buffers: weakref.WeakSet = weakref.WeakSet()
        self.lock = threading.Lock()
        self.drain_lock = threading.RLock()
        self.thread: threading.Thread | None = None
        self.enabled = False
        self.paused: list[bool] = []  # one entry per ``paused()`` context in progress
        self.periodic: list[list[Any]] = []  # ``[callback, every_seconds, next_due]`` of :func:`add_periodic`

    def start(self) -> None:
        with self.lock:
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=_run, name="torchelastic-otel-drainer", daemon=True)
                self.thread.start()


state = _Drainer()


def register(buffer: Drainable) -> None:
    """Drain ``buffer`` from now on (held weakly). Buffers are created when their module is imported: the thread
    starts only once there is a pipeline to drain into (:func:`enable`), never because of an import."""
    state.buffers.add(buffer)
    if state.enabled:
        state.start()


def enable() -> None:
    """A pipeline is ready (``pipeline``): start the thread, which drains every ``interval`` from now on."""
    state.enabled = True
    if len(state.buffers):
        state.start()


def _run() -> None:
    wait = threading.Event().wait
    behind = False
    while True:
        if not behind:
            wait(interval)
        behind = False
        _run_periodic()
        if not state.paused:
            # Rounds of at most one interval, so a flush never waits long for the lock; a round that could not
            # empty the buffers is followed by the next one at once.
            behind = not drain_all(time.monotonic() + interval)


def add_periodic(callback: Callable[[], object], every_seconds: float) -> Callable[[], None]:
    """Call ``callback()`` on this thread about every ``every_seconds`` (at the drain interval's granularity): the
    bridge's own periodic work (a worker's stall watchdog) needs no thread of its own. Exceptions are swallowed and
    counted (``periodic_error``). Returns the function that removes it again."""
    entry = [callback, max(0.0, every_seconds), time.monotonic() + every_seconds]
    state.periodic.append(entry)
    if state.enabled:
        state.start()

    def remove() -> None:
        if entry in state.periodic:
            state.periodic.remove(entry)

    return remove


def _run_periodic() -> None:
    now = time.monotonic()
    for entry in list(state.periodic):
        if now >= entry[2]:
            entry[2] = now + entry[1]
            try:
                entry[0]()
            except Exception:
                selftelemetry.count(selftelemetry.DROPPED, "all", "periodic_error")


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Suspend the periodic drain (flushes and collections still drain): lets tests and benchmarks control when
    buffered values reach the SDK. Waits for a drain in progress to finish."""
    state.paused.append(True)
    with state.drain_lock:
        pass
    try:
        yield
    finally:
        state.paused.pop()


def drain_all(deadline: float | None = None, signal: str | None = None) -> bool:
    """Drain every registered buffer (of ``signal``, if given) now, until ``deadline`` (``time.monotonic()``);
    never raises. ``True`` if it got to the end of every buffer, ``False`` if time ran out first."""
    lock = state.drain_lock
    if deadline is None:
        lock.acquire()
    elif not lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
        return False  # another thread is draining; it moves the same items
    try:
        complete = True
        for buffer in list(state.buffers):
            if signal is not None and getattr(buffer, "signal", None) != signal:
                continue
            try:
                buffer.drain(deadline)
            except Exception:
                selftelemetry.count(selftelemetry.DROPPED, "all", "drain_error")
            if deadline is not None and time.monotonic() >= deadline:
                complete = False
                break
        return complete
    finally:
        lock.release()


def pending() -> bool:
    """Whether any buffer holds something to move into the SDK (or turned something away: to be counted)."""
    return any(len(getattr(b, "_pending", ())) or getattr(b, "_overflow", 0) for b in list(state.buffers))


#: The most buffered records an exit hands over to its agent (:func:`hand_over_all`) instead of waiting for a build.
HAND_OVER_MAX = 256
#: How long a hand-over waits for a lock the interrupted thread may hold: a buffer's (:meth:`Buffer._hand_over_items`),
#: the pipeline's (a signal's final words abandoning the build: ``_process.runtime``).
HAND_OVER_LOCK_SECONDS = 0.1


def can_hand_over() -> bool:
    """Whether everything buffered can be handed over: each buffer that holds something offers ``hand_over``, turned
    nothing away, and all of them hold at most :data:`HAND_OVER_MAX` items (metric values cannot: they wait for
    the build)."""
    total = 0
    for buffer in list(state.buffers):
        held, overflow = len(getattr(buffer, "_pending", ())), getattr(buffer, "_overflow", 0)
        if not held and not overflow:
            continue
        if overflow or not hasattr(buffer, "hand_over"):
            return False
        total += held
    return total <= HAND_OVER_MAX


def outgrows_hand_over() -> bool:
    """Whether an exit now could not hand everything buffered over (:func:`can_hand_over`): a deferred build waits
    for this, not merely for something recorded (a worker that logs a few lines and fails builds nothing)."""
    return not can_hand_over()


def hand_over_all(keep: Callable[[dict[str, object], object], object]) -> bool:
    """At an exit before the pipeline was built: give every buffered record to ``keep(fields, ctx)`` (a worker
    keeps them for its agent: ``_torch.final_words``); ``True`` if every one was kept. Never raises."""
    complete = True
    for buffer in list(state.buffers):
        hand_over = getattr(buffer, "hand_over", None)
        if hand_over is None or not len(getattr(buffer, "_pending", ())):
            continue
        try:
            complete = hand_over(keep) is True and complete
        except Exception:
            complete = False
            selftelemetry.count(selftelemetry.DROPPED, "all", "drain_error")
    return complete


def discard_all(reason: str) -> int:
    """Count what is still buffered as dropped (``reason``) and forget it: the process is about to end."""
    dropped = 0
    for buffer in list(state.buffers):
        try:
            dropped += buffer.discard(reason)
        except Exception:
            selftelemetry.count(selftelemetry.DROPPED, "all", "drain_error")
    return dropped


def _drain_before_collect() -> None:
    """Before a metric collection: every metric value put before it is in the instruments; events (whose
    conversion counts what it sanitized) for a short while at most, so a big backlog never stalls a collection."""
    drain_all(signal="metrics")
    drain_all(time.monotonic() + 0.2, signal="logs")


def after_fork_in_child() -> None:
    """What was buffered before the fork is the parent's; the drainer thread did not survive the fork
    (:func:`restart` starts the child's, once the rest of the bridge is the child's: ``_process.runtime``)."""
    state.lock = threading.Lock()
    state.drain_lock = threading.RLock()
    state.thread = None
    for buffer in list(state.buffers):
        buffer.after_fork_in_child()


def restart() -> None:
    """Start the drainer thread again if it ran before the fork and there is anything to drain."""
    if state.enabled and len(state.buffers):
        state.start()


selftelemetry.add_before_collect(_drain_before_collect)
