"""``BaseInstrumentor`` for torchelastic, registered under the ``opentelemetry_instrumentor`` entry point.

``opentelemetry-instrument torchrun ...`` loads it in the agent and -- through the auto-instrumentation
``sitecustomize`` that ``opentelemetry-instrument`` puts on ``PYTHONPATH`` -- in every worker, so the whole job is
bridged without code changes. It is a thin wrapper over :func:`torchelastic_otel.install`.
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
        # Workers are instrumented by opentelemetry-instrument's own sitecustomize, so no bootstrap of ours.
        install(
            kwargs.get("tracer_provider"),
            kwargs.get("meter_provider"),
            kwargs.get("logger_provider"),
            propagate_to_workers=kwargs.get("propagate_to_workers", False),
        )

    def _uninstrument(self, **kwargs: Any) -> None:
        uninstall()
