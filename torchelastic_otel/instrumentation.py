"""``BaseInstrumentor`` for torchelastic, registered under the ``opentelemetry_instrumentor`` entry point.

``opentelemetry-instrument torchrun ...`` loads it in the agent, and the workers install the bridge at start-up,
so the whole job is bridged without code changes. It is a thin wrapper over :func:`torchelastic_otel.install`.

Workers are reached by the bridge's own bootstrap ``sitecustomize`` too, not only by the auto-instrumentation one:
``opentelemetry-instrumentation`` before 0.63b0 takes its directory off ``PYTHONPATH`` for good while it
initializes (later releases put it back in front), so on those releases no worker would be bridged. Where both are
on the path, the auto-instrumentation one comes first and the bridge's is not imported: a worker is bridged once,
by its instrumentor, with the providers its distro configured.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

from torchelastic_otel._install import install, uninstall
from torchelastic_otel.package import _instruments

__all__ = ["TorchElasticInstrumentor"]


class TorchElasticInstrumentor(BaseInstrumentor):
    """Bridges torch's elastic agent, rendezvous, events and metrics to OpenTelemetry."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        install(
            kwargs.get("tracer_provider"),
            kwargs.get("meter_provider"),
            kwargs.get("logger_provider"),
            propagate_to_workers=kwargs.get("propagate_to_workers", True),
        )

    def _uninstrument(self, **kwargs: Any) -> None:
        uninstall()
