"""An installed OpenTelemetry distro and configurator, run in every process the bridge builds a pipeline for.

``opentelemetry-instrument`` configures a process with the distro (``opentelemetry_distro`` entry point,
``OTEL_PYTHON_DISTRO`` picks one) and then the configurator (``opentelemetry_configurator``,
``OTEL_PYTHON_CONFIGURATOR``) it finds installed; platform teams ship theirs so (exporters, resource, sampler).
The bridge's own routes (``torchelastic-otel run``, ``install()`` in a launcher) start its workers without
``opentelemetry-instrument``, so before building a pipeline the bridge runs them itself, with
``opentelemetry-instrumentation``'s own loaders (``_compat.auto_instrumentation_loaders``): the global providers
the configurator sets are then the pipeline's, and the bridge builds only the signals it left unset (from
``OTEL_CONFIG_FILE`` or ``OTEL_*``). Under ``opentelemetry-instrument`` they ran already in the process: nothing
is run twice. Where none is installed nothing changes.

Looking costs: the entry point scan reads every installed distribution's metadata, and the loaders' import costs as much
again (docs/performance.md, "Costs that shape the code"). So the agent looks once, and tells its workers what it found
(:data:`FOUND_ENV`, through ``install()``): a worker of a job without a distro pays nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Iterator

from torchelastic_otel import _compat, _settings
from torchelastic_otel import _selftelemetry as selftelemetry

__all__ = ["configure_once", "installed", "for_workers", "FOUND_ENV", "GROUPS"]

_logger = logging.getLogger("torchelastic_otel")

#: The entry point groups ``opentelemetry-instrument`` configures a process with.
GROUPS = ("opentelemetry_distro", "opentelemetry_configurator")
FOUND_ENV = _settings.DISTRO_FOUND.name
#: Imported by ``opentelemetry-instrument``'s ``sitecustomize`` (or its instrumentors): the distro and the
#: configurator ran in this process already.
_AUTO_INSTRUMENTATION = "opentelemetry.instrumentation.auto_instrumentation"

_RESOURCE_ENV = "OTEL_RESOURCE_ATTRIBUTES"

_lock = threading.Lock()
_done: list[bool] = []
_found: list[bool] = []


def installed() -> bool:
    """Whether a distro or a configurator is installed (an ``importlib.metadata`` scan, once). One scan for both
    groups: ``entry_points(group=...)`` reads every installed distribution's metadata at each call."""
    if not _found:
        from importlib.metadata import entry_points

        try:
            every = entry_points()
            _found.append(any(len(every.select(group=group)) for group in GROUPS))
        except Exception:
            _logger.debug("torchelastic_otel: entry points could not be read", exc_info=True)
            _found.append(False)
    return _found[0]


def for_workers() -> str | None:
    """What the workers an agent of this process starts get in :data:`FOUND_ENV`: ``"1"`` or ``"0"``; ``None``
    under ``opentelemetry-instrument``, whose ``sitecustomize`` runs the distro in every worker itself."""
    if _AUTO_INSTRUMENTATION in sys.modules:
        return None
    return "1" if installed() else "0"


def _worth_looking() -> bool:
    """``False`` where the agent found none (:data:`FOUND_ENV` ``0``), or ``opentelemetry-instrument`` ran them."""
    if _AUTO_INSTRUMENTATION in sys.modules:
        return False
    found = os.environ.get(FOUND_ENV)
    if found is not None:
        return found == "1"
    return installed()


def configure_once() -> None:
    """Run the installed distro and configurator as ``opentelemetry-instrument`` does, once per process (before
    the pipeline's first build). Never raises: one that fails is logged, counted, and the bridge builds the
    pipeline itself."""
    with _lock:
        if _done:
            return
        _done.append(True)
    if _settings.sdk_disabled() or not _worth_looking():
        return
    loaders = _compat.auto_instrumentation_loaders()
    if loaders is None:
        return
    load_distro, load_configurators = loaders
    try:
        with _torchrun_attributes_in_environment():
            load_distro().configure()
            load_configurators()
    except Exception as exc:
        selftelemetry.count(selftelemetry.SANITIZED, "all", "distro_failed")
        _logger.warning("torchelastic_otel: the OpenTelemetry distro or configurator failed: %s", exc)


@contextlib.contextmanager
def _torchrun_attributes_in_environment() -> Iterator[None]:
    """The torchrun attributes (run id, role, ranks, restart count) in ``OTEL_RESOURCE_ATTRIBUTES`` while the
    configurator runs, behind what the variable holds (which wins): a configurator built on the SDK's
    (``Resource.create``) puts them on its resource, so a worker's telemetry names its rank as without a distro.
    (``process.pid`` and ``host.name`` stay out: what the worker starts meanwhile inherits the variable.)"""
    from urllib.parse import quote

    from torchelastic_otel.resource import torchrun_attributes

    ours = {k: v for k, v in torchrun_attributes().items() if k not in ("process.pid", "host.name")}
    before = os.environ.get(_RESOURCE_ENV)
    pairs = [f"{key}={quote(str(value), safe='')}" for key, value in ours.items()]
    if before:
        pairs.append(before)
    os.environ[_RESOURCE_ENV] = ",".join(pairs)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_RESOURCE_ENV, None)
        else:
            os.environ[_RESOURCE_ENV] = before


def _reset_for_tests() -> None:
    with _lock:
        _done.clear()
        _found.clear()
