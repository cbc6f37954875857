"""The bridge's own bookkeeping: what it sanitized, dropped or failed to export.

Telemetry must never fail silently, and it must never raise into the job either. Every place that drops or alters
data calls :func:`count`; the metrics adapter exports the totals as ``torchelastic_otel.dropped`` and
``torchelastic_otel.sanitized`` (attributes ``signal`` and ``reason``), and the first occurrence of each reason is
logged once as a warning.
"""

from __future__ import annotations

import logging
import threading

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (not imported on a worker's start-up path)
if TYPE_CHECKING:
    from collections.abc import Callable

    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation

__all__ = ["count", "count_exception", "snapshot", "DROPPED", "SANITIZED", "FALLBACK"]

_logger = logging.getLogger("torchelastic_otel")

DROPPED = "dropped"
SANITIZED = "sanitized"
#: A private internal of CPython, OpenTelemetry or torch that was missing, and the fallback used (``_compat``).
FALLBACK = "fallbacks"


class _Counters:
    """The process's counters and where they are exported: one owner (a forked child starts afresh)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[tuple[str, str, str], int] = {}
        self.instrumented: set[int] = set()  # ids of the meter providers the counters are registered on
        self.before_collect: list[Callable[[], object]] = []


_counters = _Counters()


def count(kind: str, signal: str, reason: str, n: int = 1) -> None:
    """Add ``n`` to the ``kind`` ("dropped" or "sanitized") counter of ``signal`` and ``reason``; never raises."""
    key = (kind, signal, reason)
    with _counters.lock:
        first = key not in _counters.counts
        _counters.counts[key] = _counters.counts.get(key, 0) + n
    if first and kind == DROPPED:
        _logger.warning("torchelastic_otel dropped %s data (%s); counted in torchelastic_otel.dropped", signal, reason)


def count_exception(signal: str, reason: str, exc: BaseException) -> None:
    """Count ``reason`` as dropped for ``exc``, an exception the bridge caught instead of raising it into the job,
    and log it at debug level with its traceback; never raises."""
    try:
        count(DROPPED, signal, reason)
        _logger.debug("torchelastic_otel: %s dropped (%s): %s", signal, reason, exc, exc_info=exc)
    except Exception:
        pass


def snapshot(kind: str | None = None) -> dict[tuple[str, str, str], int]:
    """A copy of the counters, optionally only those of one kind."""
    with _counters.lock:
        return {k: v for k, v in _counters.counts.items() if kind is None or k[0] == kind}


def total(kind: str, signal: str | None = None, reason: str | None = None) -> int:
    """Sum of the counters matching ``kind`` and, when given, ``signal`` and ``reason``."""
    return sum(
        v
        for (k, s, r), v in snapshot(kind).items()
        if (signal is None or s == signal) and (reason is None or r == reason)
    )


def after_fork_in_child() -> None:
    """A forked child starts with its own counts: the parent's are the parent's to export."""
    _counters.lock = threading.Lock()
    _counters.counts.clear()


# ---- export of the counters as OpenTelemetry instruments -----------------------------------------------------


def add_before_collect(hook: Callable[[], object]) -> None:
    """Run ``hook()`` at the start of every metric collection (the metric adapter drains its buffer there, so a
    collection -- a Prometheus scrape, a periodic export, a flush -- sees every value put before it)."""
    if hook not in _counters.before_collect:
        _counters.before_collect.append(hook)


def _observe(kind: str) -> Callable[[CallbackOptions], list[Observation]]:
    from opentelemetry.metrics import Observation

    def callback(options: CallbackOptions) -> list[Observation]:
        if kind == DROPPED:
            for hook in list(_counters.before_collect):
                try:
                    hook()
                except Exception:
                    _logger.debug("before-collect hook failed", exc_info=True)
        return [Observation(v, {"signal": s, "reason": r}) for (_k, s, r), v in snapshot(kind).items()]

    return callback


def instrument(meter_provider: MeterProvider) -> None:
    """Register ``torchelastic_otel.dropped`` and ``torchelastic_otel.sanitized`` on ``meter_provider`` (once)."""
    key = id(meter_provider)
    if key in _counters.instrumented:
        return
    _counters.instrumented.add(key)
    try:
        from torchelastic_otel.version import __version__

        meter = meter_provider.get_meter("torchelastic_otel", __version__)
        meter.create_observable_counter(
            "torchelastic_otel.dropped",
            callbacks=[_observe(DROPPED)],
            unit="{item}",
            description="Telemetry the bridge could not deliver, by signal and reason",
        )
        meter.create_observable_counter(
            "torchelastic_otel.sanitized",
            callbacks=[_observe(SANITIZED)],
            unit="{item}",
            description="Values the bridge had to alter to make them valid, by signal and reason",
        )
        meter.create_observable_counter(
            "torchelastic_otel.fallbacks",
            callbacks=[_observe(FALLBACK)],
            unit="{fallback}",
            description="Internals of Python, OpenTelemetry or torch the bridge found changed, and used a fallback for",
        )
    except Exception:
        _logger.debug("could not register self-telemetry instruments", exc_info=True)
