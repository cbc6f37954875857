"""``OTEL_CONFIG_FILE``: the providers of a process built from an OpenTelemetry declarative configuration file.

Platform teams hand every process the same file (YAML or JSON, schema 1.x). Where it is set, the bridge builds the
agent's and every worker's providers from it, through ``opentelemetry-configuration`` (the SDK's own
implementation: parsing, schema validation, ``${ENV_VAR}`` substitution, exporters, processors, sampler, views,
resource), and the ``OTEL_*`` variables the file covers are ignored, as the specification says. What the bridge
adds is its own (``_export.providers``): the torchrun attributes on the resource, the bounded flush and shutdown
(``_export.bounded``), each worker's own Prometheus port.

Nothing here is imported unless the variable is set: a YAML parser, ``jsonschema`` and the configuration models
lengthen a worker's start-up (docs/performance.md), which a job that does not use the file must not pay.

A file that cannot be read, parsed or validated is one error line on the agent's stderr (naming the file and
the fault) and no telemetry: ``install()`` leaves the job as plain torchrun (``refused``). A worker that meets
one (the file changed after its agent checked it) exports nothing and counts it; it prints nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
from typing import Any

from torchelastic_otel import _compat
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._export import ports

__all__ = ["ENV", "ConfigFileError", "path", "load", "refused", "resource", "create"]

_logger = logging.getLogger("torchelastic_otel")

ENV = "OTEL_CONFIG_FILE"
#: The longest fault a report line carries (a schema error can quote a whole section).
_MAX_FAULT = 400


class ConfigFileError(Exception):
    """The file could not be read, parsed or validated (the message names the file and the fault). ``reported``:
    the one line about it went out already (the pipeline's build does not log it again)."""

    reported = True


def path() -> str | None:
    """The configuration file's path; ``None`` where ``OTEL_CONFIG_FILE`` is unset or blank."""
    value = os.environ.get(ENV, "").strip()
    return value or None


_lock = threading.Lock()
#: (path, environment) -> the parsed model or its error: one build reads the file once, not once per signal; a
#: changed environment (``${VAR}`` substitution) reads it again.
_loaded: dict[tuple[str, int], object] = {}
_told: set[str] = set()


def _key(where: str) -> tuple[str, int]:
    return where, hash(frozenset(os.environ.items()))


def load() -> Any:
    """The parsed, validated configuration (``OpenTelemetryConfiguration``). Raises :class:`ConfigFileError`
    (reported once per process) where it cannot be had."""
    where = path()
    if where is None:
        raise ConfigFileError(f"{ENV} is not set")
    key = _key(where)
    with _lock:
        found = _loaded.get(key)
        if found is None:
            found = _loaded[key] = _parse(where)
    if isinstance(found, ConfigFileError):
        _report(found)
        raise found
    return found


def _parse(where: str) -> object:
    try:
        import opentelemetry.configuration  # noqa: F401
    except ImportError as exc:
        return ConfigFileError(f"{ENV}={where}: opentelemetry-configuration is not installed ({exc})")
    quiet = _Quiet()
    loader_logger = logging.getLogger(_LOADER_LOGGER)
    loader_logger.addFilter(quiet)
    try:
        return _compat.declarative_load(where)
    except Exception as exc:  # ConfigurationError, or whatever a broken file makes the loader raise
        return ConfigFileError(f"{ENV}={where}: {fault(exc)}")
    finally:
        loader_logger.removeFilter(quiet)


#: The loader logs a broken file with its traceback before it raises; the bridge says it in one line instead.
_LOADER_LOGGER = "opentelemetry.configuration.file._loader"


class _Quiet(logging.Filter):
    """Drops the loader's error records of this thread while it loads (other threads' records pass)."""

    def __init__(self) -> None:
        super().__init__()
        self._thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR or threading.get_ident() != self._thread


def fault(exc: BaseException) -> str:
    """What went wrong, on one line, short."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= _MAX_FAULT else text[: _MAX_FAULT - 3] + "..."


def _report(error: ConfigFileError) -> None:
    """The one line about a broken file: on stderr in the agent (or any process that is no torchrun worker or
    descendant, where the user looks), counted and logged at debug level in a worker (its agent said it)."""
    message = str(error)
    with _lock:
        if message in _told:
            return
        _told.add(message)
    selftelemetry.count(selftelemetry.SANITIZED, "all", "config_file_invalid")
    if os.environ.get("RANK") is not None and os.environ.get("TORCHELASTIC_RUN_ID") is not None:
        _logger.debug("torchelastic_otel: %s", message)
        return
    try:
        sys.stderr.write(f"torchelastic_otel: error: {message}; telemetry is off\n")
        sys.stderr.flush()
    except Exception:
        pass


def refused() -> bool:
    """Whether ``OTEL_CONFIG_FILE`` is set and cannot be used (reported): the bridge then stays out of the job."""
    if path() is None:
        return False
    try:
        load()
    except ConfigFileError:
        return True
    return False


def resource(default_service_name: str, extra: dict[str, Any]) -> object:
    """The file's resource (``create_resource``: no ``OTEL_RESOURCE_ATTRIBUTES``, detectors only if listed) over
    ``extra`` (the torchrun attributes), ``service.name`` defaulting to ``default_service_name`` as without a
    file."""
    from opentelemetry.configuration.file import create_resource
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    config = load()
    made = create_resource(config.resource)
    if str(made.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        made = made.merge(Resource({SERVICE_NAME: default_service_name}))
    return Resource(extra).merge(made)


def create(signal: str, resource: Any, pull: bool = True) -> object:
    """The SDK provider of ``signal`` as the file configures it (``create_*_provider``). A section the file leaves
    out, or ``disabled: true``, gives a provider that exports nothing (the specification's no-op). ``pull=False``
    leaves out pull readers (Prometheus: a forked child's parent serves the port)."""
    from opentelemetry.configuration import file as declarative

    config = load()
    disabled = bool(config.disabled)
    limits = config.attribute_limits
    if signal == "traces":
        return declarative.create_tracer_provider(None if disabled else config.tracer_provider, resource, limits)
    if signal == "metrics":
        section = None if disabled else _meter_section(config.meter_provider, pull)
        return declarative.create_meter_provider(section, resource)
    return declarative.create_logger_provider(None if disabled else config.logger_provider, resource, limits)


def _meter_section(section: Any, pull: bool) -> Any:
    """The meter provider section for this process: without pull readers where ``pull`` is false; each worker of a
    node on its own Prometheus port, by the rule the ``OTEL_*`` route follows (``_export.ports``: the file's port
    ``+ 1 + LOCAL_RANK``; the agent keeps the file's port)."""
    if section is None:
        return None
    readers = [reader for reader in section.readers if pull or reader.pull is None]
    if ports.offset():
        readers = [_moved(reader) for reader in readers]
    return dataclasses.replace(section, readers=readers)


def _moved(reader: Any) -> object:
    prometheus = reader.pull.exporter.prometheus_development if reader.pull is not None else None
    if prometheus is None:
        return reader
    moved = dataclasses.replace(prometheus, port=ports.port(prometheus.port))
    exporter = dataclasses.replace(reader.pull.exporter, prometheus_development=moved)
    return dataclasses.replace(reader, pull=dataclasses.replace(reader.pull, exporter=exporter))


def _reset_for_tests() -> None:
    with _lock:
        _loaded.clear()
        _told.clear()
