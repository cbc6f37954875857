"""A worker's stall watchdog: a rank that stopped making progress says so, with its stacks, long before the job's
collective timeout (10-30 minutes) ends it.

It runs on the bridge's drainer thread (``_export.drainer.add_periodic``, every second), never on the training path.
Progress is a step (``steps``) or, where torch's Flight Recorder is on, a collective completed in any process group
(so a loop that never marks steps but still communicates is not stalled). With neither for
``TORCHELASTIC_OTEL_STALL_SECONDS`` (default: the larger of 120 s and 10x the rank's median step; the clock of a
first step that never comes starts when ``torch.distributed`` is first seen initialised), the rank exports one
``torchelastic.worker.stalled`` log record (WARN) with:

- every thread's Python stack, main thread first, and its innermost frame in the user's code as ``code.*`` (a
  rank waiting in ``all_reduce``: the line that called it) -- as the terminated record of a stopped rank has;
- ``torchelastic.collectives.<group>.*``: per process group the last collective enqueued, started and completed
  and the pending one's name (``collectives``): the ranks at a higher ``last_enqueued`` wait for those below it;
- ``torchelastic.stalled.*``: since when (``since_unix_nano``), for how long, the threshold, the steps so far and
  how many records this stall has made (``count``).

While the stall lasts, again at 2x, 4x, 8x... the threshold; the next progress ends it. Nothing is stopped or
killed: what to do about a stalled rank stays the job's and torch's business. A forked child (a data loader
worker) inherits the registration but not the watch (it takes no steps of its own).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from torchelastic_otel import _names as names
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel import _settings
from torchelastic_otel._process import stacks as _stacks
from torchelastic_otel._torch.worker import anatomy, collectives, steps
from torchelastic_otel._torch.worker_env import worker_metadata

__all__ = ["Watchdog", "threshold_seconds", "STALLED_EVENT"]

_logger = logging.getLogger("torchelastic_otel")

STALLED_EVENT = names.WORKER_STALLED
#: The default threshold's floor and its multiple of the median step.
MIN_THRESHOLD_SECONDS = 120.0
MEDIAN_MULTIPLE = 10.0
#: How long the stalled record's flush may take (the drainer's thread waits for it).
FLUSH_TIMEOUT_MILLIS = 1000


def configured_seconds() -> float | None:
    """``TORCHELASTIC_OTEL_STALL_SECONDS`` (``0``: no watchdog); ``None`` when unset or not a number."""
    return _settings.STALL_SECONDS.get(
        on_invalid=lambda: selftelemetry.count(selftelemetry.SANITIZED, "logs", "invalid_stall_seconds")
    )


def threshold_seconds(median_step: float | None) -> float:
    """The configured threshold, else the larger of 120 s and 10x the median step."""
    configured = configured_seconds()
    if configured is not None:
        return configured
    return max(MIN_THRESHOLD_SECONDS, MEDIAN_MULTIPLE * median_step) if median_step else MIN_THRESHOLD_SECONDS


class Watchdog:
    """The watch of one process (the one that installed it)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.watching = False  # torch.distributed initialised, seen by a tick
        self.progress_ns = 0  # the last progress (ns since the epoch)
        self.steps = 0
        self.completed: dict[str, int] = {}
        self.records = 0  # records made in the current stall

    def tick(self) -> None:
        """One look (the drainer calls it every second)."""
        if os.getpid() != self.pid:
            return
        if not collectives.enabled():
            self.watching = False  # not initialised yet, or destroyed: no collective to wait in
            collectives.tick()  # a destroyed group's kept entries, to the steps once the pipeline is ready
            return
        steps.drain()
        groups = collectives.tick()
        now = time.time_ns()
        count, last_step_ns = steps.progress()
        if not self.watching:
            self._start(now, count, groups)
            return
        if self._progressed(now, count, last_step_ns, groups):
            return
        threshold = threshold_seconds(steps.median_step_seconds())
        if threshold <= 0:
            return
        stalled = (now - self.progress_ns) / 1e9
        if stalled >= threshold * (2**self.records):
            self.records += 1
            with steps.lock():
                anatomy.ledger().stall(self.progress_ns)  # the stall's seconds are counted as such
            self._report(now, stalled, threshold, count)

    def _start(self, now: int, count: int, groups: list[collectives.Group]) -> None:
        self.watching = True
        self.progress_ns = now
        self.steps = count
        self.completed = {g.name: g.last_completed for g in groups}
        self.records = 0

    def _progressed(self, now: int, count: int, last_step_ns: int | None, groups: list[collectives.Group]) -> bool:
        completed = {g.name: g.last_completed for g in groups}
        moved = any(seq > self.completed.get(name, -1) for name, seq in completed.items())
        stepped = count != self.steps
        if not (moved or stepped):
            return False
        self.progress_ns = max(self.progress_ns, last_step_ns or 0) if stepped and not moved else now
        self.steps, self.completed, self.records = count, completed, 0
        return True

    def _report(self, now: int, stalled: float, threshold: float, count: int) -> None:
        try:
            stacks = _stacks.capture()
        except Exception:
            stacks = _stacks.Stacks("", 0, None)
        metadata: dict[str, object] = {
            **worker_metadata(),
            "state": "STALLED",
            "stalled": {
                "seconds": round(stalled, 3),
                "since_unix_nano": self.progress_ns,
                "threshold_seconds": threshold,
                "steps": count,
                "count": self.records,
            },
        }
        if stacks.text:
            metadata.update(stack=stacks.text, stack_threads=stacks.threads)
        metadata.update(collectives.summary_attributes())
        code: dict[str, object] = {}
        frame = stacks.user_frame
        if frame is not None:
            code = {"code.file.path": frame.path, "code.line.number": frame.line, "code.function.name": frame.function}
        _export(metadata, code)


def _export(metadata: dict[str, object], code: dict[str, Any]) -> None:
    """The record (in the agent's attempt trace, like the worker's other records), flushed at once: a stalled job is
    often stopped soon after."""
    from opentelemetry import context as otel_context

    from torchelastic_otel import pipeline
    from torchelastic_otel._torch.worker_env import agent_context
    from torchelastic_otel.events import _otel as event_adapter
    from torchelastic_otel.events.api import Event, EventSource

    ctx = agent_context()  # the agent's attempt, as the worker joined it
    token = otel_context.attach(ctx) if ctx is not None else None
    try:
        event_adapter.export_event(Event(STALLED_EVENT, EventSource.WORKER, metadata=metadata), code)
    finally:
        if token is not None:
            otel_context.detach(token)
    pipeline.flush(timeout_millis=FLUSH_TIMEOUT_MILLIS)
