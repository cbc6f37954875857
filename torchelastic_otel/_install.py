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

from torchelastic_otel import _runtime, pipeline  # noqa: F401 - _runtime: the process hooks follow the pipeline
from torchelastic_otel._torch.worker_env import is_torchrun_worker

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


# ---- torch's events and metrics modules: imported now (agent, launcher) or bridged once imported (worker) --------

_TORCH_METRICS = "torch.distributed.elastic.metrics"
_TORCH_EVENTS = "torch.distributed.elastic.events"


def _torch_available(import_now: bool) -> bool:
    """Whether torch's elastic modules can be bridged here. An agent or launcher imports them now (it imports torch
    anyway); a worker only looks for torch (no import: its script may never import torch)."""
    if not import_now:
        import importlib.util

        try:
            found = importlib.util.find_spec("torch") is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            _logger.info("torchelastic_otel: torch not available; nothing to install")
        return found
    try:
        import torch.distributed.elastic.events  # noqa: F401
        import torch.distributed.elastic.metrics  # noqa: F401
    except Exception as exc:
        _logger.info("torchelastic_otel: torch.distributed.elastic not available (%s); nothing to install", exc)
        return False
    return True


class _TorchBridge:
    """torch's metric streams and event destinations bridged, every change recorded in ``patches``.

    :meth:`now` bridges both modules at once; :meth:`when_imported` once the process imports each (at once if it
    has: ``_torch.imports``), so a worker whose script never imports torch never waits for it. A module bridged
    after ``install()`` returned is undone by ``uninstall()`` as well; one that fails is left as torch made it
    (logged and counted), never raised into the script's import.
    """

    def __init__(self, patches: Any, *, import_rendezvous: bool) -> None:
        self.patches = patches
        self.import_rendezvous = import_rendezvous
        self.active = True
        self._metric_handler: Any = None

    def metric_handler(self) -> Any:
        if self._metric_handler is None:
            from torchelastic_otel.metrics._otel import OtelMetricHandler

            self._metric_handler = OtelMetricHandler()
        return self._metric_handler

    def bridge(self, patches: Any, name: str) -> None:
        if name == _TORCH_METRICS:
            from torchelastic_otel._torch import metrics_bridge

            metrics_bridge.install(patches, self.metric_handler())
        else:
            from torchelastic_otel._torch import events_bridge
            from torchelastic_otel.events._otel import OtelLoggingHandler

            events_bridge.install(patches, OtelLoggingHandler(), import_rendezvous=self.import_rendezvous)

    def now(self) -> None:
        for name in (_TORCH_METRICS, _TORCH_EVENTS):
            self.bridge(self.patches, name)

    def when_imported(self) -> None:
        from torchelastic_otel._torch import imports

        pipeline.prepare()  # the bridge's global providers now, as the handlers' construction would make them
        for name in (_TORCH_METRICS, _TORCH_EVENTS):
            imports.when_imported(name, self._on_import)
            self.patches.on_restore(lambda name=name: imports.cancel(name, self._on_import))
        self.patches.on_restore(self._deactivate)

    def _deactivate(self) -> None:
        self.active = False

    def _on_import(self, module: Any) -> None:
        """In the thread that imported ``module``, right after its code ran."""
        if not self.active:
            return
        from torchelastic_otel._torch.patches import Patches

        changes = Patches()
        try:
            self.bridge(changes, module.__name__)
        except Exception as exc:
            changes.restore()
            from torchelastic_otel import _selftelemetry

            _selftelemetry.count(_selftelemetry.FALLBACK, "all", "torch_module_not_bridged")
            _logger.warning("torchelastic_otel: %s not bridged, left as it was: %s", module.__name__, exc,
                            exc_info=True)  # fmt: skip
            return
        self.patches.on_restore(changes.restore)


_light_bridge: list[_TorchBridge] = []


def bridge_torch_module(name: str) -> None:
    """In a process that is not the worker (a worker's descendant: ``_torch.worker_env``), which imported torch's
    events or metrics module ``name``: bridge it, and nothing else (no worker set-up, no agent lifecycle, no
    rendezvous import). Nothing if the bridge is installed here (install() bridges them) or the SDK is disabled."""
    with _lock:
        if _patches is not None or pipeline.sdk_disabled():
            return
        if not _light_bridge:
            from torchelastic_otel._torch.patches import Patches

            _light_bridge.append(_TorchBridge(Patches(), import_rendezvous=False))
        bridge = _light_bridge[0]
    bridge.bridge(bridge.patches, name)


def _forget_light_bridge() -> None:
    """install() in a process that bridged torch's modules lazily: undo that first (they are bridged again)."""
    while _light_bridge:
        _light_bridge.pop().patches.restore()


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
        explicit = tracer_provider is not None or meter_provider is not None or logger_provider is not None
        if not explicit and is_torchrun_worker():
            pipeline.start_building()  # in a thread of its own, from the first moment, beside the script's imports
        in_worker = is_torchrun_worker()
        if not _torch_available(import_now=not in_worker):
            return False
        from torchelastic_otel._torch import worker
        from torchelastic_otel._torch.patches import Patches

        _forget_light_bridge()
        if explicit:
            pipeline.setup(tracer_provider, meter_provider, logger_provider)
        patches = Patches()
        try:
            # A worker does not import torch's agent and rendezvous modules (~150 ms); bridge them only if it did.
            # Nor torch's events and metrics modules (~1 s when the script does not import torch): they are bridged
            # when the script imports them.
            bridge = _TorchBridge(patches, import_rendezvous=not in_worker)
            if in_worker:
                bridge.when_imported()
            else:
                bridge.now()
            if not in_worker or _agent_loaded():
                from torchelastic_otel._torch import lifecycle

                lifecycle.install(patches, bridge.metric_handler().emit)
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
