"""torchelastic-otel: the OpenTelemetry bridge for PyTorch elastic (``torchrun``) jobs.

- :mod:`torchelastic_otel.events` and :mod:`torchelastic_otel.metrics`: drop-ins for torch's modules, with the
  "otel" event destination and :class:`~torchelastic_otel.metrics.OtelMetricHandler`;
- :func:`setup`, :func:`flush`, :func:`shutdown`: the exporter pipeline (configured from ``OTEL_*`` by default).
"""

from torchelastic_otel.pipeline import flush, get_pipeline, setup, shutdown
from torchelastic_otel.version import __version__

__all__ = ["__version__", "setup", "flush", "shutdown", "get_pipeline"]
