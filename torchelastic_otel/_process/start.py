"""When this process started, on the wall clock: where a worker's span and its goodput ledger begin."""

from __future__ import annotations

import os
import time

__all__ = ["process_start_ns"]


def process_start_ns() -> int | None:
    """When this process started (Linux), so the worker span covers interpreter start-up; ``None`` elsewhere.

    ``/proc/<pid>/stat`` gives the start in whole clock ticks since boot (10 ms each, usually), rounded down; the
    boot clock (``CLOCK_BOOTTIME``) says how long ago that was. The end of that tick is taken: the start rounded
    down could fall before the agent's attempt span began, when the agent starts its workers within a tick of
    beginning it, and the worker span would start before its parent. (``btime`` of ``/proc/stat`` is whole
    seconds: up to a second off.)
    """
    try:
        with open(f"/proc/{os.getpid()}/stat") as fh:
            start_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        boot_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        age_ns = boot_ns - (start_ticks + 1) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
        return time.time_ns() - max(0, age_ns) if age_ns > -1_000_000_000 else None
    except Exception:
        return None
