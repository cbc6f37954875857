"""Stand-ins for the global providers of the bridge while its pipeline is being built (or rebuilt after a fork).

The first use of a placeholder (``get_tracer``, ``get_meter``, ``get_logger``, ``force_flush``...) goes on to the
real provider, which ``resolve(signal)`` returns (``pipeline``: waiting for a build in progress, or rebuilding a
forked child's). They are put in the API's module globals directly (``_compat.replace_global_provider``), so the
API's set-once guard stays unused: an application (or ``opentelemetry-instrument``) that sets its own provider
meanwhile replaces a placeholder, and the bridge then uses that one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Resolve = Callable[[str], object]


class Placeholder:
    """A global provider of ``signal`` ("traces", "metrics" or "logs") that is resolved on first use."""

    def __init__(self, signal: str, resolve: Resolve) -> None:
        self._signal = signal
        self._resolve = resolve

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_signal", "_resolve", "parent_provider"):
            raise AttributeError(name)
        return getattr(self._resolve(self._signal), name)


class BuildOnUse(Placeholder):
    """While a worker's pipeline is being built (``pipeline.start_building``)."""


class RebuildOnUse(Placeholder):
    """In a forked child, for a global provider the bridge built in the parent (``parent_provider``): the first use
    rebuilds the bridge's pipeline for the child (``pipeline.after_fork_in_child``)."""

    def __init__(self, signal: str, resolve: Resolve, parent_provider: object) -> None:
        super().__init__(signal, resolve)
        self.parent_provider = parent_provider
