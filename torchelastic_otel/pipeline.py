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

What the bridge builds accounts for what it loses (``torchelastic_otel.dropped``): each exporter is wrapped so
that a failed export counts its items (``export_failed``), and the batch processors count what a full queue drops
(``queue_full``). The wrappers also tell a flush when exports are stuck, so a dead collector costs a flush
milliseconds, not the exporters' 10 s of retries. A forked child rebuilds the providers the bridge built, with its
own resource, on first use (``_after_fork_in_child``). The Prometheus exporter listens on 127.0.0.1 unless
``OTEL_EXPORTER_PROMETHEUS_HOST`` says otherwise.
"""

from __future__ import annotations

import atexit
import inspect
import logging
import os
import sys
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
        at most 100 ms, so a dying job is not held up once per signal and per exit path. The flush also gives up
        early once an export of the bridge's exporters is stuck -- retrying (the collector refused the connection,
        the TLS handshake failed...) or in flight for ``TORCHELASTIC_OTEL_EXPORT_STALL_MILLIS`` (default 2000) --
        as the OTLP exporters keep retrying an unreachable collector for 10 s; and it waits at most 100 ms while
        the last export failed. Draining the buffers takes at most half of the time. Never raises; ``False`` if it
        timed out or an export failed meanwhile.
        """
        started = time.monotonic()
        deadline = started + max(0, timeout_millis) / 1000
        _run_flush_hooks(started + max(0, timeout_millis) / 2000)  # draining gets half the time at most
        timeout_millis = max(0, int((deadline - time.monotonic()) * 1000))
        health = _health
        if self._backend_down or health.down():
            timeout_millis = min(timeout_millis, 100)
        failures = health.failures
        ok = _run_bounded(self._force_flush_all, timeout_millis, give_up=health.stuck)
        if ok is None:
            self._backend_down = True
            _selftelemetry.count(_selftelemetry.DROPPED, "all", "flush_timeout")
            return False
        ok = ok and health.failures == failures  # the SDK's force_flush says True even when the export failed
        self._backend_down = not ok
        return ok

    def _force_flush_all(self) -> bool:
        ok = _flush_push_readers(self.meter_provider)
        for provider in (self.logger_provider, self.tracer_provider):
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


def _is_pull_reader(reader: Any) -> bool:
    """A reader that is scraped (Prometheus): nothing to push, and collecting it out of turn queues a snapshot
    that its next scrape serves first, with every metric family twice (opentelemetry-python#2500). A scrape
    drains the bridge's buffers itself (``_selftelemetry.add_before_collect``)."""
    return any(cls.__name__ == "PrometheusMetricReader" for cls in type(reader).__mro__)


def _flush_push_readers(meter_provider: Any) -> bool:
    """``MeterProvider.force_flush`` without the pull readers; any other provider's own ``force_flush``."""
    readers = getattr(meter_provider, "_metric_readers", None)
    if readers is None or not any(_is_pull_reader(r) for r in readers):
        force_flush = getattr(meter_provider, "force_flush", None)
        try:
            return force_flush is None or force_flush() is not False
        except Exception:
            _logger.debug("force_flush failed", exc_info=True)
            return False
    ok = True
    for reader in readers:
        if _is_pull_reader(reader):
            continue
        try:
            ok = reader.force_flush() is not False and ok
        except Exception:
            ok = False
            _logger.debug("force_flush of %s failed", type(reader).__name__, exc_info=True)
    return ok


def _run_bounded(
    fn: Callable[[], bool], timeout_millis: int, give_up: Callable[[], bool] | None = None
) -> bool | None:
    """``fn()`` in a daemon thread, waited for at most ``timeout_millis``; ``None`` if it did not finish.

    ``give_up`` is polled every 20 ms while waiting: when it returns true, stop waiting at once (``None``).
    """
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(fn()), name="torchelastic-otel-flush", daemon=True)
    thread.start()
    deadline = time.monotonic() + max(0, timeout_millis) / 1000
    while True:
        remaining = deadline - time.monotonic()
        thread.join(max(0.0, min(remaining, 0.02 if give_up is not None else remaining)))
        if not thread.is_alive() or remaining <= 0:
            break
        if give_up is not None and give_up():
            break
    return result[0] if result else None


def _env_millis(name: str, default: int) -> int:
    try:
        return max(0, int(os.environ.get(name, "") or default))
    except ValueError:
        return default


#: An export in flight for longer than this means the backend is unreachable (or too slow to wait for at exit).
EXPORT_STALL_MILLIS = _env_millis("TORCHELASTIC_OTEL_EXPORT_STALL_MILLIS", 2000)


class _ExportHealth:
    """What the bridge's exporters are doing: when each export in flight started, whether one of them is retrying,
    and whether the last one failed.

    A flush waits for the exporters, and the OTLP exporters retry an unreachable collector for up to
    ``OTEL_EXPORTER_OTLP_TIMEOUT`` (10 s): this is how the flush knows not to wait that long. An export counts as
    stuck once it retries (the exporters log each retry: ``_RetryWatch``; a refused connection or a failed TLS
    handshake shows within milliseconds) or once it has been in flight for ``EXPORT_STALL_MILLIS`` (a collector
    that does not answer at all).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started: dict[int, float] = {}
        self._next = 0
        self._retried_at = -1.0
        self.failing = False
        self.failures = 0

    def begin(self) -> int:
        with self._lock:
            self._next += 1
            self._started[self._next] = time.monotonic()
            return self._next

    def end(self, token: int, ok: bool) -> None:
        with self._lock:
            self._started.pop(token, None)
            self.failing = not ok
            self.failures += not ok

    def retrying(self) -> None:
        self._retried_at = time.monotonic()

    def stuck(self) -> bool:
        """An export in flight has retried, or has been in flight for longer than ``EXPORT_STALL_MILLIS``."""
        with self._lock:
            oldest = min(self._started.values(), default=None)
        if oldest is None:
            return False
        return self._retried_at >= oldest or (time.monotonic() - oldest) * 1000 > EXPORT_STALL_MILLIS

    def down(self) -> bool:
        """The last export failed, or one is stuck: the backend is unreachable for now."""
        return self.failing or self.stuck()


class _RetryWatch(logging.Filter):
    """Notes the OTLP exporters' "Transient error ..., retrying in ..." warnings (it filters nothing out): the
    first attempt of an export failed, and the exporter now waits before the next one."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg
        if isinstance(msg, str) and msg.startswith("Transient error"):
            _health.retrying()
        return True


_retry_watch = _RetryWatch()


def _watch_retries(exporter: Any) -> None:
    """Watch the loggers of the exporter's modules (the OTLP exporters log their retries there)."""
    for klass in type(exporter).__mro__:
        module = getattr(klass, "__module__", "") or ""
        if module.startswith("opentelemetry.exporter."):
            logger = logging.getLogger(module)
            if _retry_watch not in logger.filters:
                logger.addFilter(_retry_watch)


_health = _ExportHealth()


def _failed(result: Any) -> bool:
    return getattr(result, "name", None) == "FAILURE"


def _exporting(signal: str, health: _ExportHealth, pid: int, count: int, export: Callable[[], Any]) -> Any:
    """Run one export of ``count`` items, counting them as dropped (``export_failed``) if it fails or raises.

    In a forked child the parent's exporters do nothing: their metric storage is the parent's (it exports it
    itself), and spans or records that still reach them came from tracers/loggers obtained before the fork
    (counted: ``forked_child``); the child builds its own pipeline, see ``_after_fork_in_child``.
    """
    if os.getpid() != pid:
        if signal != "metrics" and count:
            _selftelemetry.count(_selftelemetry.DROPPED, signal, "forked_child", count)
        return None
    gate = _fork_gate
    gate.enter()
    token = health.begin()
    ok = False
    try:
        result = export()
        ok = not _failed(result)
        return result
    finally:
        health.end(token, ok)
        gate.leave()
        if not ok and count:
            _selftelemetry.count(_selftelemetry.DROPPED, signal, "export_failed", count)


class _ForkGate:
    """Keeps the bridge's exports out of the moment a process forks.

    gRPC can only prepare a fork (its ``fork()`` handlers) when no thread is inside a gRPC call; otherwise the
    child inherits gRPC in a broken state ("Other threads are currently calling into gRPC, skipping fork()
    handlers"), and the child's own OTLP/gRPC exports hang. Before a fork, new exports wait and the fork waits
    (at most ``FORK_WAIT_MILLIS``, and not at all for exports that are stuck retrying) for those in flight.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._in_flight = 0
        self._forking = False

    def enter(self) -> None:
        with self._cond:
            deadline = time.monotonic() + FORK_WAIT_MILLIS / 1000
            while self._forking and (remaining := deadline - time.monotonic()) > 0:
                self._cond.wait(remaining)
            self._in_flight += 1

    def leave(self) -> None:
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()

    def before_fork(self) -> None:
        with self._cond:
            self._forking = True
            deadline = time.monotonic() + FORK_WAIT_MILLIS / 1000
            while self._in_flight and not _health.stuck() and (remaining := deadline - time.monotonic()) > 0:
                self._cond.wait(min(remaining, 0.02))

    def after_fork_in_parent(self) -> None:
        with self._cond:
            self._forking = False
            self._cond.notify_all()


#: How long a fork may wait for the bridge's exports in flight (a reachable collector answers in milliseconds).
FORK_WAIT_MILLIS = _env_millis("TORCHELASTIC_OTEL_FORK_WAIT_MILLIS", 1000)
_fork_gate = _ForkGate()


def _shutdown_inner(inner: Any, pid: int, timeout_millis: float | None, kwargs: dict[str, Any]) -> Any:
    if os.getpid() != pid:
        return None  # the parent's exporter (and its connection) stays the parent's
    shutdown = inner.shutdown
    try:
        accepts = "timeout_millis" in inspect.signature(shutdown).parameters
    except (TypeError, ValueError):
        accepts = False
    if accepts and timeout_millis is not None:
        return shutdown(timeout_millis=timeout_millis, **kwargs)
    return shutdown(**kwargs) if kwargs else shutdown()


class _CountingExporter:
    """Delegates everything to a span or log record exporter; counts the items of a failed export as dropped
    (``torchelastic_otel.dropped`` ``{signal, reason="export_failed"}``) and tells the flush when exports are stuck."""

    def __init__(self, signal: str, inner: Any) -> None:
        self._signal, self._inner, self._health, self._pid = signal, inner, _health, os.getpid()

    def export(self, batch: Any) -> Any:
        return _exporting(self._signal, self._health, self._pid, len(batch), lambda: self._inner.export(batch))

    def shutdown(self, timeout_millis: float | None = None, **kwargs: Any) -> Any:
        return _shutdown_inner(self._inner, self._pid, timeout_millis, kwargs)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis) if os.getpid() == self._pid else True

    def __getattr__(self, name: str) -> Any:
        if name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)

    def __repr__(self) -> str:
        return f"<counting {self._inner!r}>"


class _CountingMetricExporter(_CountingExporter):
    """The same for a metric exporter (a failed export counts its data points); it keeps the exporter's preferred
    temporality and aggregation, which ``PeriodicExportingMetricReader`` reads."""

    def __init__(self, inner: Any) -> None:
        super().__init__("metrics", inner)
        self._preferred_temporality = getattr(inner, "_preferred_temporality", None)
        self._preferred_aggregation = getattr(inner, "_preferred_aggregation", None)

    def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:  # type: ignore[override]
        return _exporting(
            "metrics",
            self._health,
            self._pid,
            _count_points(metrics_data),
            lambda: self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs),
        )

    def force_flush(self, timeout_millis: float = 10_000) -> bool:  # type: ignore[override]
        return self._inner.force_flush(timeout_millis=timeout_millis) if os.getpid() == self._pid else True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:  # type: ignore[override]
        if os.getpid() == self._pid:
            self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def _count_points(metrics_data: Any) -> int:
    try:
        return sum(
            len(metric.data.data_points)
            for resource_metrics in metrics_data.resource_metrics
            for scope_metrics in resource_metrics.scope_metrics
            for metric in scope_metrics.metrics
        )
    except Exception:
        return 0


def _wrap_exporter(signal: str, exporter: Any) -> Any:
    """A span/log/metric exporter wrapped to count failed exports; anything else (a metric reader) as it is."""
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader

    if isinstance(exporter, MetricReader):
        return exporter
    _watch_retries(exporter)
    if isinstance(exporter, MetricExporter):
        return _CountingMetricExporter(exporter)
    if callable(getattr(exporter, "export", None)):
        return _CountingExporter(signal, exporter)
    return exporter


#: Total time the exit paths (end of an agent run, SIGTERM or an uncaught exception in a worker, interpreter exit)
#: may spend delivering what is left; a dead backend must not hold the job up.
EXIT_TIMEOUT_MILLIS = int(os.environ.get("TORCHELASTIC_OTEL_EXIT_TIMEOUT_MILLIS", "1000"))


_lock = threading.RLock()
_pipeline: Pipeline | None = None
_flush_hooks: list[Callable[[], None]] = []


def add_flush_hook(hook: Callable[[float | None], Any]) -> None:
    """Run ``hook(deadline)`` before every flush: the adapters drain their buffers into the SDK there, until
    ``deadline`` (a ``time.monotonic()`` value; ``None``: no limit)."""
    _flush_hooks.append(hook)


_exit_hooks: list[Callable[[str], Any]] = []


def add_exit_hook(hook: Callable[[str], Any]) -> None:
    """Run ``hook(reason)`` once the exit handler is done: what is still buffered then is counted as dropped."""
    _exit_hooks.append(hook)


def _run_flush_hooks(deadline: float | None = None) -> None:
    for hook in list(_flush_hooks):
        try:
            hook(deadline)
        except Exception:  # pragma: no cover - a hook must not stop the flush
            _logger.debug("flush hook failed", exc_info=True)
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
    """Instantiate one exporter/reader; a failure is logged and counted instead of losing the whole pipeline.

    Exporters come back wrapped (``_wrap_exporter``): a failed export is counted as dropped, ``export_failed``.
    """
    try:
        with _prometheus_port_for_this_process(cls):
            return _wrap_exporter(signal, cls())
    except Exception as exc:
        _selftelemetry.count(_selftelemetry.DROPPED, signal, f"exporter_unavailable:{name}")
        _logger.warning("torchelastic_otel: %s exporter %r could not start: %s", signal, name, exc)
        return None


class _prometheus_port_for_this_process:
    """Give each worker of a node its own Prometheus port: ``OTEL_EXPORTER_PROMETHEUS_PORT + 1 + LOCAL_RANK``.

    The agent (no ``LOCAL_RANK``) keeps the base port (default 9464). Without this, the second worker on a node
    dies binding the same port and loses its whole pipeline. ``TORCHELASTIC_OTEL_PROMETHEUS_PORT_OFFSET=0``
    turns the offset off (for one worker per container).

    The host defaults to ``127.0.0.1`` when ``OTEL_EXPORTER_PROMETHEUS_HOST`` is unset: the exporter's own default,
    ``localhost``, is resolved by name (``/etc/hosts``, DNS search domains), so it is not guaranteed to be a
    loopback address. Set ``OTEL_EXPORTER_PROMETHEUS_HOST=0.0.0.0`` to serve other hosts.
    """

    def __init__(self, cls: type) -> None:
        self._prometheus = "prometheus" in getattr(cls, "__module__", "")
        self._active = self._prometheus and "LOCAL_RANK" in os.environ
        self._saved: str | None = None
        self._host_defaulted = False

    def __enter__(self) -> None:
        if self._prometheus and not os.environ.get("OTEL_EXPORTER_PROMETHEUS_HOST"):
            os.environ["OTEL_EXPORTER_PROMETHEUS_HOST"] = "127.0.0.1"
            self._host_defaulted = True
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
        if self._host_defaulted:
            os.environ.pop("OTEL_EXPORTER_PROMETHEUS_HOST", None)
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
            provider.add_span_processor(_counting_batch_processor(BatchSpanProcessor, "traces")(exporter))
    return provider


def _build_meter_provider(resource: Any, pull: bool = True) -> Any:
    """The meter provider; ``pull=False`` leaves out pull exporters (Prometheus: a forked child's parent serves)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader

    readers = []
    for name, cls in _exporter_classes("metrics").items():
        if not pull and "prometheus" in getattr(cls, "__module__", ""):
            continue
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
            provider.add_log_record_processor(_counting_batch_processor(BatchLogRecordProcessor, "logs")(exporter))
    return provider


_processor_classes: dict[str, type] = {}


def _queue_full(processor: Any) -> bool:
    """Whether the SDK batch processor's queue (``OTEL_BLRP_MAX_QUEUE_SIZE`` / ``OTEL_BSP_MAX_QUEUE_SIZE``, default
    2048) is full or shut down, i.e. it would drop the item (full: the SDK drops the oldest one and logs a warning
    for every item). Reads the SDK's internal ``BatchProcessor``; ``False`` if its layout is unknown."""
    batch = getattr(processor, "_batch_processor", None)
    queue = getattr(batch, "_queue", None)
    limit = getattr(batch, "_max_queue_size", None)
    if queue is None or not isinstance(limit, int):
        return False
    return len(queue) >= limit or getattr(batch, "_shutdown", False) is True


def _counting_batch_processor(base: type, signal: str) -> type:
    """``base`` (the SDK's BatchSpanProcessor / BatchLogRecordProcessor) counting what its full queue drops.

    When the queue is full (the backend is slow or down), the new item is dropped -- as the bridge's own buffers
    do -- and counted as ``torchelastic_otel.dropped {signal, reason="queue_full"}`` (``"after_shutdown"`` once the
    processor is shut down) instead of the SDK's warning per dropped item.
    """
    cls = _processor_classes.get(signal)
    if cls is not None:
        return cls
    method = "on_end" if signal == "traces" else "on_emit"

    def accept(self: Any, item: Any) -> Any:
        if _queue_full(self):
            if signal == "traces" and not (item.context and item.context.trace_flags.sampled):
                return None  # not exported anyway
            shut = getattr(self._batch_processor, "_shutdown", False) is True
            _selftelemetry.count(_selftelemetry.DROPPED, signal, "after_shutdown" if shut else "queue_full")
            return None
        return getattr(base, method)(self, item)

    cls = type(f"_Counting{base.__name__}", (base,), {method: accept, "__doc__": _counting_batch_processor.__doc__})
    _processor_classes[signal] = cls
    return cls


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
    deadline = time.monotonic() + EXIT_TIMEOUT_MILLIS / 1000
    if _fork_pending and not _settle_fork(deadline):
        return  # a forked child that recorded nothing: nothing of its own to deliver
    current = _pipeline
    if current is not None:
        current.shutdown(max(0, int((deadline - time.monotonic()) * 1000)))
    for hook in list(_exit_hooks):  # what could not be drained in time is lost: counted
        try:
            hook("exit_timeout")
        except Exception:
            _logger.debug("exit hook failed", exc_info=True)


def _register_atexit() -> None:
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(_at_exit)
        _atexit_registered = True


def get_pipeline() -> Pipeline:
    """The pipeline the bridge exports to, created from ``OTEL_*`` on first use."""
    global _pipeline, _fork_pending
    current = _pipeline
    if current is not None and not _fork_pending:
        return current
    with _lock:
        if _fork_pending and _pipeline is not None:
            try:
                _pipeline = _rebuild_in_child(_pipeline)
            except Exception as exc:  # the job must go on: export nothing from this child
                _logger.warning("torchelastic_otel: could not set up telemetry in a forked child: %s", exc)
                _selftelemetry.count(_selftelemetry.DROPPED, "all", "pipeline_unavailable")
                _pipeline = _noop_pipeline()
            _fork_pending = False
            _generation[0] += 1
            _selftelemetry.instrument(_pipeline.meter_provider)
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
    global _pipeline, _fork_pending
    with _lock:
        if _fork_pending:
            get_pipeline()  # a forked child: the bridge's own providers first become the child's
        _fork_pending = False
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
    if _fork_pending and not _settle_fork(time.monotonic() + max(0, timeout_millis) / 2000):
        return True  # a forked child that recorded nothing yet
    current = _pipeline
    return current.flush(timeout_millis) if current is not None else True


def shutdown() -> None:
    """Flush and shut down the providers the bridge built; the next event builds a fresh pipeline."""
    global _pipeline, _fork_pending
    if _fork_pending:
        _settle_fork()
    with _lock:
        current, _pipeline = _pipeline, None
        _fork_pending = False
        _generation[0] += 1
    if current is not None:
        current.shutdown()


# ---- fork ------------------------------------------------------------------------------------------------------

#: In a forked child: the pipeline is still the parent's copy until the child first uses the bridge (or a global
#: provider the bridge built), which rebuilds it (``_rebuild_in_child``).
_fork_pending = False

_GLOBALS = {
    "traces": ("opentelemetry.trace", "_TRACER_PROVIDER"),
    "metrics": ("opentelemetry.metrics._internal", "_METER_PROVIDER"),
    "logs": ("opentelemetry._logs._internal", "_LOGGER_PROVIDER"),
}


def _replace_global(signal: str, old: Any, new: Any) -> bool:
    """Make ``new`` the global provider of ``signal`` where ``old`` is.

    The API sets a global provider once per process, and a forked child inherits its parent's; the bridge only
    replaces the providers it built itself. It uses the API's module globals; ``False`` if they are not there.
    """
    module_name, attribute = _GLOBALS[signal]
    module = sys.modules.get(module_name)
    if module is None or getattr(module, attribute, None) is not old:
        return False
    setattr(module, attribute, new)
    return True


class _RebuildOnUse:
    """Stands in, in a forked child, for a global provider the bridge built: the first use (``get_tracer``,
    ``get_meter``, ``get_logger``...) rebuilds the bridge's pipeline for the child and goes to the new provider."""

    def __init__(self, signal: str, parent_provider: Any) -> None:
        self._signal = signal
        self._parent_provider = parent_provider

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_signal", "_parent_provider"):
            raise AttributeError(name)
        pipe = get_pipeline()
        provider = {"traces": pipe.tracer_provider, "metrics": pipe.meter_provider, "logs": pipe.logger_provider}
        return getattr(provider[self._signal], name)


def _rebuild_in_child(current: Pipeline) -> Pipeline:
    """Fresh providers, exporters and resource (``process.pid``) in a forked child for what the bridge built.

    The parent's providers were copied by ``fork``: their metric storage holds the parent's cumulative values (the
    child would export them again, as its own), their resource names the parent's pid, and their exporters'
    connections are the parent's. In the child their exporters do nothing (``_exporting``); tracers, meters and
    loggers obtained from them before the fork stay theirs, so a child gets its own after the fork. Prometheus
    readers are not rebuilt: the parent serves that port.
    """
    resource = _resource()
    providers = {"traces": current.tracer_provider, "metrics": current.meter_provider, "logs": current.logger_provider}
    builders: dict[str, Callable[[], Any]] = {
        "traces": lambda: _build_tracer_provider(resource),
        "metrics": lambda: _build_meter_provider(resource, pull=False),
        "logs": lambda: _build_logger_provider(resource),
    }
    owned = dict(current.owned)
    for signal, old in list(providers.items()):
        if not owned.get(signal):
            continue
        module_name, attribute = _GLOBALS[signal]
        placeholder = getattr(sys.modules.get(module_name), attribute, None)
        if not (isinstance(placeholder, _RebuildOnUse) and placeholder._parent_provider is old):
            owned[signal] = False  # no longer the global provider: leave it alone
            continue
        new = builders[signal]()
        _replace_global(signal, placeholder, new)
        providers[signal] = new
    return Pipeline(providers["traces"], providers["metrics"], providers["logs"], owned=owned)


def _settle_fork(deadline: float | None = None) -> bool:
    """In a forked child: drain the buffers (recording something rebuilds the pipeline); ``True`` if the child
    has its own pipeline now."""
    _run_flush_hooks(deadline)
    return not _fork_pending


class _ForkToken:
    """Kept alive for ``multiprocessing.util.register_after_fork`` (which holds its object weakly)."""


_fork_token = _ForkToken()
_multiprocessing_hooked = False


def _flush_at_multiprocessing_exit() -> None:
    """A ``multiprocessing`` child started by fork ends with ``os._exit``, which skips ``atexit``: have its
    ``Process._bootstrap`` exit path (the ``multiprocessing.util`` finalizers) run the bridge's exit handler."""
    global _multiprocessing_hooked
    util = sys.modules.get("multiprocessing.util")
    if util is None or _multiprocessing_hooked:
        return
    _multiprocessing_hooked = True  # inherited by this process's children, as is the registration below

    def register(_token: Any) -> None:
        util.Finalize(None, _at_exit, exitpriority=0)

    util.register_after_fork(_fork_token, register)


def _after_fork_in_child() -> None:
    """A forked child exports its own telemetry, never its parent's again.

    The buffers are cleared by ``_drainer`` and the counters by ``_selftelemetry``. Here the providers the bridge
    built are marked for a rebuild on first use (``_rebuild_in_child``): nothing is built in this hook, where other
    modules' fork handlers have not run yet, and a child that records nothing (a DataLoader worker) builds nothing.
    Providers the application set or gave to ``setup()`` are the application's to handle.
    """
    global _lock, _health, _fork_pending, _fork_gate
    _lock = threading.RLock()
    _health = _ExportHealth()
    _fork_gate = _ForkGate()
    current = _pipeline
    if current is None or not any(current.owned.values()):
        return
    providers = {"traces": current.tracer_provider, "metrics": current.meter_provider, "logs": current.logger_provider}
    for signal, provider in providers.items():
        if current.owned.get(signal):
            _replace_global(signal, provider, _RebuildOnUse(signal, provider))
    _fork_pending = True
    _generation[0] += 1
    _flush_at_multiprocessing_exit()


def _before_fork() -> None:
    _fork_gate.before_fork()


def _after_fork_in_parent() -> None:
    _fork_gate.after_fork_in_parent()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


def _reset_for_tests() -> None:
    """Forget the pipeline without touching providers (tests install their own)."""
    global _pipeline, _fork_pending
    with _lock:
        _pipeline = None
        _fork_pending = False
        _generation[0] += 1
