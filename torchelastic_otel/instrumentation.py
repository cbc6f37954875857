"""``BaseInstrumentor`` for torchelastic, registered under the ``opentelemetry_instrumentor`` entry point.

``opentelemetry-instrument torchrun ...`` loads it in the agent, and the workers install the bridge at start-up,
so the whole job is bridged without code changes. It is a thin wrapper over :func:`torchelastic_otel.install`.

Workers are reached by the bridge's own bootstrap ``sitecustomize``, which must run before OpenTelemetry's: a
worker's output capture forks its two output processes, which must happen before any thread runs, and
OpenTelemetry's configurator starts the exporters' threads. Where the two meet:

- ``opentelemetry-instrumentation`` before 0.63b0 takes its directory off ``PYTHONPATH`` for good while it
  initializes, so workers run the bridge's bootstrap only (the agent hands it to them);
- 0.63b0 and later put their directory back in front once initialized, unless it is on the path already. The
  agent hands its workers the bootstrap first on the path, in front of OpenTelemetry's; and wherever this
  instrumentor runs inside OpenTelemetry's initialization with the bootstrap on ``PYTHONPATH`` (a worker, or an
  agent that put it there), OpenTelemetry's directory goes right behind it (:func:`keep_bootstrap_first`), so what
  that process starts runs the bootstrap first too. A worker's bootstrap captures its output, then runs
  OpenTelemetry's ``sitecustomize``, which loads this instrumentor in the worker, which installs the bridge with the
  providers the distro configured.

In a process that only inherited a bridged worker's environment (a descendant: ``_torch.worker_env``) the
instrumentor installs nothing: the bootstrap's lazy hooks are all such a process gets from the bridge.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Collection
from typing import Any

# The module starts with a file-wide "# type: ignore", so mypy sees none of its names.
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from torchelastic_otel.package import _instruments

__all__ = ["TorchElasticInstrumentor"]

#: The first ``opentelemetry-instrumentation`` release that puts its directory back on ``PYTHONPATH``.
READDS_ITS_DIRECTORY = (0, 63)


class TorchElasticInstrumentor(BaseInstrumentor):
    """Bridges torch's elastic agent, rendezvous, events and metrics to OpenTelemetry."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        from torchelastic_otel._install import AUTO_INSTALL_ENV, install
        from torchelastic_otel._torch import worker_env

        if os.environ.get(AUTO_INSTALL_ENV) == "1" and worker_env.role() != worker_env.WORKER:
            worker_env.join_lazily()  # a worker's descendant: nothing now, its worker's context on first use
        else:
            install(
                kwargs.get("tracer_provider"),
                kwargs.get("meter_provider"),
                kwargs.get("logger_provider"),
                propagate_to_workers=kwargs.get("propagate_to_workers", True),
            )
        keep_bootstrap_first()

    def _uninstrument(self, **kwargs: object) -> None:
        from torchelastic_otel._install import uninstall

        uninstall()


def _contrib_release() -> tuple[int, int] | None:
    try:
        from opentelemetry.instrumentation.version import __version__
    except ImportError:
        return None
    match = re.match(r"(\d+)\.(\d+)", __version__)
    return (int(match.group(1)), int(match.group(2))) if match else None


def keep_bootstrap_first() -> bool:
    """Inside ``opentelemetry-instrument``'s initialization (0.63b0 and later): put its directory right behind the
    bridge's bootstrap on ``PYTHONPATH``, where it would otherwise be put back in front of it. ``True`` if done.

    Only where this process was started with that directory on its path (so it is put back) and the bootstrap is
    on ``PYTHONPATH`` (``install()`` put it there, or it was inherited).
    """
    from torchelastic_otel._install import BOOTSTRAP_DIR

    try:
        from opentelemetry.instrumentation import auto_instrumentation
    except ImportError:
        return False
    release = _contrib_release()
    if release is None or release < READDS_ITS_DIRECTORY:
        return False
    auto_dir = os.path.dirname(os.path.abspath(auto_instrumentation.__file__))
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    started_with_it = any(p and os.path.abspath(p) == auto_dir for p in sys.path)
    if not started_with_it or BOOTSTRAP_DIR not in parts or auto_dir in parts:
        return False
    parts.insert(parts.index(BOOTSTRAP_DIR) + 1, auto_dir)
    os.environ["PYTHONPATH"] = os.pathsep.join(parts)
    return True
