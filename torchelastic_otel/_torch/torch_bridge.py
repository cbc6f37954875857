"""torch's events and metrics modules bridged to OpenTelemetry: at once (an agent or launcher, which imports torch
anyway) or when the process imports them (a worker, whose script may never import torch; a worker's descendant).

Kept apart from ``_install`` so that ``worker_env`` (the start-up code of every process in a bridged environment)
can hand a descendant's post-import hook here without importing the installer above it.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

from torchelastic_otel import pipeline
from torchelastic_otel._torch.patches import Patches

__all__ = ["LIGHT", "TORCH_EVENTS", "TORCH_METRICS", "TorchBridge", "bridge_torch_module", "torch_available"]

_logger = logging.getLogger("torchelastic_otel")

TORCH_METRICS = "torch.distributed.elastic.metrics"
TORCH_EVENTS = "torch.distributed.elastic.events"


def torch_available(import_now: bool) -> bool:
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
        import torch.distributed.elastic.events
        import torch.distributed.elastic.metrics  # noqa: F401 - imported to see that both can be
    except Exception as exc:
        _logger.info("torchelastic_otel: torch.distributed.elastic not available (%s); nothing to install", exc)
        return False
    return True


class TorchBridge:
    """torch's metric streams and event destinations bridged, every change recorded in ``patches``.

    :meth:`now` bridges both modules at once; :meth:`when_imported` once the process imports each (at once if it
    has: ``_torch.imports``), so a worker whose script never imports torch never waits for it. A module bridged
    after ``install()`` returned is undone by ``uninstall()`` as well; one that fails is left as torch made it
    (logged and counted), never raised into the script's import.
    """

    def __init__(self, patches: Patches, *, import_rendezvous: bool) -> None:
        self.patches = patches
        self.import_rendezvous = import_rendezvous
        self.active = True
        self._metric_handler: object = None

    def metric_handler(self) -> Any:
        if self._metric_handler is None:
            from torchelastic_otel.metrics._otel import OtelMetricHandler

            self._metric_handler = OtelMetricHandler()
        return self._metric_handler

    def bridge(self, patches: Patches, name: str) -> None:
        if name == TORCH_METRICS:
            from torchelastic_otel._torch import metrics_bridge

            metrics_bridge.install(patches, self.metric_handler())
        else:
            from torchelastic_otel._torch import events_bridge
            from torchelastic_otel.events._otel import OtelLoggingHandler

            events_bridge.install(patches, OtelLoggingHandler(), import_rendezvous=self.import_rendezvous)

    def now(self) -> None:
        for name in (TORCH_METRICS, TORCH_EVENTS):
            self.bridge(self.patches, name)

    def when_imported(self) -> None:
        from torchelastic_otel._torch import imports

        pipeline.prepare()  # the bridge's global providers now, as the handlers' construction would make them
        for name in (TORCH_METRICS, TORCH_EVENTS):
            imports.when_imported(name, self._on_import)
            self.patches.on_restore(functools.partial(imports.cancel, name, self._on_import))
        self.patches.on_restore(self._deactivate)

    def _deactivate(self) -> None:
        self.active = False

    def _on_import(self, module: Any) -> None:
        """In the thread that imported ``module``, right after its code ran."""
        if not self.active:
            return
        changes = Patches()
        try:
            self.bridge(changes, module.__name__)
        except Exception as exc:
            changes.restore()
            from torchelastic_otel import _selftelemetry as selftelemetry

            selftelemetry.count(selftelemetry.FALLBACK, "all", "torch_module_not_bridged")
            _logger.warning(
                "torchelastic_otel: %s not bridged, left as it was: %s", module.__name__, exc, exc_info=True
            )
            return
        self.patches.on_restore(changes.restore)


class _LightBridge:
    """The bridge of a process that is not the worker and did not ``install()`` (a worker's descendant, see
    ``worker_env.join_lazily``): torch's events or metrics module bridged when imported, nothing else (no worker
    set-up, no agent lifecycle, no rendezvous import). ``install()`` takes over from it (``take_over``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bridge: TorchBridge | None = None
        self.installed = False  # install() ran: it bridges torch's modules itself

    def bridge_module(self, name: str) -> None:
        with self.lock:
            if self.installed or pipeline.sdk_disabled():
                return
            if self.bridge is None:
                self.bridge = TorchBridge(Patches(), import_rendezvous=False)
            bridge = self.bridge
        bridge.bridge(bridge.patches, name)

    def take_over(self, installed: bool) -> None:
        """``install()`` (``installed``) or ``uninstall()``: undo what was bridged lazily (it is bridged again)."""
        with self.lock:
            bridge, self.bridge = self.bridge, None
            self.installed = installed
        if bridge is not None:
            bridge.patches.restore()


LIGHT = _LightBridge()


def bridge_torch_module(module: Any) -> None:
    """Post-import hook of a worker's descendant: bridge torch's events or metrics ``module`` just imported."""
    LIGHT.bridge_module(module.__name__)
