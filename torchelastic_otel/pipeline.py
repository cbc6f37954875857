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
5. A torchrun worker builds its pipeline off its start-up path (:func:`defer`): placeholders stand in for the
   global providers until the first use.

The bridge flushes at exit (and, in workers, on SIGTERM), each time within a bound: a dead backend must not hold
the job up. A forked child rebuilds the providers the bridge built, with its own resource, on first use
(``_after_fork_in_child``). How the providers are built is ``_providers``; how their exporters count what they
lose and tell a flush when they are stuck is ``_exporters``.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import _logs, metrics, trace

from torchelastic_otel import _exporters, _providers, _selftelemetry
from torchelastic_otel._providers import DEFAULT_SERVICE_NAME

__all__ = ["Pipeline", "get_pipeline", "setup", "flush", "shutdown", "DEFAULT_SERVICE_NAME", "sdk_disabled", "add_flush_hook"]

_logger = logging.getLogger("torchelastic_otel")


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
        health = _exporters.health
        if self._backend_down or health.down():
            timeout_millis = min(timeout_millis, 100)
        failures = health.failures
        ok = _exporters.run_bounded(self._force_flush_all, timeout_millis, give_up=health.stuck)
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
        return _exporters.run_bounded(self._shutdown_owned, remaining) is not None

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
    """True for the API's proxy providers (nobody has set a global provider yet) and the bridge's placeholders."""
    return isinstance(provider, _BuildOnUse) or type(provider).__name__.startswith(("Proxy", "_Proxy"))


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
    resource = _providers.resource()
    if missing["traces"]:
        tracer_provider = _providers.build_tracer_provider(resource)
        trace.set_tracer_provider(tracer_provider)
        tracer_provider = trace.get_tracer_provider()
    if missing["metrics"]:
        meter_provider = _providers.build_meter_provider(resource)
        metrics.set_meter_provider(meter_provider)
        meter_provider = metrics.get_meter_provider()
    if missing["logs"]:
        logger_provider = _providers.build_logger_provider(resource)
        _logs.set_logger_provider(logger_provider)
        logger_provider = _logs.get_logger_provider()
    return Pipeline(tracer_provider, meter_provider, logger_provider, owned=missing)


def _at_exit() -> None:
    """Deliver what is left, then shut down the providers the bridge built -- within EXIT_TIMEOUT_MILLIS."""
    deadline = time.monotonic() + EXIT_TIMEOUT_MILLIS / 1000
    if _fork_pending and not _settle_fork(deadline):
        return  # a forked child that recorded nothing: nothing of its own to deliver
    _build_deferred()
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
            _after_build()
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
        _after_build()
        return _pipeline


def prepare() -> None:
    """Make the bridge's providers the global ones now, before the application starts spans: build the pipeline,
    unless its set-up is deferred (then placeholders already stand in for the global providers)."""
    if _deferred_since is None:
        get_pipeline()


# ---- deferred set-up (torchrun workers) -------------------------------------------------------------------------

#: The latest a deferred pipeline is built after ``defer()``, by the drainer, if nothing needed it before.
DEFER_MAX_MILLIS = _exporters.env_millis("TORCHELASTIC_OTEL_SETUP_DELAY_MILLIS", 5000)
_deferred_since: float | None = None
_on_build: list[Callable[[], Any]] = []


class _Placeholder:
    """Stands in for a global provider of the bridge's until its pipeline is (re)built: the first use
    (``get_tracer``, ``get_meter``, ``get_logger``...) builds it and goes to the real provider."""

    def __init__(self, signal: str) -> None:
        self._signal = signal

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_signal", "_parent_provider"):
            raise AttributeError(name)
        pipe = get_pipeline()
        provider = {"traces": pipe.tracer_provider, "metrics": pipe.meter_provider, "logs": pipe.logger_provider}
        return getattr(provider[self._signal], name)


class _BuildOnUse(_Placeholder):
    """A placeholder while a deferred pipeline is not built yet (:func:`defer`).

    It is put in the API's module global directly, so the API's set-once guard stays unused: an application (or
    ``opentelemetry-instrument``) that sets its own provider meanwhile replaces it, and the bridge then uses that.
    """


def _pulls_metrics() -> bool:
    return "prometheus" in os.environ.get(_providers.SIGNAL_ENV["metrics"], "").lower()


def defer() -> bool:
    """Build the pipeline later, off the start-up path of the process: on first use (a value or event to export,
    a span or meter the application asks for, a flush, exit), or ``DEFER_MAX_MILLIS`` after this call.

    A torchrun worker's start-up would otherwise pay for importing and setting up the SDK and its exporters
    (~150-250 ms, the OTLP/gRPC exporters most of it) before the training script's first line. Not with a
    Prometheus exporter, whose endpoint must be up from the start. ``True`` if the set-up is deferred now.
    """
    global _deferred_since
    with _lock:
        if _pipeline is not None or _deferred_since is not None or sdk_disabled() or _pulls_metrics():
            return False
        for signal in _GLOBALS:
            _replace_global(signal, None, _BuildOnUse(signal))  # only where no provider is set
        _deferred_since = time.monotonic()
        _register_atexit()
        _build_before_shutdown()
        return True


_build_hooked = False


def _build_before_shutdown() -> None:
    """At interpreter exit, thread pools stop taking work before ``atexit`` handlers run (the SDK's
    ``Resource.create`` needs one) and Python 3.12+ refuses new threads in them (the batch processors start one):
    a pipeline still deferred then is built earlier, among ``threading``'s own exit hooks, which run
    last-registered first -- so before the one ``concurrent.futures`` registers when it is imported."""
    global _build_hooked
    register = getattr(threading, "_register_atexit", None)
    if _build_hooked or register is None:
        return
    import concurrent.futures.thread  # noqa: F401 - its exit hook is registered before ours

    try:
        register(_build_deferred)
        _build_hooked = True
    except RuntimeError:  # already shutting down
        pass


def setup_pending() -> bool:
    """Whether the pipeline's set-up is deferred and has not happened yet."""
    return _deferred_since is not None and _pipeline is None


def when_built(callback: Callable[[], Any]) -> None:
    """Run ``callback()`` once the pipeline is built (now, if it is)."""
    with _lock:
        if _pipeline is None:
            _on_build.append(callback)
            return
    _run_callback(callback)


def build_if_due() -> None:
    """Build a deferred pipeline whose time has come (called by the drainer on every round)."""
    since = _deferred_since
    if since is not None and _pipeline is None and (time.monotonic() - since) * 1000 >= DEFER_MAX_MILLIS:
        get_pipeline()


def _build_deferred() -> None:
    if setup_pending():
        get_pipeline()


def _after_build() -> None:
    global _deferred_since
    _deferred_since = None
    callbacks, _on_build[:] = list(_on_build), []
    for callback in callbacks:
        _run_callback(callback)


def _run_callback(callback: Callable[[], Any]) -> None:
    try:
        callback()
    except Exception:
        _logger.debug("callback after the pipeline's set-up failed", exc_info=True)


#: Bumped whenever the pipeline is replaced, so adapters re-resolve their cached loggers/meters.
_generation = [0]


def flush(timeout_millis: int = 5000) -> bool:
    """Export everything recorded so far (drains the bridge's buffers first); never raises. ``True`` on success."""
    if _fork_pending and not _settle_fork(time.monotonic() + max(0, timeout_millis) / 2000):
        return True  # a forked child that recorded nothing yet
    _build_deferred()
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


class _RebuildOnUse(_Placeholder):
    """A placeholder, in a forked child, for a global provider the bridge built in the parent
    (``parent_provider``): the first use rebuilds the bridge's pipeline for the child."""

    def __init__(self, signal: str, parent_provider: Any) -> None:
        super().__init__(signal)
        self._parent_provider = parent_provider


def _rebuild_in_child(current: Pipeline) -> Pipeline:
    """Fresh providers, exporters and resource (``process.pid``) in a forked child for what the bridge built.

    The parent's providers were copied by ``fork``: their metric storage holds the parent's cumulative values (the
    child would export them again, as its own), their resource names the parent's pid, and their exporters'
    connections are the parent's. In the child their exporters do nothing (``_exporting``); tracers, meters and
    loggers obtained from them before the fork stay theirs, so a child gets its own after the fork. Prometheus
    readers are not rebuilt: the parent serves that port.
    """
    resource = _providers.resource()
    providers = {"traces": current.tracer_provider, "metrics": current.meter_provider, "logs": current.logger_provider}
    builders: dict[str, Callable[[], Any]] = {
        "traces": lambda: _providers.build_tracer_provider(resource),
        "metrics": lambda: _providers.build_meter_provider(resource, pull=False),
        "logs": lambda: _providers.build_logger_provider(resource),
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
    global _lock, _fork_pending
    _lock = threading.RLock()
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


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _reset_for_tests() -> None:
    """Forget the pipeline without touching providers (tests install their own)."""
    global _pipeline, _fork_pending, _deferred_since
    with _lock:
        _pipeline = None
        _fork_pending = False
        _generation[0] += 1
        if _deferred_since is not None:
            for signal in _GLOBALS:
                module_name, attribute = _GLOBALS[signal]
                if isinstance(getattr(sys.modules.get(module_name), attribute, None), _BuildOnUse):
                    setattr(sys.modules[module_name], attribute, None)
        _deferred_since = None
        _on_build.clear()
