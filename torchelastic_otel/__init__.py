"""torchelastic-otel: the OpenTelemetry bridge for PyTorch elastic (``torchrun``) jobs.

- :mod:`torchelastic_otel.events` and :mod:`torchelastic_otel.metrics`: drop-ins for torch's modules, with the
  "otel" event destination and :class:`~torchelastic_otel.metrics.OtelMetricHandler`;
- :func:`install` / :func:`uninstall`: bridge torch's own agent, rendezvous, events and metrics in this process;
- :func:`setup`, :func:`flush`, :func:`shutdown`: the exporter pipeline (configured from ``OTEL_*`` by default).
"""

from torchelastic_otel._install import install, is_installed, uninstall
from torchelastic_otel.pipeline import flush, get_pipeline, setup, shutdown
from torchelastic_otel.version import __version__

__all__ = ["__version__", "install", "uninstall", "is_installed", "setup", "flush", "shutdown", "get_pipeline"]
