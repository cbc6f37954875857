"""Stand-ins for the global providers of the bridge while its pipeline is not (re)built yet.

The first use of a placeholder (``get_tracer``, ``get_meter``, ``get_logger``, ``force_flush``...) builds the
bridge's pipeline and goes on to the real provider. They are put in the API's module globals directly
(``_compat.replace_global_provider``), so the API's set-once guard stays unused: an application (or
``opentelemetry-instrument``) that sets its own provider meanwhile replaces a placeholder, and the bridge then uses
that one.
"""

from __future__ import annotations

from typing import Any


class Placeholder:
    """A global provider of ``signal`` ("traces", "metrics" or "logs") that is built on first use."""

    def __init__(self, signal: str) -> None:
        self._signal = signal

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_signal", "_parent_provider"):
            raise AttributeError(name)
        from torchelastic_otel import pipeline

        return getattr(pipeline.get_pipeline().providers()[self._signal], name)


class BuildOnUse(Placeholder):
    """While a deferred pipeline is not built yet (``_deferred``)."""


class RebuildOnUse(Placeholder):
    """In a forked child, for a global provider the bridge built in the parent (``parent_provider``): the first use
    rebuilds the bridge's pipeline for the child (``_fork``)."""

    def __init__(self, signal: str, parent_provider: Any) -> None:
        super().__init__(signal)
        self._parent_provider = parent_provider
