"""Which port this process's Prometheus exporter serves on: one rule for ``OTEL_*`` and ``OTEL_CONFIG_FILE``.

Each worker of a node gets its own port, the base port ``+ 1 + LOCAL_RANK``: the second worker on a node would
otherwise die binding its neighbour's port and lose its whole pipeline. The agent (no ``LOCAL_RANK``) keeps the
base port; ``TORCHELASTIC_OTEL_PROMETHEUS_PORT_OFFSET=0`` keeps it for every process (one worker per container).
"""

from __future__ import annotations

import os

from torchelastic_otel import _settings

__all__ = ["DEFAULT_PORT", "offset", "port"]

#: The exporter's own default port (``OTEL_EXPORTER_PROMETHEUS_PORT`` unset, or no port in the file).
DEFAULT_PORT = 9464


def offset() -> int:
    """How far this process's port is from the base port: ``1 + LOCAL_RANK`` in a worker (1 where ``LOCAL_RANK`` is
    not a number), 0 in the agent or where the offset is turned off."""
    if "LOCAL_RANK" not in os.environ or not _settings.PROMETHEUS_PORT_OFFSET.get():
        return 0
    try:
        return 1 + int(os.environ["LOCAL_RANK"])
    except ValueError:
        return 1


def port(base: int | None) -> int:
    """This process's port for the base port ``base`` (``None`` or 0: :data:`DEFAULT_PORT`)."""
    return (base or DEFAULT_PORT) + offset()
