"""``install()`` / ``uninstall()``: bridge torch's own elastic modules in the running process.

Symmetric and idempotent: ``install`` records every change it makes (see ``_torch.patches``) and ``uninstall``
undoes exactly those. In the agent it also arranges for the workers it starts to install the bridge themselves
(``propagate_to_workers``): a bootstrap directory is put on the workers' ``PYTHONPATH`` whose ``sitecustomize``
installs the bridge at interpreter start-up (and then runs any other ``sitecustomize`` on the path). Only the
workers' environment carries it: this process's ``os.environ`` is left as it was.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

from torchelastic_otel import _deferred, pipeline

__all__ = ["install", "uninstall", "is_installed", "BOOTSTRAP_DIR", "AUTO_INSTALL_ENV"]

_logger = logging.getLogger("torchelastic_otel")

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bootstrap")
#: Set in the environment of processes that should install the bridge at start-up.
AUTO_INSTALL_ENV = "TORCHELASTIC_OTEL_AUTO_INSTALL"

_AGENT_MODULES = (
    "torch.distributed.elastic.agent.server.api",
    "torch.distributed.elastic.agent.server.local_elastic_agent",
)

_lock = threading.RLock()
_patches: Any = None


def is_installed() -> bool:
    return _patches is not None


#: What the workers an agent of this process starts get in their environment: var -> (value, prepend to a path list).
#: Never put in this process's ``os.environ``: the agent's wrapper of ``_start_workers`` applies it only while the
#: workers start (``worker_environ``), so a process that launches in-process keeps its environment as it was.
_for_workers: dict[str, tuple[str, bool]] = {}


def _prepend_env_path(patches: Any, var: str, entry: str) -> None:
    """The workers get ``entry`` first on the path list ``var`` (their own value of it, from this process's)."""
    _for_workers[var] = (entry, True)
    patches.on_restore(lambda: _for_workers.pop(var, None))


def _set_env(patches: Any, var: str, value: str) -> None:
    """The workers get ``var=value``."""
    _for_workers[var] = (value, False)
    patches.on_restore(lambda: _for_workers.pop(var, None))


def worker_environ() -> dict[str, str]:
    """The variables to give the workers starting now, against this process's environment as it is now (a path
    entry goes first, also where it is further down: e.g. behind OpenTelemetry's auto-instrumentation directory,
    which ``opentelemetry-instrument`` puts back in front of ``PYTHONPATH``)."""
    out: dict[str, str] = {}
    for var, (value, prepend) in list(_for_workers.items()):
        if prepend:
            current = os.environ.get(var)
            parts = [part for part in (current.split(os.pathsep) if current else []) if part != value]
            out[var] = os.pathsep.join([value, *parts])
        else:
            out[var] = value
    return out


def _agent_loaded() -> bool:
    """Whether torch's elastic agent modules are imported in this process (the lifecycle spans wrap them)."""
    return all(name in sys.modules for name in _AGENT_MODULES)


def install(
    tracer_provider: Any = None,
    meter_provider: Any = None,
    logger_provider: Any = None,
    *,
    propagate_to_workers: bool = True,
) -> bool:
    """Bridge torch's platform metrics, events, rendezvous events and agent lifecycle to OpenTelemetry.

    Providers given here are used (see :func:`torchelastic_otel.setup`); otherwise the global ones, or ones built
    from ``OTEL_*``. Returns ``True`` if the bridge is installed now, ``False`` if torch is missing or the
    installation failed (logged; the job is never affected). Calling it again does nothing.
    """
    global _patches
    with _lock:
        if _patches is not None:
            return True
        if pipeline.sdk_disabled():
            return False
        try:
            import torch.distributed.elastic.events  # noqa: F401
            import torch.distributed.elastic.metrics  # noqa: F401
        except Exception as exc:
            _logger.info("torchelastic_otel: torch.distributed.elastic not available (%s); nothing to install", exc)
            return False
        from torchelastic_otel._torch import events_bridge, metrics_bridge, worker
        from torchelastic_otel._torch.patches import Patches
        from torchelastic_otel.events._otel import OtelLoggingHandler
        from torchelastic_otel.metrics._otel import OtelMetricHandler

        in_worker = worker.is_torchrun_worker()
        if tracer_provider is not None or meter_provider is not None or logger_provider is not None:
            pipeline.setup(tracer_provider, meter_provider, logger_provider)
        elif in_worker:
            _deferred.defer()  # the exporters are set up off the worker's start-up path
        patches = Patches()
        try:
            metric_handler = OtelMetricHandler()
            metrics_bridge.install(patches, metric_handler)
            # A worker does not import torch's agent and rendezvous modules (~150 ms); bridge them only if it did.
            events_bridge.install(patches, OtelLoggingHandler(), import_rendezvous=not in_worker)
            if not in_worker or _agent_loaded():
                from torchelastic_otel._torch import lifecycle

                lifecycle.install(patches, metric_handler.emit)
            worker.install(patches)
            if propagate_to_workers:
                _prepend_env_path(patches, "PYTHONPATH", BOOTSTRAP_DIR)
                _set_env(patches, AUTO_INSTALL_ENV, "1")
        except Exception as exc:
            patches.restore()
            _logger.warning("torchelastic_otel: install failed, torch left as it was: %s", exc, exc_info=True)
            return False
        _patches = patches
        return True


def uninstall() -> None:
    """Undo everything :func:`install` changed (flushing first). Calling it when not installed does nothing."""
    global _patches
    with _lock:
        patches, _patches = _patches, None
    if patches is None:
        return
    pipeline.flush()
    patches.restore()
