"""A forked child exports its own telemetry, never its parent's again.

After ``fork`` the providers the bridge built are the parent's copies: their metric storage holds the parent's
cumulative values (the child would export them again, as its own), their resource names the parent's pid, and their
exporters' connections are the parent's. :func:`after_fork_in_child` marks them for a rebuild on first use
(``_placeholders.RebuildOnUse``): nothing is built in the fork handler, where other modules' handlers have not run
yet, and a child that records nothing (a DataLoader worker) builds nothing. Providers the application set or gave
to ``setup()`` are the application's to handle.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from torchelastic_otel import _compat, _drainer, _placeholders, _providers, _runtime, _selftelemetry, pipeline

_logger = logging.getLogger("torchelastic_otel")

_pending = [False]


def pending() -> bool:
    """A forked child whose pipeline is still the parent's copy."""
    return _pending[0]


def forget() -> None:
    _pending[0] = False


def after_fork_in_child() -> None:
    current = pipeline.state.current
    if current is None or not any(current.owned.values()):
        return
    for signal, provider in current.providers().items():
        if current.owned.get(signal):
            _compat.replace_global_provider(signal, provider, _placeholders.RebuildOnUse(signal, provider))
    _pending[0] = True
    pipeline.state.generation[0] += 1
    _flush_at_multiprocessing_exit()


def rebuild(current: Any) -> Any:
    """Fresh providers, exporters and resource (``process.pid``) in the child for what the bridge built.

    In the child the parent's exporters do nothing (``_counting``); tracers, meters and loggers obtained from them
    before the fork stay theirs, so a child gets its own after the fork. Prometheus readers are not rebuilt: the
    parent serves that port. A failure gives the child a no-op pipeline (counted): the job goes on.
    """
    _pending[0] = False
    try:
        return _rebuild(current)
    except Exception as exc:
        _logger.warning("torchelastic_otel: could not set up telemetry in a forked child: %s", exc)
        _selftelemetry.count(_selftelemetry.DROPPED, "all", "pipeline_unavailable")
        return pipeline._noop_pipeline()


def _rebuild(current: Any) -> Any:
    resource = _providers.resource()
    providers = current.providers()
    builders: dict[str, Callable[[], Any]] = {
        "traces": lambda: _providers.build_tracer_provider(resource),
        "metrics": lambda: _providers.build_meter_provider(resource, pull=False),
        "logs": lambda: _providers.build_logger_provider(resource),
    }
    owned = dict(current.owned)
    for signal, old in list(providers.items()):
        if not owned.get(signal):
            continue
        placeholder = _compat.global_provider(signal)
        if not (isinstance(placeholder, _placeholders.RebuildOnUse) and placeholder._parent_provider is old):
            owned[signal] = False  # no longer the global provider: leave it alone
            continue
        new = builders[signal]()
        _compat.replace_global_provider(signal, placeholder, new)
        providers[signal] = new
    return pipeline.Pipeline(providers["traces"], providers["metrics"], providers["logs"], owned=owned)


def settle(deadline: float | None = None) -> bool:
    """Drain the buffers (recording something rebuilds the pipeline); ``True`` if the child has its own pipeline
    now, ``False`` if it recorded nothing of its own."""
    _drainer.drain_all(deadline)
    return not _pending[0]


class _ForkToken:
    """Kept alive for ``multiprocessing.util.register_after_fork`` (which holds its object weakly)."""


_fork_token = _ForkToken()
_multiprocessing_hooked = [False]


def _flush_at_multiprocessing_exit() -> None:
    """A ``multiprocessing`` child started by fork ends with ``os._exit``, which skips ``atexit``: have its
    ``Process._bootstrap`` exit path (the ``multiprocessing.util`` finalizers) run the bridge's exit handler."""
    util = sys.modules.get("multiprocessing.util")
    if util is None or _multiprocessing_hooked[0]:
        return
    _multiprocessing_hooked[0] = True  # inherited by this process's children, as is the registration below

    def register(_token: Any) -> None:
        util.Finalize(None, _runtime.at_exit, exitpriority=0)

    util.register_after_fork(_fork_token, register)
