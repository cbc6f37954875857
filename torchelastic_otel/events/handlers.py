"""Destinations of :func:`torchelastic_otel.events.record`, mirroring ``torch.distributed.elastic.events.handlers``.

torch's three destinations keep their meaning ("console" prints, "null" and "dynamic_rendezvous" discard); the
new "otel" destination turns each event into an OpenTelemetry log record (and a span event on the current span).
Its handler is created lazily so importing this module never builds a telemetry pipeline.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

__all__ = ["get_logging_handler"]


class _LazyHandlers(dict):
    """torch's ``_log_handlers`` dict, creating the "otel" handler on first use."""

    def __missing__(self, key: str) -> logging.Handler:
        if key != "otel":
            raise KeyError(key)
        from torchelastic_otel.events._otel import OtelLoggingHandler

        handler = OtelLoggingHandler()
        self[key] = handler
        return handler

    def __contains__(self, key: object) -> bool:
        return key == "otel" or dict.__contains__(self, key)


_log_handlers: dict[str, logging.Handler] = _LazyHandlers(
    {
        "console": logging.StreamHandler(),
        "dynamic_rendezvous": logging.NullHandler(),
        "null": logging.NullHandler(),
    }
)


def get_logging_handler(destination: str = "null") -> logging.Handler:
    """Return the handler of ``destination``; an unknown destination raises ``KeyError`` as torch's does."""
    return _log_handlers[destination]


@contextlib.contextmanager
def destinations_restored() -> Iterator[None]:
    """Run a block (a test) and put the destinations' handlers back as they were (torch's name for them,
    ``_log_handlers``, is kept for code written against torch's module)."""
    saved = dict(_log_handlers)
    try:
        yield
    finally:
        _log_handlers.clear()
        _log_handlers.update(saved)
