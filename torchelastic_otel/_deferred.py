"""A torchrun worker builds its pipeline off its start-up path.

Importing and setting up the SDK and the OTLP exporters costs a worker ~150-250 ms before the training script's
first line. So :func:`defer` puts placeholders (``_placeholders.BuildOnUse``) in for the global providers, and the
pipeline is built on first use: a value or event to export (the drainer), a span or meter the application asks for,
a flush, SIGTERM, exit -- or ``DEFER_MAX_MILLIS`` after :func:`defer` at the latest. Not with a Prometheus exporter,
whose endpoint must be up from the start.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from torchelastic_otel import _compat, _placeholders, _providers, _runtime, pipeline
from torchelastic_otel._config import env_millis, sdk_disabled

_logger = logging.getLogger("torchelastic_otel")

#: The latest a deferred pipeline is built after ``defer()``, by the drainer, if nothing needed it before.
DEFER_MAX_MILLIS = env_millis("TORCHELASTIC_OTEL_SETUP_DELAY_MILLIS", 5000)
_SIGNALS = ("traces", "metrics", "logs")

_since: list[float | None] = [None]
_on_build: list[Callable[[], Any]] = []


def _pulls_metrics() -> bool:
    return "prometheus" in os.environ.get(_providers.SIGNAL_ENV["metrics"], "").lower()


def defer() -> bool:
    """Build the pipeline later (see above). ``True`` if the set-up is deferred now. Never where no thread can
    start at exit: a worker that exits before its first telemetry could not build it then."""
    state = pipeline.state
    with state.lock:
        if state.current is not None or _since[0] is not None or sdk_disabled() or _pulls_metrics():
            return False
        if not _compat.threads_start_at_exit():
            return False
        for signal in _SIGNALS:
            _compat.replace_global_provider(signal, None, _placeholders.BuildOnUse(signal))  # only where unset
        _since[0] = time.monotonic()
        _runtime.install()
        return True


def deferred() -> bool:
    """Whether :func:`defer` was called and the pipeline has not been built since."""
    return _since[0] is not None


def setup_pending() -> bool:
    """Whether the pipeline's set-up is deferred and has not happened yet."""
    return _since[0] is not None and pipeline.state.current is None


def when_built(callback: Callable[[], Any]) -> None:
    """Run ``callback()`` once the pipeline is built (now, if it is)."""
    with pipeline.state.lock:
        if pipeline.state.current is None:
            _on_build.append(callback)
            return
    _run_callback(callback)


def build_if_due() -> None:
    """Build a deferred pipeline whose time has come (called by the drainer on every round)."""
    since = _since[0]
    if since is not None and pipeline.state.current is None and (time.monotonic() - since) * 1000 >= DEFER_MAX_MILLIS:
        pipeline.get_pipeline()


def build_pending() -> None:
    """Build a deferred pipeline now (a flush, a signal, exit)."""
    if setup_pending():
        pipeline.get_pipeline()


def after_build() -> None:
    """The pipeline exists: run what waited for it."""
    _since[0] = None
    callbacks, _on_build[:] = list(_on_build), []
    for callback in callbacks:
        _run_callback(callback)


def _run_callback(callback: Callable[[], Any]) -> None:
    try:
        callback()
    except Exception:
        _logger.debug("callback after the pipeline's set-up failed", exc_info=True)


def forget() -> None:
    """Tests: drop a pending set-up and its placeholders."""
    if _since[0] is not None:
        for signal in _SIGNALS:
            current = _compat.global_provider(signal)
            if isinstance(current, _placeholders.BuildOnUse):
                _compat.replace_global_provider(signal, current, None)
    _since[0] = None
    _on_build.clear()
