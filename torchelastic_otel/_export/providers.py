"""The providers the bridge builds from ``OTEL_*`` (or ``OTEL_CONFIG_FILE``), with the SDK's own configuration code.

With ``OTEL_CONFIG_FILE`` set, ``opentelemetry-configuration`` builds them from the file (``_export.config_file``)
and they are made the bridge's (``_adopt``: the bounded classes below, counting batch processors, the torchrun
attributes under the file's resource); the rest of this module is the ``OTEL_*`` route.

Exporter names and the OTLP protocol per signal, sampler and id generator come from
``opentelemetry.sdk._configuration`` (through ``_compat``); the resource from ``Resource.create`` plus torchrun's
environment. One exporter that cannot be loaded or started is skipped (logged, counted), never the whole pipeline.
Each worker of a node gets its own Prometheus port.

The providers are the SDK's, made to return in time (``_Bounded``): a user's own ``force_flush()`` or
``shutdown()`` through the plain OpenTelemetry API on a global provider the bridge built returns within
``TORCHELASTIC_OTEL_EXIT_TIMEOUT_MILLIS`` when the collector is down, and what a shutdown could not deliver is
counted (``shutdown_timeout``). An application's own providers are never touched.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torchelastic_otel import _compat, _settings
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._export import bounded as _bounded
from torchelastic_otel._export import counting, ports
from torchelastic_otel._export import health as _health

_logger = logging.getLogger("torchelastic_otel")

DEFAULT_SERVICE_NAME = "torchelastic"
_DEFAULT_EXPORTER = "otlp"
SIGNAL_ENV = {
    "traces": "OTEL_TRACES_EXPORTER",
    "metrics": "OTEL_METRICS_EXPORTER",
    "logs": "OTEL_LOGS_EXPORTER",
}


@dataclass
class _Parts:
    """What the bridge made or adopted for one of its providers: the batch processors (traces, logs) and the metric
    readers (metrics) behind it."""

    processors: list[object] = field(default_factory=list)
    readers: list[Any] = field(default_factory=list)


#: The parts of each provider the bridge built, kept beside it (the SDK's objects carry nothing of the bridge's).
_parts: weakref.WeakKeyDictionary[object, _Parts] = weakref.WeakKeyDictionary()


def _parts_of(provider: object) -> _Parts:
    parts = _parts.get(provider)
    if parts is None:
        parts = _parts[provider] = _Parts()
    return parts


def processors(provider: object) -> list[Any]:
    """The batch processors behind a provider the bridge built (traces, logs); ``[]`` for any other provider."""
    parts = _parts.get(provider)
    return parts.processors if parts is not None else []


def readers(provider: object) -> list[Any]:
    """The metric readers behind a meter provider the bridge built; ``[]`` for any other provider."""
    parts = _parts.get(provider)
    return parts.readers if parts is not None else []


def from_file() -> bool:
    """Whether this process's providers come from ``OTEL_CONFIG_FILE`` (``_export.config_file``)."""
    return bool(os.environ.get("OTEL_CONFIG_FILE", "").strip())


def resource() -> Any:
    """``Resource.create`` (env detectors, ``OTEL_RESOURCE_ATTRIBUTES``) with ``service.name`` defaulting to ours;
    with ``OTEL_CONFIG_FILE``, the file's resource. Either over the torchrun attributes."""
    if from_file():
        from torchelastic_otel._export import config_file
        from torchelastic_otel.resource import torchrun_attributes

        return config_file.resource(DEFAULT_SERVICE_NAME, torchrun_attributes())
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    resource = Resource.create()
    if not os.environ.get("OTEL_SERVICE_NAME") and str(resource.attributes.get(SERVICE_NAME, "")).startswith(
        "unknown_service"
    ):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    from torchelastic_otel.resource import torchrun_attributes

    # Attributes from torchrun's environment first, so an explicit OTEL_RESOURCE_ATTRIBUTES still wins.
    return Resource(torchrun_attributes()).merge(resource)


def exporter_classes(signal: str) -> dict[str, type]:
    """Exporter classes named by ``OTEL_{signal}_EXPORTER`` (default ``otlp``), resolved by the SDK's entry points.

    Each name is resolved on its own (the SDK's ``_get_exporter_entry_point`` picks the OTLP protocol per signal):
    one that cannot be (an unknown exporter, an invalid ``OTEL_EXPORTER_OTLP_*PROTOCOL``) is skipped with a warning
    and counted, so it costs neither the signal's other exporters nor the other signals.
    """
    names = os.environ.get(SIGNAL_ENV[signal], _DEFAULT_EXPORTER)
    if not names or names.strip().lower() == "none":
        return {}
    classes: dict[str, type] = {}
    for requested in names.split(","):
        requested = requested.strip()
        if not requested:
            continue
        try:
            classes.update(_compat.sdk_exporter_classes(signal, requested))
        except Exception as exc:
            selftelemetry.count(selftelemetry.DROPPED, signal, f"exporter_unavailable:{requested}")
            _logger.warning("torchelastic_otel: %s exporter %r is not available: %s", signal, requested, exc)
    return classes


def construct(signal: str, name: str, cls: type) -> Any | None:
    """Instantiate one exporter/reader; a failure is logged and counted instead of losing the whole pipeline.

    Exporters come back wrapped (``counting.wrap_exporter``): a failed export is counted as dropped
    (``export_failed``).
    """
    try:
        with _prometheus_port_for_this_process(cls):
            return counting.wrap_exporter(signal, cls(**_file_exporter_args(signal, cls)))
    except Exception as exc:
        selftelemetry.count(selftelemetry.DROPPED, signal, f"exporter_unavailable:{name}")
        _logger.warning("torchelastic_otel: %s exporter %r could not start: %s", signal, name, exc)
        return None


FILE_DIR_ENV = _settings.FILE_DIR.name


def _file_exporter_args(signal: str, cls: type) -> dict[str, object]:
    """``path=<TORCHELASTIC_OTEL_FILE_DIR>/<signal>-<process>.jsonl`` for the OTLP JSON Lines file exporter.

    Built by name (``otlp_json_file``), that exporter writes to stdout, where torchrun mixes every process's lines
    with the job's own output. One file per process and signal instead (the specification wants one signal per
    file), named by host, rank, restart and pid: processes never append to the same file, so a line can never be
    torn by another writer, and ``torchelastic-otel report DIR`` reads them all.
    """
    directory = _settings.FILE_DIR.get()
    if not directory or ".otlp.json.file" not in getattr(cls, "__module__", ""):
        return {}
    import socket

    rank = os.environ.get("RANK")
    who = f"rank{rank}-restart{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}" if rank else "agent"
    os.makedirs(directory, exist_ok=True)
    return {"path": os.path.join(directory, f"{signal}-{socket.gethostname()}-{who}-{os.getpid()}.jsonl")}


class _prometheus_port_for_this_process:
    """Give each worker of a node its own Prometheus port while its exporter is made (``_export.ports``: the base
    port ``OTEL_EXPORTER_PROMETHEUS_PORT`` + 1 + ``LOCAL_RANK``); the environment is put back afterwards.

    The host defaults to ``127.0.0.1`` when ``OTEL_EXPORTER_PROMETHEUS_HOST`` is unset: the exporter's own default,
    ``localhost``, is resolved by name (``/etc/hosts``, DNS search domains), so it is not guaranteed to be a
    loopback address. Set ``OTEL_EXPORTER_PROMETHEUS_HOST=0.0.0.0`` to serve other hosts.
    """

    def __init__(self, cls: type) -> None:
        self._prometheus = "prometheus" in getattr(cls, "__module__", "")
        self._active = False
        self._saved: str | None = None
        self._host_defaulted = False

    def __enter__(self) -> None:
        if not self._prometheus:
            return
        if not os.environ.get("OTEL_EXPORTER_PROMETHEUS_HOST"):
            os.environ["OTEL_EXPORTER_PROMETHEUS_HOST"] = "127.0.0.1"
            self._host_defaulted = True
        if not ports.offset():
            return
        self._active = True
        self._saved = os.environ.get("OTEL_EXPORTER_PROMETHEUS_PORT")
        os.environ["OTEL_EXPORTER_PROMETHEUS_PORT"] = str(ports.port(int(self._saved) if self._saved else None))

    def __exit__(self, *exc: object) -> None:
        if self._host_defaulted:
            os.environ.pop("OTEL_EXPORTER_PROMETHEUS_HOST", None)
        if not self._active:
            return
        if self._saved is None:
            os.environ.pop("OTEL_EXPORTER_PROMETHEUS_PORT", None)
        else:
            os.environ["OTEL_EXPORTER_PROMETHEUS_PORT"] = self._saved


def _or_default(variable: str, load: Callable[[], object]) -> object:
    """A component named by ``variable``, or ``None`` (the SDK default) when it cannot be loaded."""
    try:
        return load()
    except Exception as exc:
        _logger.warning("torchelastic_otel: ignoring %s (%s); using the SDK default", variable, exc)
        selftelemetry.count(selftelemetry.SANITIZED, "traces", f"invalid_{variable.lower()}")
        return None


def _from_file(signal: str, resource: object, pull: bool = True) -> object:
    """The provider of ``signal`` that ``OTEL_CONFIG_FILE`` configures, made the bridge's own (:func:`_adopt`)."""
    from torchelastic_otel._export import config_file

    return _adopt(config_file.create(signal, resource, pull), signal)


def _adopt(provider: Any, signal: str) -> object:
    """Make an SDK provider built elsewhere (``opentelemetry-configuration``) one of the bridge's: its flush and
    shutdown bounded (``_Bounded``; its own exit handler taken off, the bridge's exit handler shuts it down in
    time), its batch processors counting what a full queue drops and what a shutdown leaves behind."""
    import atexit

    atexit.unregister(provider.shutdown)  # the SDK's handler: unbounded, and a second shutdown at exit
    # The same state in an instance of the bounded class (the SDK classes' layout refuses a __class__ assignment
    # to a subclass with the mixin first): the providers keep nothing that points back to themselves.
    original, provider = provider, object.__new__(_bounded_class(type(provider), signal))
    provider.__dict__.update(vars(original))
    if signal == "metrics":
        _parts[provider] = _Parts(readers=_compat.metric_readers(provider) or [])
        return provider
    batch = _compat.provider_processors(provider, signal)
    for processor in batch:
        base = type(processor)
        if base.__name__ in ("BatchSpanProcessor", "BatchLogRecordProcessor"):
            processor.__class__ = counting.counting_batch_processor(base, signal)
    _parts[provider] = _Parts(processors=batch)
    return provider


def build_tracer_provider(resource: object) -> object:
    if from_file():
        return _from_file("traces", resource)
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = _bounded_class(TracerProvider, "traces")(
        shutdown_on_exit=False,  # the bridge's exit handler shuts it down, within a time bound
        resource=resource,
        sampler=_or_default("OTEL_TRACES_SAMPLER", _compat.sdk_sampler),
        id_generator=_or_default("OTEL_PYTHON_ID_GENERATOR", _compat.sdk_id_generator),
    )
    return _batched(provider, "traces", BatchSpanProcessor, provider.add_span_processor)


def _batched(provider: object, signal: str, batch_class: type, add: Callable[[object], object]) -> object:
    """``provider`` with a counting batch processor (``batch_class``'s) for each exporter of ``signal``, each
    added by ``add`` (the SDK's ``add_span_processor`` / ``add_log_record_processor``)."""
    for name, cls in exporter_classes(signal).items():
        exporter = construct(signal, name, cls)
        if exporter is not None:
            processor = counting.counting_batch_processor(batch_class, signal)(exporter)
            add(processor)
            _parts_of(provider).processors.append(processor)
    return provider


def build_meter_provider(resource: object, pull: bool = True) -> Any:
    """The meter provider; ``pull=False`` leaves out pull exporters (Prometheus: a forked child's parent serves)."""
    if from_file():
        return _from_file("metrics", resource, pull)
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader

    made_readers = []
    for name, cls in exporter_classes("metrics").items():
        if not pull and "prometheus" in getattr(cls, "__module__", ""):
            continue
        made = construct("metrics", name, cls)
        if made is None:
            continue
        made_readers.append(made if isinstance(made, MetricReader) else PeriodicExportingMetricReader(made))
    provider = _bounded_class(MeterProvider, "metrics")(
        resource=resource, metric_readers=made_readers, shutdown_on_exit=False
    )
    _parts_of(provider).readers = made_readers
    return provider


def build_logger_provider(resource: object) -> Any:
    if from_file():
        return _from_file("logs", resource)
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor

    provider = _bounded_class(LoggerProvider, "logs")(resource=resource, shutdown_on_exit=False)
    return _batched(provider, "logs", BatchLogRecordProcessor, provider.add_log_record_processor)


def with_resource(provider: Any, signal: str, attributes: dict[str, Any]) -> Any:
    """A provider like ``provider`` (traces or logs) whose telemetry carries another process's resource: a
    worker's, for what its agent sends for it (``_torch.final_words``). Its resource is ``provider``'s less the
    ``process.*`` attributes, with ``attributes`` (the worker's torchrun attributes and pid) over it. It shares the
    processors of ``provider``, so what it makes leaves in the same batches through the same exporters, and it is
    never shut down itself. ``provider`` itself where the bridge did not build it (an application's processors are
    the application's), or where this fails (counted)."""
    shared = processors(provider)
    if not attributes or not shared:
        return provider
    try:
        from opentelemetry.sdk.resources import Resource

        own = getattr(provider, "resource", None)  # a TracerProvider's; a LoggerProvider's loggers carry it
        if own is None:
            own = provider.get_logger("torchelastic_otel").resource
        base = {k: v for k, v in own.attributes.items() if not str(k).startswith("process.")}
        resource = Resource({**base, **attributes})
        if signal == "traces":
            from opentelemetry.sdk.trace import TracerProvider

            tracers = TracerProvider(
                resource=resource,
                shutdown_on_exit=False,
                sampler=getattr(provider, "sampler", None),
                id_generator=getattr(provider, "id_generator", None),
            )
            for processor in shared:
                tracers.add_span_processor(processor)
            return tracers
        from opentelemetry.sdk._logs import LoggerProvider

        loggers = LoggerProvider(resource=resource, shutdown_on_exit=False)
        for processor in shared:
            loggers.add_log_record_processor(processor)
        return loggers
    except Exception:
        selftelemetry.count(selftelemetry.SANITIZED, signal, "worker_resource_unavailable")
        _logger.debug("torchelastic_otel: a worker's resource could not be used", exc_info=True)
        return provider


class _Bounded:
    """Mixed into the SDK's provider classes for the providers the bridge builds: ``force_flush`` and ``shutdown``
    return in time (``_export.bounded.bounded_flush``) whoever calls them -- the bridge's exit paths or user code
    through the plain API -- and a shutdown counts what it leaves undelivered."""

    _torchelastic_signal = "all"
    _torchelastic_flush_default = 30_000

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        _parts_of(self)

    def force_flush(self, timeout_millis: object = None) -> bool:
        return _bounded.bounded_flush(
            self.force_flush_unbounded, _bounded.user_timeout(timeout_millis, self._torchelastic_flush_default)
        )

    def force_flush_unbounded(self) -> bool:
        """The SDK's own ``force_flush`` (in the caller's thread, for as long as the exporters take)."""
        return super().force_flush() is not False  # type: ignore[misc]  # a mixin: super() is the SDK's provider

    def shutdown(self, *args: object, **kwargs: object) -> object:
        """Flush (bounded), then the SDK's shutdown, within the exit bound once the backend is down; what the
        batch queues and the exports in flight still held then is counted as dropped (``shutdown_timeout``)."""
        with _bounded.shutting_down():
            self.force_flush()
            timeout = _settings.DOWN_WAIT_MILLIS if _bounded.backend_down() else _settings.EXIT_TIMEOUT_MILLIS
            # A mixin: super() is the SDK's provider class, which the type checker cannot see from here.
            done = _bounded.run_bounded(lambda: super(_Bounded, self).shutdown(*args, **kwargs) or True, timeout)  # type: ignore[misc]
        if done is None:
            lost = sum(counting.pending(p) for p in processors(self))
            lost += _health.health.in_flight().get(self._torchelastic_signal, 0)
            if lost:
                selftelemetry.count(selftelemetry.DROPPED, self._torchelastic_signal, "shutdown_timeout", lost)
        return None


class _BoundedMeterProvider(_Bounded):
    _torchelastic_flush_default = 10_000

    def force_flush_unbounded(self) -> bool:
        """Collect and export the push readers only: collecting a pull reader (Prometheus) out of turn queues a
        snapshot that its next scrape serves first, with every metric family twice (opentelemetry-python#2500);
        a scrape drains the bridge's buffers itself."""
        ok = True
        for reader in readers(self):
            if is_pull_reader(reader):
                continue
            try:
                ok = reader.force_flush() is not False and ok
            except Exception:
                ok = False
                _logger.debug("force_flush of %s failed", type(reader).__name__, exc_info=True)
        return ok


#: Readers that only the application reads (a scrape, ``get_metrics_data()``), each by collecting itself: a flush
#: that collects them throws a collection away -- its delta points, and on SDKs before 1.45 every synchronous
#: gauge's value, which those report in one collection only.
_PULL_READERS = ("PrometheusMetricReader", "InMemoryMetricReader")


def is_pull_reader(reader: object) -> bool:
    return any(cls.__name__ in _PULL_READERS for cls in type(reader).__mro__)


_bounded_classes: dict[tuple[str, type], type] = {}


def _bounded_class(base: type, signal: str) -> type:
    if issubclass(base, _Bounded):
        return base
    cls = _bounded_classes.get((signal, base))
    if cls is None:
        mixin = _BoundedMeterProvider if signal == "metrics" else _Bounded
        cls = type(f"Bounded{base.__name__}", (mixin, base), {"_torchelastic_signal": signal, "__module__": __name__})
        _bounded_classes[(signal, base)] = cls
    return cls
