"""The exporter pipeline: tracer, meter and logger providers configured from the standard ``OTEL_*`` variables.

It stands in for torchelastic's handlers. Rules, in order:

1. Providers the application (or ``opentelemetry-instrument``) already set globally are reused, never replaced.
2. For a signal with no global provider, one is built from ``OTEL_*`` with the SDK's own configuration code
   (``opentelemetry.sdk._configuration``: exporter names and OTLP protocol per signal, sampler, id generator,
   ``Resource.create`` for ``OTEL_RESOURCE_ATTRIBUTES``/``OTEL_SERVICE_NAME``) and set as the global provider so
   the application's own spans and logs share it. ``OTEL_SERVICE_NAME`` defaults to ``torchelastic``; exporters
   default to ``otlp`` as the specification says.
3. ``OTEL_SDK_DISABLED=true`` gives no-op providers: nothing is recorded or exported.
4. :func:`setup` lets a program pass its own providers explicitly instead.

The bridge flushes at exit (and, in workers, on SIGTERM); SDK providers also shut themselves down at exit.
A metric reader that cannot start (e.g. a Prometheus port already taken) is skipped with a warning and counted,
so one bad exporter never costs the others.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import _logs, metrics, trace

from torchelastic_otel import _selftelemetry

__all__ = ["Pipeline", "get_pipeline", "setup", "flush", "shutdown", "DEFAULT_SERVICE_NAME", "sdk_disabled", "add_flush_hook"]

_logger = logging.getLogger("torchelastic_otel")

DEFAULT_SERVICE_NAME = "torchelastic"
_DEFAULT_EXPORTER = "otlp"
_SIGNAL_ENV = {
    "traces": "OTEL_TRACES_EXPORTER",
    "metrics": "OTEL_METRICS_EXPORTER",
    "logs": "OTEL_LOGS_EXPORTER",
}


def sdk_disabled() -> bool:
    """``OTEL_SDK_DISABLED`` as the specification reads it (case-insensitive ``true``)."""
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


@dataclass
class Pipeline:
    """The providers the bridge writes to, and whether it owns (built) them."""

    tracer_provider: Any
    meter_provider: Any
    logger_provider: Any
    owned: dict[str, bool] = field(default_factory=dict)

    def flush(self, timeout_millis: int = 5000) -> bool:
        """Drain the bridge's buffers, then force-flush every provider; returns within ``timeout_millis``.

        The SDK's ``force_flush`` exports in the calling thread and ignores its timeout when the backend is down
        (the OTLP exporter retries for up to 10 s), so the provider flushes run in a helper thread that the caller
        waits for at most ``timeout_millis``. Once a flush has timed out (backend unreachable), later flushes wait
        at most 100 ms, so a dying job is not held up once per signal and per exit path. Never raises.
        """
        for hook in list(_flush_hooks):
            try:
                hook()
            except Exception:  # pragma: no cover - a hook must not stop the flush
                _logger.debug("flush hook failed", exc_info=True)
        if self._backend_down:
            timeout_millis = min(timeout_millis, 100)
        ok = _run_bounded(self._force_flush_all, timeout_millis)
        if ok is None:
            self._backend_down = True
            _selftelemetry.count(_selftelemetry.DROPPED, "all", "flush_timeout")
            return False
        self._backend_down = not ok
        return ok

    def _force_flush_all(self) -> bool:
        ok = True
        for provider in (self.meter_provider, self.logger_provider, self.tracer_provider):
            force_flush = getattr(provider, "force_flush", None)
            if force_flush is None:
                continue
            try:
                ok = force_flush() is not False and ok
            except Exception:
                ok = False
                _logger.debug("force_flush failed", exc_info=True)
        return ok

    def shutdown(self, timeout_millis: int = 5000) -> bool:
        """Flush, then shut down the providers this pipeline built (never the application's), within the time."""
        deadline = time.monotonic() + timeout_millis / 1000
        self.flush(timeout_millis)
        remaining = max(0, int((deadline - time.monotonic()) * 1000))
        if self._backend_down:
            remaining = min(remaining, 100)
        return _run_bounded(self._shutdown_owned, remaining) is not None

    def _shutdown_owned(self) -> bool:
        for signal, provider in (
            ("metrics", self.meter_provider),
            ("logs", self.logger_provider),
            ("traces", self.tracer_provider),
        ):
            if self.owned.get(signal) and hasattr(provider, "shutdown"):
                try:
                    provider.shutdown()
                except Exception:
                    _logger.debug("shutdown of %s provider failed", signal, exc_info=True)
        return True

    _backend_down: bool = field(default=False, init=False, repr=False)


def _run_bounded(fn: Callable[[], bool], timeout_millis: int) -> bool | None:
    """``fn()`` in a daemon thread, waited for at most ``timeout_millis``; ``None`` if it did not finish."""
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(fn()), name="torchelastic-otel-flush", daemon=True)
    thread.start()
    thread.join(max(0, timeout_millis) / 1000)
    return result[0] if result else None


#: Total time the exit paths (end of an agent run, SIGTERM or an uncaught exception in a worker, interpreter exit)
#: may spend delivering what is left; a dead backend must not hold the job up.
EXIT_TIMEOUT_MILLIS = int(os.environ.get("TORCHELASTIC_OTEL_EXIT_TIMEOUT_MILLIS", "1000"))


_lock = threading.RLock()
_pipeline: Pipeline | None = None
_flush_hooks: list[Callable[[], None]] = []


def add_flush_hook(hook: Callable[[], None]) -> None:
    """Run ``hook`` before every flush: the adapters drain their buffers into the SDK there."""
    _flush_hooks.append(hook)
_atexit_registered = False


def _is_unset(provider: Any) -> bool:
    """True for the API's proxy providers, i.e. nobody has set a global provider yet."""
    return type(provider).__name__.startswith(("Proxy", "_Proxy"))


def _resource() -> Any:
    """``Resource.create`` (env detectors, ``OTEL_RESOURCE_ATTRIBUTES``) with ``service.name`` defaulting to ours."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    resource = Resource.create()
    if not os.environ.get("OTEL_SERVICE_NAME") and str(resource.attributes.get(SERVICE_NAME, "")).startswith(
        "unknown_service"
    ):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    from torchelastic_otel.resource import torchrun_attributes

    # Attributes from torchrun's environment first, so an explicit OTEL_RESOURCE_ATTRIBUTES still wins.
    return Resource(torchrun_attributes()).merge(resource)


def _exporter_classes(signal: str) -> dict[str, type]:
    """Exporter classes named by ``OTEL_{signal}_EXPORTER`` (default ``otlp``), resolved by the SDK's entry points.

    Each name is resolved on its own (the SDK's ``_get_exporter_entry_point`` picks the OTLP protocol per signal):
    one that cannot be (an unknown exporter, an invalid ``OTEL_EXPORTER_OTLP_*PROTOCOL``) is skipped with a warning
    and counted, so it costs neither the signal's other exporters nor the other signals.
    """
    from opentelemetry.sdk._configuration import _get_exporter_entry_point, _import_exporters

    names = os.environ.get(_SIGNAL_ENV[signal], _DEFAULT_EXPORTER)
    if not names or names.strip().lower() == "none":
        return {}
    index = ("traces", "metrics", "logs").index(signal)
    classes: dict[str, type] = {}
    for requested in names.split(","):
        requested = requested.strip()
        if not requested:
            continue
        try:
            args: list[list[str]] = [[], [], []]
            args[index] = [_get_exporter_entry_point(requested, signal)]  # type: ignore[arg-type]
            classes.update(_import_exporters(*args)[index])
        except Exception as exc:
            _selftelemetry.count(_selftelemetry.DROPPED, signal, f"exporter_unavailable:{requested}")
            _logger.warning("torchelastic_otel: %s exporter %r is not available: %s", signal, requested, exc)
    return classes


def _construct(signal: str, name: str, cls: type) -> Any | None:
    """Instantiate one exporter/reader; a failure is logged and counted instead of losing the whole pipeline."""
    try:
        with _prometheus_port_for_this_process(cls):
            return cls()
    except Exception as exc:
        _selftelemetry.count(_selftelemetry.DROPPED, signal, f"exporter_unavailable:{name}")
        _logger.warning("torchelastic_otel: %s exporter %r could not start: %s", signal, name, exc)
        return None


class _prometheus_port_for_this_process:
    """Give each worker of a node its own Prometheus port: ``OTEL_EXPORTER_PROMETHEUS_PORT + 1 + LOCAL_RANK``.

    The agent (no ``LOCAL_RANK``) keeps the base port (default 9464). Without this, the second worker on a node
    dies binding the same port and loses its whole pipeline. ``TORCHELASTIC_OTEL_PROMETHEUS_PORT_OFFSET=0``
    turns the offset off (for one worker per container).
    """

    def __init__(self, cls: type) -> None:
        self._active = "prometheus" in getattr(cls, "__module__", "") and "LOCAL_RANK" in os.environ
        self._saved: str | None = None

    def __enter__(self) -> None:
        if not self._active or os.environ.get("TORCHELASTIC_OTEL_PROMETHEUS_PORT_OFFSET", "1") == "0":
            self._active = False
            return
        self._saved = os.environ.get("OTEL_EXPORTER_PROMETHEUS_PORT")
        base = int(self._saved or 9464)
        try:
            local_rank = int(os.environ["LOCAL_RANK"])
        except ValueError:
            local_rank = 0
        os.environ["OTEL_EXPORTER_PROMETHEUS_PORT"] = str(base + 1 + local_rank)

    def __exit__(self, *exc: object) -> None:
        if not self._active:
            return
        if self._saved is None:
            os.environ.pop("OTEL_EXPORTER_PROMETHEUS_PORT", None)
        else:
            os.environ["OTEL_EXPORTER_PROMETHEUS_PORT"] = self._saved


def _or_default(variable: str, load: Callable[[], Any]) -> Any:
    """A component named by ``variable``, or ``None`` (the SDK default) when it cannot be loaded."""
    try:
        return load()
    except Exception as exc:
        _logger.warning("torchelastic_otel: ignoring %s (%s); using the SDK default", variable, exc)
        _selftelemetry.count(_selftelemetry.SANITIZED, "traces", f"invalid_{variable.lower()}")
        return None


def _build_tracer_provider(resource: Any) -> Any:
    from opentelemetry.sdk._configuration import (
        _get_id_generator,
        _get_sampler,
        _import_id_generator,
        _import_sampler,
    )
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(
        shutdown_on_exit=False,  # the bridge's exit handler shuts it down, within a time bound
        resource=resource,
        sampler=_or_default("OTEL_TRACES_SAMPLER", lambda: _import_sampler(_get_sampler())),
        id_generator=_or_default("OTEL_PYTHON_ID_GENERATOR", lambda: _import_id_generator(_get_id_generator())),
    )
    for name, cls in _exporter_classes("traces").items():
        exporter = _construct("traces", name, cls)
        if exporter is not None:
            provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _build_meter_provider(resource: Any) -> Any:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader

    readers = []
    for name, cls in _exporter_classes("metrics").items():
        made = _construct("metrics", name, cls)
        if made is None:
            continue
        readers.append(made if isinstance(made, MetricReader) else PeriodicExportingMetricReader(made))
    return MeterProvider(resource=resource, metric_readers=readers, shutdown_on_exit=False)


def _build_logger_provider(resource: Any) -> Any:
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor

    provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
    for name, cls in _exporter_classes("logs").items():
        exporter = _construct("logs", name, cls)
        if exporter is not None:
            provider.add_log_record_processor(BatchLogRecordProcessor(exporter))
    return provider


def _noop_pipeline() -> Pipeline:
    return Pipeline(trace.NoOpTracerProvider(), metrics.NoOpMeterProvider(), _logs.NoOpLoggerProvider())


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
    resource = _resource()
    if missing["traces"]:
        tracer_provider = _build_tracer_provider(resource)
        trace.set_tracer_provider(tracer_provider)
        tracer_provider = trace.get_tracer_provider()
    if missing["metrics"]:
        meter_provider = _build_meter_provider(resource)
        metrics.set_meter_provider(meter_provider)
        meter_provider = metrics.get_meter_provider()
    if missing["logs"]:
        logger_provider = _build_logger_provider(resource)
        _logs.set_logger_provider(logger_provider)
        logger_provider = _logs.get_logger_provider()
    return Pipeline(tracer_provider, meter_provider, logger_provider, owned=missing)


def _at_exit() -> None:
    """Deliver what is left, then shut down the providers the bridge built -- within EXIT_TIMEOUT_MILLIS."""
    current = _pipeline
    if current is not None:
        current.shutdown(EXIT_TIMEOUT_MILLIS)


def _register_atexit() -> None:
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(_at_exit)
        _atexit_registered = True


def get_pipeline() -> Pipeline:
    """The pipeline the bridge exports to, created from ``OTEL_*`` on first use."""
    global _pipeline
    current = _pipeline
    if current is not None:
        return current
    with _lock:
        if _pipeline is None:
            if sdk_disabled():
                _pipeline = _noop_pipeline()
            else:
                try:
                    _pipeline = _from_environment()
                except Exception as exc:
                    # A broken configuration must not reach the job: log it and export nothing.
                    _logger.warning("torchelastic_otel: could not configure OpenTelemetry from OTEL_*: %s", exc)
                    _selftelemetry.count(_selftelemetry.DROPPED, "all", "pipeline_unavailable")
                    _pipeline = _noop_pipeline()
            _register_atexit()
            _selftelemetry.instrument(_pipeline.meter_provider)
        return _pipeline


def setup(tracer_provider: Any = None, meter_provider: Any = None, logger_provider: Any = None) -> Pipeline:
    """Use these providers explicitly (``None``: the global one, or one built from ``OTEL_*`` if none is set).

    Call it before the first event or metric. It replaces the bridge's pipeline, never the global providers the
    application set; providers given here are the caller's to shut down.
    """
    global _pipeline
    with _lock:
        base = _from_environment() if None in (tracer_provider, meter_provider, logger_provider) else None
        _pipeline = Pipeline(
            tracer_provider if tracer_provider is not None else base.tracer_provider,  # type: ignore[union-attr]
            meter_provider if meter_provider is not None else base.meter_provider,  # type: ignore[union-attr]
            logger_provider if logger_provider is not None else base.logger_provider,  # type: ignore[union-attr]
            owned={} if base is None else dict(base.owned),
        )
        _register_atexit()
        _generation[0] += 1
        _selftelemetry.instrument(_pipeline.meter_provider)
        return _pipeline


#: Bumped whenever the pipeline is replaced, so adapters re-resolve their cached loggers/meters.
_generation = [0]


def flush(timeout_millis: int = 5000) -> bool:
    """Export everything recorded so far (drains the bridge's buffers first); never raises. ``True`` on success."""
    current = _pipeline
    return current.flush(timeout_millis) if current is not None else True


def shutdown() -> None:
    """Flush and shut down the providers the bridge built; the next event builds a fresh pipeline."""
    global _pipeline
    with _lock:
        current, _pipeline = _pipeline, None
        _generation[0] += 1
    if current is not None:
        current.shutdown()


def _reset_for_tests() -> None:
    """Forget the pipeline without touching providers (tests install their own)."""
    global _pipeline
    with _lock:
        _pipeline = None
        _generation[0] += 1
