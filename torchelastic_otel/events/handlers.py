"""Destinations of :func:`torchelastic_otel.events.record`, mirroring ``torch.distributed.elastic.events.handlers``.

torch's three destinations keep their meaning ("console" prints, "null" and "dynamic_rendezvous" discard); the
new "otel" destination turns each event into an OpenTelemetry log record (and a span event on the current span).
Its handler is created lazily so importing this module never builds a telemetry pipeline.
"""

from __future__ import annotations

import logging

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
