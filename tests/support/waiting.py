"""Waiting, always with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(
    condition: Callable[[], Any],
    timeout: float = 5.0,
    what: str | None = None,
    interval: float = 0.005,
    on_timeout: Callable[[], str] | None = None,
) -> Any:
    """Poll ``condition`` until it returns a truthy value (returned) or ``timeout`` seconds pass: AssertionError
    naming ``what`` (or the condition), followed by what ``on_timeout()`` tells."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            details = f"\n{on_timeout()}" if on_timeout is not None else ""
            raise AssertionError(f"not met within {timeout} s: {what or condition}{details}")
        time.sleep(min(interval, remaining))
