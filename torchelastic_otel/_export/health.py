"""What the bridge's exporters are doing: the exports in flight and whether the backend answers.

A flush waits for the exporters, and the OTLP exporters retry an unreachable collector for up to
``OTEL_EXPORTER_OTLP_TIMEOUT`` (10 s): this is how a flush knows not to wait that long.
"""

from __future__ import annotations

import logging
import threading
import time

from torchelastic_otel import _compat, _settings

#: An export in flight for longer than this means the backend is unreachable (or too slow to wait for at exit).
EXPORT_STALL_MILLIS = _settings.EXPORT_STALL.get()


class ExportHealth:
    """When each export in flight started and how many items it carries, whether one of them is retrying, and
    whether the last one failed.

    An export counts as stuck once it retries (the exporters log each retry: ``_RetryWatch``; a refused connection
    or a failed TLS handshake shows within milliseconds) or once it has been in flight for ``EXPORT_STALL_MILLIS``
    (a collector that does not answer at all).
    """

    def __init__(self) -> None:
        self.after_fork_in_child()

    def after_fork_in_child(self) -> None:
        """A forked child starts with no exports in flight (the lock may have been held at the fork)."""
        self._lock = threading.Lock()
        self._started: dict[int, tuple[float, str, int]] = {}
        self._next = 0
        self._retried_at = -1.0
        self.failing = False
        self.failures = 0

    def begin(self, signal: str = "all", items: int = 0) -> int:
        with self._lock:
            self._next += 1
            self._started[self._next] = (time.monotonic(), signal, items)
            return self._next

    def end(self, token: int, ok: bool) -> None:
        with self._lock:
            self._started.pop(token, None)
            self.failing = not ok
            self.failures += not ok

    def retrying(self) -> None:
        self._retried_at = time.monotonic()

    def last_retry(self) -> float:
        """When an export last retried (``time.monotonic()``; -1.0: never in this process)."""
        return self._retried_at

    def in_flight(self) -> dict[str, int]:
        """Items of the exports in flight, by signal (what a process that ends now loses with them)."""
        out: dict[str, int] = {}
        with self._lock:
            for _started, signal, items in self._started.values():
                out[signal] = out.get(signal, 0) + items
        return out

    def stuck(self) -> bool:
        """An export in flight has retried, or has been in flight for longer than ``EXPORT_STALL_MILLIS``."""
        with self._lock:
            oldest = min((started for started, _s, _n in self._started.values()), default=None)
        if oldest is None:
            return False
        return self._retried_at >= oldest or (time.monotonic() - oldest) * 1000 > EXPORT_STALL_MILLIS

    def down(self) -> bool:
        """The last export failed, or one is stuck: the backend is unreachable for now."""
        return self.failing or self.stuck()


health = ExportHealth()


class _RetryWatch(logging.Filter):
    """Notes the OTLP exporters' "Transient error ..., retrying in ..." warnings (it filters nothing out): the
    first attempt of an export failed, and the exporter now waits before the next one."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _compat.is_export_retry_log(record):
            health.retrying()
        return True


_retry_watch = _RetryWatch()


def watch_retries(exporter: object) -> None:
    """Watch the loggers of the exporter's modules (the OTLP exporters log their retries there)."""
    for klass in type(exporter).__mro__:
        module = getattr(klass, "__module__", "") or ""
        if module.startswith("opentelemetry.exporter."):
            logger = logging.getLogger(module)
            if _retry_watch not in logger.filters:
                logger.addFilter(_retry_watch)
