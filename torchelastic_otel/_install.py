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
from typing import TYPE_CHECKING, Any

from torchelastic_otel import _settings, pipeline
from torchelastic_otel._export import distro as _distro
from torchelastic_otel._export import drainer as _drainer
from torchelastic_otel._export import providers as _providers
from torchelastic_otel._process import runtime  # noqa: F401 - runtime: the process hooks follow the pipeline

if TYPE_CHECKING:
    from torchelastic_otel._torch.patches import Patches
from torchelastic_otel._torch import torch_bridge
from torchelastic_otel._torch.worker_env import is_torchrun_worker, prepend_env_path, set_env

__all__ = ["install", "uninstall", "is_installed", "BOOTSTRAP_DIR", "AUTO_INSTALL_ENV"]

_logger = logging.getLogger("torchelastic_otel")

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bootstrap")
#: Set in the environment of processes that should install the bridge at start-up.
AUTO_INSTALL_ENV = _settings.AUTO_INSTALL.name

_AGENT_MODULES = (
    "torch.distributed.elastic.agent.server.api",
    "torch.distributed.elastic.agent.server.local_elastic_agent",
)

_lock = threading.RLock()
_patches: Patches | None = None


def is_installed() -> bool:
    return _patches is not None


def _start_worker_build() -> None:
    """A worker's pipeline is built in a thread of its own. Where its agent sends what the worker leaves behind
    (``TORCHELASTIC_OTEL_FAILURE_DIR``), the build waits until an exit could no longer hand what is buffered to
    the agent (``_drainer.outgrows_hand_over``), a provider is asked for, or ``TORCHELASTIC_OTEL_SETUP_DELAY_MILLIS``
    are over (``pipeline.start_building``); elsewhere it starts at once, so that the worker's own final words find
    a pipeline."""
    if _settings.FAILURE_DIR.get():
        pipeline.start_building(_settings.SETUP_DELAY.get() / 1000, _drainer.outgrows_hand_over)
    else:
        pipeline.start_building()


def _config_file_refused() -> bool:
    """``OTEL_CONFIG_FILE`` is set and cannot be used (``_export.config_file``: one line on stderr). Checked where
    the job starts, not in a worker: its agent checked it, and a worker must not read and validate the file in its
    start-up (its pipeline reads it in the background)."""
    if not _providers.from_file() or is_torchrun_worker():
        return False
    from torchelastic_otel._export import config_file

    return config_file.refused()


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
        if _config_file_refused():
            return False  # reported on stderr: the job runs as plain torchrun
        explicit = tracer_provider is not None or meter_provider is not None or logger_provider is not None
        if not explicit and is_torchrun_worker():
            _start_worker_build()
        in_worker = is_torchrun_worker()
        if not torch_bridge.torch_available(import_now=not in_worker):
            return False
        from torchelastic_otel._torch.patches import Patches
        from torchelastic_otel._torch.worker import hooks as worker

        torch_bridge.LIGHT.take_over(installed=True)
        if explicit:
            pipeline.setup(tracer_provider, meter_provider, logger_provider)
        patches = Patches()
        try:
            # A worker does not import torch's agent and rendezvous modules (their import would lengthen its
            # start-up, docs/performance.md); bridge them only if it did. Nor torch's events and metrics modules
            # (torch's whole import, where the script does not import torch): they are bridged when it imports them.
            bridge = torch_bridge.TorchBridge(patches, import_rendezvous=not in_worker)
            if in_worker:
                bridge.when_imported()
            else:
                bridge.now()
            if not in_worker or _agent_loaded():
                from torchelastic_otel._torch.agent import lifecycle

                lifecycle.install(patches, bridge.metric_handler().emit)
            worker.install(patches)
            if propagate_to_workers:
                prepend_env_path(patches, "PYTHONPATH", BOOTSTRAP_DIR)
                set_env(patches, AUTO_INSTALL_ENV, "1")
                found = None if in_worker else _distro.for_workers()
                if found is not None:
                    set_env(patches, _distro.FOUND_ENV, found)
        except Exception as exc:
            patches.restore()
            torch_bridge.LIGHT.take_over(installed=False)
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
    torch_bridge.LIGHT.take_over(installed=False)
