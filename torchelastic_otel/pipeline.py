"""The exporter pipeline: tracer, meter and logger providers configured from the standard ``OTEL_*`` variables.

It stands in for torchelastic's handlers. Rules, in order:

1. Providers the application (or ``opentelemetry-instrument``) already set globally are reused, never replaced.
2. For a signal with no global provider, one is built from ``OTEL_*`` with the SDK's own configuration code
   (``_providers``) and set as the global provider so the application's own spans and logs share it.
   ``OTEL_SERVICE_NAME`` defaults to ``torchelastic``; exporters default to ``otlp`` as the specification says.
3. ``OTEL_SDK_DISABLED=true`` gives no-op providers: nothing is recorded or exported.
4. :func:`setup` lets a program pass its own providers explicitly instead.
5. A torchrun worker builds its pipeline off its start-up path (``_deferred``); a forked child rebuilds the
   providers the bridge built on first use (``_fork``). Exit, signals and forks are ``_runtime``'s.

Every flush is bounded (``_bounded``): a dead backend must not hold the job up.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import _logs, metrics, trace

from torchelastic_otel import _bounded, _compat, _config, _deferred, _drainer, _fork, _placeholders, _providers, _runtime, _selftelemetry
from torchelastic_otel._config import EXIT_TIMEOUT_MILLIS, sdk_disabled
from torchelastic_otel._providers import DEFAULT_SERVICE_NAME

__all__ = [
    "Pipeline",
    "get_pipeline",
    "setup",
    "flush",
    "shutdown",
    "prepare",
    "DEFAULT_SERVICE_NAME",
    "EXIT_TIMEOUT_MILLIS",
    "sdk_disabled",
]

_logger = logging.getLogger("torchelastic_otel")


@dataclass
class Pipeline:
    """The providers the bridge writes to, and whether it owns (built) them."""

    tracer_provider: Any
    meter_provider: Any
    logger_provider: Any
    owned: dict[str, bool] = field(default_factory=dict)

    def providers(self) -> dict[str, Any]:
        return {"traces": self.tracer_provider, "metrics": self.meter_provider, "logs": self.logger_provider}

    def flush(self, timeout_millis: int = 5000) -> bool:
        """Drain the bridge's buffers (half of the time at most), then force-flush every provider; returns within
        ``timeout_millis`` (``_bounded.bounded_flush``). Never raises; ``False`` if it timed out or an export
        failed meanwhile."""
        started = time.monotonic()
        deadline = started + max(0, timeout_millis) / 1000
        _drainer.drain_all(started + max(0, timeout_millis) / 2000)
        return _bounded.bounded_flush(self._force_flush_all, max(0, int((deadline - time.monotonic()) * 1000)))

    def _force_flush_all(self) -> bool:
        ok = True
        for provider in (self.meter_provider, self.logger_provider, self.tracer_provider):
            try:
                ok = _force_flush(provider) and ok
            except Exception:
                ok = False
                _logger.debug("force_flush failed", exc_info=True)
        return ok

    def shutdown(self, timeout_millis: int = 5000) -> bool:
        """Flush, then shut down the providers this pipeline built (never the application's), within the time."""
        deadline = time.monotonic() + timeout_millis / 1000
        self.flush(timeout_millis)
        remaining = max(0, int((deadline - time.monotonic()) * 1000))
        if _bounded.backend_down():
            remaining = min(remaining, _config.DOWN_WAIT_MILLIS)
        return _bounded.run_bounded(self._shutdown_owned, remaining) is not None

    def _shutdown_owned(self) -> bool:
        for signal, provider in self.providers().items():
            if self.owned.get(signal) and hasattr(provider, "shutdown"):
                try:
                    provider.shutdown()
                except Exception:
                    _logger.debug("shutdown of %s provider failed", signal, exc_info=True)
        return True


def _force_flush(provider: Any) -> bool:
    """A provider's flush in the caller's thread: the bridge's own without its bound (the caller bounds it), an
    application's meter provider without its pull readers (a Prometheus reader collected out of turn serves every
    metric family twice on its next scrape, opentelemetry-python#2500)."""
    unbounded = getattr(provider, "force_flush_unbounded", None)
    if unbounded is not None:
        return unbounded() is not False
    readers = _compat.metric_readers(provider)
    if readers is not None and any(_providers._is_pull_reader(r) for r in readers):
        return all([r.force_flush() is not False for r in readers if not _providers._is_pull_reader(r)])
    force_flush = getattr(provider, "force_flush", None)
    return force_flush is None or force_flush() is not False


class _State:
    """The bridge's pipeline in this process, and where its set-up stands (``_deferred``, ``_fork``)."""

    def __init__(self) -> None:
        self.current: Pipeline | None = None
        self.lock = threading.RLock()
        #: Bumped whenever the pipeline is replaced, so adapters re-resolve their cached loggers/meters.
        self.generation = [0]

    def replaced(self, pipeline: Pipeline | None) -> None:
        self.current = pipeline
        self.generation[0] += 1


state = _State()
_generation = state.generation


def _noop_pipeline() -> Pipeline:
    return Pipeline(trace.NoOpTracerProvider(), metrics.NoOpMeterProvider(), _logs.NoOpLoggerProvider())


def _is_unset(provider: Any) -> bool:
    """True for the API's proxy providers (nobody has set a global provider yet) and the bridge's placeholders."""
    return isinstance(provider, _placeholders.Placeholder) or _compat.is_proxy_provider(provider)


def _from_environment() -> Pipeline:
    """Reuse the global providers that are set; build (and set) the others from ``OTEL_*``."""
    tracer_provider = trace.get_tracer_provider()
    meter_provider = metrics.get_meter_provider()
    logger_provider = _logs.get_logger_provider()
    missing = {
        "traces": _is_unset(tracer_provider),
        "metrics": _is_unset(meter_provider),
        "logs": _is_unset(logger_provider),
    }
    if not any(missing.values()):
        return Pipeline(tracer_provider, meter_provider, logger_provider)
    resource = _providers.resource()
    if missing["traces"]:
        trace.set_tracer_provider(_providers.build_tracer_provider(resource))
        tracer_provider = trace.get_tracer_provider()
    if missing["metrics"]:
        metrics.set_meter_provider(_providers.build_meter_provider(resource))
        meter_provider = metrics.get_meter_provider()
    if missing["logs"]:
        _logs.set_logger_provider(_providers.build_logger_provider(resource))
        logger_provider = _logs.get_logger_provider()
    return Pipeline(tracer_provider, meter_provider, logger_provider, owned=missing)


def _built(pipeline: Pipeline) -> Pipeline:
    """Make ``pipeline`` the bridge's: exit handling, self-telemetry, and whatever waited for it (``_deferred``)."""
    state.replaced(pipeline)
    _runtime.install()
    _selftelemetry.instrument(pipeline.meter_provider)
    _deferred.after_build()
    return pipeline


def get_pipeline() -> Pipeline:
    """The pipeline the bridge exports to, created from ``OTEL_*`` on first use."""
    current = state.current
    if current is not None and not _fork.pending():
        return current
    with state.lock:
        if _fork.pending() and state.current is not None:
            return _built(_fork.rebuild(state.current))
        if state.current is None:
            if sdk_disabled():
                return _built(_noop_pipeline())
            try:
                return _built(_from_environment())
            except Exception as exc:
                # A broken configuration must not reach the job: log it and export nothing.
                _logger.warning("torchelastic_otel: could not configure OpenTelemetry from OTEL_*: %s", exc)
                _selftelemetry.count(_selftelemetry.DROPPED, "all", "pipeline_unavailable")
                return _built(_noop_pipeline())
        return state.current


def setup(tracer_provider: Any = None, meter_provider: Any = None, logger_provider: Any = None) -> Pipeline:
    """Use these providers explicitly (``None``: the global one, or one built from ``OTEL_*`` if none is set).

    Call it before the first event or metric. It replaces the bridge's pipeline, never the global providers the
    application set; providers given here are the caller's to shut down.
    """
    with state.lock:
        if _fork.pending():
            get_pipeline()  # a forked child: the bridge's own providers first become the child's
        base = _from_environment() if None in (tracer_provider, meter_provider, logger_provider) else None
        return _built(
            Pipeline(
                tracer_provider if tracer_provider is not None else base.tracer_provider,  # type: ignore[union-attr]
                meter_provider if meter_provider is not None else base.meter_provider,  # type: ignore[union-attr]
                logger_provider if logger_provider is not None else base.logger_provider,  # type: ignore[union-attr]
                owned={} if base is None else dict(base.owned),
            )
        )


def prepare() -> None:
    """Make the bridge's providers the global ones now, before the application starts spans: build the pipeline,
    unless its set-up is deferred (then placeholders already stand in for the global providers)."""
    if not _deferred.deferred():
        get_pipeline()


def flush(timeout_millis: int = 5000) -> bool:
    """Export everything recorded so far (drains the bridge's buffers first); never raises. ``True`` on success."""
    if _fork.pending() and not _fork.settle(time.monotonic() + max(0, timeout_millis) / 2000):
        return True  # a forked child that recorded nothing yet
    _deferred.build_pending()
    current = state.current
    return current.flush(timeout_millis) if current is not None else True


def shutdown() -> None:
    """Flush and shut down the providers the bridge built; the next event builds a fresh pipeline."""
    if _fork.pending():
        _fork.settle()
    with state.lock:
        current = state.current
        _fork.forget()
        state.replaced(None)
    if current is not None:
        current.shutdown()


def _reset_for_tests() -> None:
    """Forget the pipeline without touching providers (tests install their own)."""
    with state.lock:
        _fork.forget()
        state.replaced(None)
        _deferred.forget()
