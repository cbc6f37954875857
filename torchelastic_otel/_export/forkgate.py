"""Keeps the bridge's exports out of the moment a process forks.

gRPC can only prepare a fork (its ``fork()`` handlers) when no thread is inside a gRPC call; otherwise the child
inherits gRPC in a broken state ("Other threads are currently calling into gRPC, skipping fork() handlers"), and
the child's own OTLP/gRPC exports hang. Before a fork, new exports wait and the fork waits (at most
``FORK_WAIT_MILLIS``, and not at all for exports that are stuck retrying) for those in flight.
"""

from __future__ import annotations

import threading
import time

from torchelastic_otel import _settings
from torchelastic_otel._export import health as _health

#: How long a fork may wait for the bridge's exports in flight (a reachable collector answers in milliseconds).
FORK_WAIT_MILLIS = _settings.FORK_WAIT.get()


class ForkGate:
    def __init__(self) -> None:
        self.after_fork_in_child()

    def after_fork_in_child(self) -> None:
        """A forked child has no exports in flight and no fork in progress (the lock may have been held)."""
        self._cond = threading.Condition(threading.Lock())
        self._in_flight = 0
        self._forking = False

    def enter(self) -> None:
        with self._cond:
            deadline = time.monotonic() + FORK_WAIT_MILLIS / 1000
            while self._forking and (remaining := deadline - time.monotonic()) > 0:
                self._cond.wait(remaining)
            self._in_flight += 1

    def leave(self) -> None:
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()

    def before_fork(self) -> None:
        with self._cond:
            self._forking = True
            deadline = time.monotonic() + FORK_WAIT_MILLIS / 1000
            while self._in_flight and not _health.health.stuck() and (remaining := deadline - time.monotonic()) > 0:
                self._cond.wait(min(remaining, 0.02))

    def after_fork_in_parent(self) -> None:
        with self._cond:
            self._forking = False
            self._cond.notify_all()


gate = ForkGate()
