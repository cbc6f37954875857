"""A step on the GPU's own clock: its phases, the GPU's idle time in it, and where it reached a collective.

On a CUDA job the host only enqueues work and runs ahead; the GPU's time shows on the host wherever it next waits
(``loss.item()``, a full launch queue, a collective). The timeline's CUDA events (``timeline``) say where the GPU
was at each boundary the host marked: an event completes when the GPU has done everything enqueued before it. So
for a step with an event at every boundary (``bounds``: ``(host time, event)``, its start being the previous step's
end):

- a phase's GPU seconds are the ``elapsed_time`` between the events at its ends (the forward: from the input's end,
  or from the step's start, to the backward's start; the backward; the optimizer: to the step's end; ``other``: the
  rest, outside the phases and checkpoints);
- ``input`` is the GPU's time between the input wait's two events: no work is enqueued while the host waits in the
  loader, so that time is exactly the GPU's wait for the input once it had finished what came before (a loader that
  fetches while the GPU still computes costs nothing here);
- the GPU's *idle* time is ``input`` plus, in each ``other`` stretch (logging, a sync, the loop's Python), the time
  from the GPU's completion of what preceded it to the host's next mark, within that stretch's GPU time. The host
  time of a GPU completion is the step's own: the GPU has caught up with the host at the boundary where
  ``host time - GPU time`` is largest (an event that completes as soon as it is recorded), and a job that never lets
  the GPU catch up has no idle time to find (its ``other`` stretches take no GPU time);
- the rank's *arrival* at a collective enqueued at host time ``t``: with the collective's own GPU duration (NCCL with
  ``TORCH_NCCL_ENABLE_TIMING=1``), the end of the stretch it was enqueued in minus that duration; without, the GPU's
  position at ``t`` (no earlier than the stretch's start on the GPU, no later than its end).

Only ``query()`` and ``elapsed_time()`` are asked of an event (a ``torch.Event``; a test's scripted one): never a
``synchronize()``. Everything here runs on the drainer's thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DeviceStep", "figures", "completed", "NEGATIVE_TOLERANCE_S"]

#: ``elapsed_time`` resolves about half a microsecond: a boundary this much before the one it follows is rounding.
NEGATIVE_TOLERANCE_S = 2e-6
#: The phases a step's stretches are labelled with (``anatomy``), those whose GPU time is the model's own.
_MODEL = ("forward", "backward", "optimizer")


@dataclass
class DeviceStep:
    """One step's figures on the GPU's clock (seconds)."""

    phases: dict[str, float]
    idle: float
    span: float  # the GPU's time from the step's start to its end
    times: list[float]  # each bound's GPU time, from the step's start
    hosts: list[int]  # each bound's host time (ns)
    offset_ns: int  # the host time of the step's start on the GPU (where the GPU caught up, see the docstring)
    segments: list[tuple[str, int, int]] = field(default_factory=list)

    def arrival(self, created_ns: int, duration_s: float | None = None) -> float | None:
        """Seconds from the step's start, on the GPU, to its arrival at a collective enqueued at ``created_ns``
        (host); ``None`` when that is outside the step."""
        index = _stretch(self.hosts, created_ns)
        if index is None:
            return None
        start, end = self.times[index], self.times[index + 1]
        if duration_s is not None and duration_s >= 0:
            return max(0.0, end - duration_s)
        at = (created_ns - self.offset_ns) / 1e9
        return min(end, max(start, at))

    def carve(self, created_ns: int, duration_s: float) -> None:
        """Move a collective's GPU duration (its wait for the other ranks, and its transfer) out of the phase in
        which it was enqueued, into ``collective_wait``."""
        index = _stretch(self.hosts, created_ns)
        if index is None:
            return
        label = _label_at(self.segments, self.hosts[index], self.hosts[index + 1])
        if label not in _MODEL and label != "other":
            return
        wait = min(max(0.0, duration_s), self.phases.get(label, 0.0))
        self.phases[label] -= wait
        self.phases["collective_wait"] = self.phases.get("collective_wait", 0.0) + wait


def _stretch(hosts: Sequence[int], at: int) -> int | None:
    """The index ``i`` of the stretch ``[hosts[i], hosts[i+1])`` holding ``at``."""
    if not hosts or at < hosts[0] or at >= hosts[-1]:
        return None
    low, high = 0, len(hosts) - 1
    while high - low > 1:
        middle = (low + high) // 2
        if hosts[middle] <= at:
            low = middle
        else:
            high = middle
    return low


def _label_at(segments: Sequence[tuple[str, int, int]], start: int, end: int) -> str | None:
    for label, a, b in segments:
        if a <= start and end <= b:
            return label
    return None


def completed(events: Sequence[Any]) -> bool:
    """Whether the GPU has reached every one of ``events`` (non-blocking ``query()``)."""
    for event in events:
        if not event.query():
            return False
    return True


def figures(
    bounds: Sequence[tuple[int, Any]], segments: Sequence[tuple[str, int, int]], phases: Sequence[str]
) -> DeviceStep | None:
    """The step's figures (see the module's docstring), its events all completed; ``None`` when they are not
    usable: a boundary the GPU reached before the one preceding it (the events are on different streams), or an
    ``elapsed_time`` that is not a finite number."""
    first = bounds[0][1]
    times: list[float] = []
    hosts: list[int] = []
    previous = 0.0
    for host_ns, event in bounds:
        seconds = 0.0 if event is first else first.elapsed_time(event) / 1e3
        if not isinstance(seconds, float) or seconds != seconds or seconds in (float("inf"), float("-inf")):
            return None
        if seconds < previous:
            if seconds < previous - NEGATIVE_TOLERANCE_S:
                return None
            seconds = previous
        times.append(seconds)
        hosts.append(host_ns)
        previous = seconds
    at = {host: i for i, host in enumerate(hosts)}  # a host time's last bound (two marks may share one)
    offset = max(host - int(seconds * 1e9) for host, seconds in zip(hosts, times, strict=True))
    found = dict.fromkeys(phases, 0.0)
    idle = 0.0
    for label, a, b in segments:
        i, j = at.get(a), at.get(b)
        if i is None or j is None:
            continue
        gpu = max(0.0, times[j] - times[i])
        found[label] = found.get(label, 0.0) + gpu
        if label == "input":
            idle += gpu
        elif label == "other":
            caught_up = (hosts[j] - (offset + int(times[i] * 1e9))) / 1e9
            idle += min(gpu, max(0.0, caught_up))
    return DeviceStep(found, idle, times[-1], times, hosts, offset, list(segments))
