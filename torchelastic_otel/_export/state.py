"""The exporter pipeline's life in this process: one state machine, in this module only (``pipeline`` is its public
face, and brings the process's hooks along: ``_process.runtime``).

The pipeline is the tracer, meter and logger providers the bridge writes to. Rules, in order:

1. Providers the application (or ``opentelemetry-instrument``) already set globally are reused, never replaced.
2. For a signal with no global provider, one is built from ``OTEL_*`` with the SDK's own configuration code
   (``_export.providers``) and set as the global provider so the application's own spans and logs share it.
3. ``OTEL_SDK_DISABLED=true`` gives no-op providers: nothing is recorded or exported.
4. :func:`setup` lets a program pass its own providers explicitly instead.

Its life (:class:`Phase`), every transition written here and nowhere else::

    UNSET    --get_pipeline(): first use, built in the caller's thread-------------------> READY
    UNSET    --start_building(): a worker's install(); built by a daemon thread---------> BUILDING --built--> READY
    BUILDING --abandon_build(): exit before it is built, with nothing to send--------------> UNSET
    any      --setup(providers)-------------------------------------------------------------> READY
    READY    --fork, in the child, if the bridge built any provider-----------------------> FORKED
    FORKED   --first use in the child: fresh providers, exporters and resource------------> READY
    BUILDING --fork, in the child (the building thread did not survive it)----------------> UNSET
    any      --shutdown(): the bridge's providers flushed and shut down-------------------> UNSET

Why a worker builds in a thread of its own, and when: importing the SDK and the OTLP exporters and building the
providers is CPU-bound Python, which must not be added to the script's start-up -- and a thread of the same process adds
it all the same, under the GIL, to the script's own imports (docs/performance.md, "Costs that shape the code"). So a
worker of a bridged agent defers the build (``TORCHELASTIC_OTEL_SETUP_DELAY_MILLIS``) until it asks for a provider (a
span), buffers what an exit could not hand to its agent (a metric value, more than 256 records), or the delay is over; a
rank that fails sooner loses nothing, because its final words, its start span and what it buffered never needed its
pipeline: its agent sends them. Elsewhere the thread builds at once. Either way, a build that is due (not asked for)
waits while the main thread is importing (bounded: ``IMPORT_WAIT_SECONDS``): a build beside ``import torch`` costs a
worker's start-up more than one after it; a deferred one waits longer (``DEFERRED_IMPORT_WAIT_SECONDS``), and
``IMPORT_SETTLE_SECONDS`` after the imports: the rest of the script's start-up. While it is BUILDING (waiting or
building), placeholders (``_export.placeholders``) stand in for the global providers; whoever asks one for a tracer,
meter or logger waits for the build. The final words of a process (SIGTERM, an uncaught exception) never build and never
wait: they take :func:`ready` (no lock, no import) and, when it says ``None``, leave their record where the agent reads
it.

The process's hooks (fork, exit, signals) live in ``_process.runtime``, which calls into this module and is imported
with ``pipeline``, the module every user of the pipeline imports; listeners added with :func:`add_listener` hear of
every phase change (``_process.runtime`` registers its exit handlers on the first one).
"""

from __future__ import annotations

import contextlib
import enum
import gc
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import _logs, metrics, trace

from torchelastic_otel import _compat, _settings
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._export import bounded as _bounded
from torchelastic_otel._export import distro as _distro
from torchelastic_otel._export import drainer as _drainer
from torchelastic_otel._export import health as _health
from torchelastic_otel._export import placeholders as _placeholders
from torchelastic_otel._export import providers as _providers
from torchelastic_otel._export.providers import DEFAULT_SERVICE_NAME
from torchelastic_otel._settings import EXIT_TIMEOUT_MILLIS, sdk_disabled

__all__ = [
    "Phase",
    "Pipeline",
    "get_pipeline",
    "ready",
    "building",
    "start_building",
    "abandon_build",
    "when_ready",
    "add_listener",
    "setup",
    "flush",
    "shutdown",
    "renew",
    "prepare",
    "DEFAULT_SERVICE_NAME",
    "EXIT_TIMEOUT_MILLIS",
    "sdk_disabled",
]

_logger = logging.getLogger("torchelastic_otel")


class _QuietAbandoned(logging.Filter):
    """An abandoned build goes on during the interpreter's shutdown, where its steps fail (the SDK's resource
    detection submits to a thread pool that refuses work by then): what it would log is about a pipeline nobody
    will use, and would reach a worker's stderr as a false configuration warning at every quick exit."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread not in state.abandoned


_logger.addFilter(_QuietAbandoned())

#: How long a thread that needs a provider waits for a pipeline being built before it gets a no-op one (counted).
BUILD_WAIT_SECONDS = 30.0
_SIGNALS = ("traces", "metrics", "logs")


class Phase(enum.Enum):
    UNSET = "unset"
    BUILDING = "building"
    READY = "ready"
    FORKED = "forked"


@dataclass
class Pipeline:
    """The providers the bridge writes to, and whether it owns (built) them."""

    tracer_provider: Any
    meter_provider: Any
    logger_provider: Any
    owned: dict[str, bool] = field(default_factory=dict)
    #: The resource of the providers it built (``None``: it built none).
    resource: Any = None

    def providers(self) -> dict[str, object]:
        return {"traces": self.tracer_provider, "metrics": self.meter_provider, "logs": self.logger_provider}

    def flush(self, timeout_millis: int = 5000) -> bool:
        """Drain the bridge's buffers (half of the time at most), then force-flush every provider; returns within
        ``timeout_millis`` (``_export.bounded.bounded_flush``). Never raises; ``False`` if it timed out or an export
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
        """Flush, then shut down the providers this pipeline built (never the application's), within the time.

        The shutdown is not waited for once an export in flight is stuck (a backend down: the exporter sleeps
        before its retry, and the processors' shutdown would wait for it): what it could still send has had its
        chance in the flush, and a dying process need not stop its threads tidily."""
        deadline = time.monotonic() + timeout_millis / 1000
        with _bounded.shutting_down():
            self.flush(timeout_millis)
            remaining = max(0, int((deadline - time.monotonic()) * 1000))
            if _bounded.backend_down():
                remaining = min(remaining, _settings.DOWN_WAIT_MILLIS)
            return _bounded.run_bounded(self._shutdown_owned, remaining, give_up=_health.health.stuck) is not None

    def _shutdown_owned(self) -> bool:
        for signal, provider in self.providers().items():
            if self.owned.get(signal) and hasattr(provider, "shutdown"):
                try:
                    provider.shutdown()
                except Exception:
                    _logger.debug("shutdown of %s provider failed", signal, exc_info=True)
        return True


def _force_flush(provider: object) -> bool:
    """A provider's flush in the caller's thread: the bridge's own without its bound (the caller bounds it), an
    application's meter provider without its pull readers (a Prometheus reader collected out of turn serves every
    metric family twice on its next scrape, opentelemetry-python#2500)."""
    unbounded = getattr(provider, "force_flush_unbounded", None)
    if unbounded is not None:
        return unbounded() is not False
    readers = _compat.metric_readers(provider)
    if readers is not None and any(_providers.is_pull_reader(r) for r in readers):
        return all([r.force_flush() is not False for r in readers if not _providers.is_pull_reader(r)])
    force_flush = getattr(provider, "force_flush", None)
    return force_flush is None or force_flush() is not False


# ---- the state machine -----------------------------------------------------------------------------------------


class _State:
    """Where the bridge's pipeline stands in this process. ``lock`` is held only to change the phase, never while
    importing or building (a signal may land in the thread that builds) and never by the final words."""

    def __init__(self) -> None:
        self.phase = Phase.UNSET
        self.current: Pipeline | None = None
        self.lock = threading.RLock()
        #: Set whenever the phase is not BUILDING, except while a build becomes READY: from then until what waited
        #: for it (listeners, ``when_ready`` callbacks: the worker's span, the final words' logger) has run, so
        #: that an exit that waits for the build flushes what they made rather than shutting down before it.
        self.built = threading.Event()
        self.built.set()
        self.builder: threading.Thread | None = None
        #: Set when a deferred build is needed now (:func:`start_building`'s ``delay_seconds``): something asked
        #: for the pipeline or waits for it.
        self.go = threading.Event()
        #: The builder threads whose build was abandoned (``abandon_build``): they stop at their next step and
        #: log nothing (:class:`_QuietAbandoned`).
        self.abandoned: set[int | None] = set()
        #: Bumped whenever the pipeline is replaced, so adapters re-resolve their cached loggers/meters.
        self.generation = [0]
        self.on_ready: list[Callable[[], object]] = []
        self.listeners: list[Callable[[Phase], object]] = []

    def enter(self, phase: Phase, pipeline: Pipeline | None) -> None:
        """The one place the phase changes (called with ``lock`` held)."""
        self.phase, self.current = phase, pipeline
        self.generation[0] += 1
        if phase is Phase.BUILDING:
            self.built.clear()
        elif phase is not Phase.READY:
            self.built.set()  # READY: ``_ready`` sets it once its callbacks ran

    def after_fork_in_child(self) -> None:
        self.lock = threading.RLock()
        self.built = threading.Event()
        self.builder = None
        self.go = threading.Event()
        self.abandoned = set()  # the parent's threads are not this process's
        if self.phase is Phase.BUILDING:
            self.phase = Phase.UNSET  # the placeholders stay: the first use builds, in that thread
        self.built.set()


state = _State()


def add_listener(listener: Callable[[Phase], object]) -> None:
    """Call ``listener(phase)`` after every phase change (in the thread that made it; never raises into it)."""
    if listener not in state.listeners:
        state.listeners.append(listener)


def remove_listener(listener: Callable[[Phase], object]) -> None:
    if listener in state.listeners:
        state.listeners.remove(listener)


def _notify(phase: Phase) -> None:
    for listener in list(state.listeners):
        _quietly(listener, phase)


def _quietly(fn: Callable[..., object], *args: object) -> None:
    try:
        fn(*args)
    except Exception:
        _logger.debug("torchelastic_otel: callback failed", exc_info=True)


def _ready(pipeline: Pipeline) -> Pipeline:
    """READY: self-telemetry on the meter provider, the drainer on, then what waited for a pipeline; only then
    does :func:`wait_built` return (the exit flushes what the callbacks made)."""
    with state.lock:
        state.enter(Phase.READY, pipeline)
        callbacks, state.on_ready = state.on_ready, []
    try:
        _quietly(selftelemetry.instrument, pipeline.meter_provider)
        _quietly(_drainer.enable)
        _notify(Phase.READY)
        for callback in callbacks:
            _quietly(callback)
    finally:
        state.built.set()
    return pipeline


def ready() -> Pipeline | None:
    """The pipeline if it is READY, else ``None``: no lock, no wait, no build (the final words' way in)."""
    current = state.current
    return current if state.phase is Phase.READY else None


def generation() -> int:
    """How many times the pipeline has changed (built, replaced, shut down, forked): what an adapter holds of the
    providers (its meter, its instruments, its logger) is made again when this changes (``_export.meters``)."""
    return state.generation[0]


def building() -> bool:
    """A worker's pipeline is being built in the background (records meanwhile are buffered for it)."""
    return state.phase is Phase.BUILDING


def when_ready(callback: Callable[[], object]) -> None:
    """Run ``callback()`` once a pipeline is READY (now, if one is)."""
    with state.lock:
        if state.phase is not Phase.READY:
            state.on_ready.append(callback)
            return
    _quietly(callback)


def get_pipeline() -> Pipeline:
    """The pipeline the bridge exports to; built from ``OTEL_*`` on first use (see the phases above)."""
    current = state.current
    if state.phase is Phase.READY and current is not None:
        return current
    for _ in range(3):  # the phase may change while waiting; three turns cover every sequence of transitions
        if state.phase is Phase.BUILDING:
            state.go.set()
            if threading.current_thread() is state.builder or not state.built.wait(BUILD_WAIT_SECONDS):
                selftelemetry.count(selftelemetry.DROPPED, "all", "pipeline_unavailable")
                return _noop_pipeline()
        with state.lock:
            if state.phase is Phase.READY and state.current is not None:
                return state.current
            if state.phase is Phase.FORKED and state.current is not None:
                return _ready(_rebuild_for_child(state.current))
            if state.phase is Phase.UNSET:
                return _ready(_build())
    return state.current if state.current is not None else _noop_pipeline()


def _build() -> Pipeline:
    """The pipeline from the environment; a no-op one when the SDK is disabled or the configuration is broken."""
    if sdk_disabled():
        return _noop_pipeline()
    try:
        with _no_collection():
            return _from_environment()
    except Exception as exc:
        if threading.get_ident() in state.abandoned:  # _Abandoned, or a step that failed after the abandon
            return _noop_pipeline()  # nobody waits for it; it failed for the interpreter's shutdown, not its config
        if getattr(exc, "reported", False):
            return _noop_pipeline()  # a broken OTEL_CONFIG_FILE, reported once (_export.config_file)
        # A broken configuration must not reach the job: log it and export nothing.
        _logger.warning("torchelastic_otel: could not configure OpenTelemetry from OTEL_*: %s", exc)
        selftelemetry.count(selftelemetry.DROPPED, "all", "pipeline_unavailable")
        return _noop_pipeline()


@contextlib.contextmanager
def _no_collection() -> Iterator[None]:
    """No cyclic garbage collection while the pipeline is built.

    A build creates some 100k objects (the SDK's and the exporters' modules, mostly), which in a process that has
    imported torch (millions of objects) sets off a full collection about as long as the rest of the build
    (docs/performance.md). Paused for the build (the main thread collects nothing meanwhile either), the garbage
    waits for the next collection, which the process's own allocations start. Only where the
    collector was on: one the application turned off stays off."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if not gc.isenabled():
            gc.enable()


def _noop_pipeline() -> Pipeline:
    return Pipeline(trace.NoOpTracerProvider(), metrics.NoOpMeterProvider(), _logs.NoOpLoggerProvider())


def _is_unset(provider: object) -> bool:
    """True for the API's proxy providers (nobody has set a global provider yet) and the bridge's placeholders."""
    return isinstance(provider, _placeholders.Placeholder) or _compat.is_proxy_provider(provider)


class _Abandoned(Exception):
    """Raised in a builder thread whose build was abandoned, at its next step."""


def _go_on() -> None:
    """A step of a build: an abandoned build stops here (it must not set the global providers after the fact)."""
    if threading.get_ident() in state.abandoned:
        raise _Abandoned


def _from_environment() -> Pipeline:
    """Reuse the global providers that are set; build (and set) the others from ``OTEL_*``. An installed distro
    and configurator run first, as ``opentelemetry-instrument`` runs them (``_export.distro``)."""
    _distro.configure_once()
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
    providers = {"traces": tracer_provider, "metrics": meter_provider, "logs": logger_provider}
    builders = {
        "traces": _providers.build_tracer_provider,
        "metrics": _providers.build_meter_provider,
        "logs": _providers.build_logger_provider,
    }
    for signal in _SIGNALS:
        if missing[signal]:
            built = builders[signal](resource)
            _go_on()
            providers[signal] = _set_global(signal, built)
    return Pipeline(providers["traces"], providers["metrics"], providers["logs"], owned=missing, resource=resource)


def _set_global(signal: str, provider: Any) -> Any:
    """Make ``provider`` the global one; the global one afterwards.

    Where a placeholder stands (a worker's build), it is replaced in the API's module globals, leaving the API's
    set-once guard unused: an application or ``opentelemetry-instrument`` that sets its own provider later still
    can (and its own spans go there; the bridge goes on with its pipeline). Elsewhere through the API's setter.
    """
    current = _compat.global_provider(signal)
    if isinstance(current, _placeholders.Placeholder) and _compat.replace_global_provider(signal, current, provider):
        return provider
    if signal == "traces":
        trace.set_tracer_provider(provider)
        return trace.get_tracer_provider()
    if signal == "metrics":
        metrics.set_meter_provider(provider)
        return metrics.get_meter_provider()
    _logs.set_logger_provider(provider)
    return _logs.get_logger_provider()


def _provider_of(signal: str) -> object:
    """What a placeholder stands for: the pipeline's provider of ``signal`` (built or waited for)."""
    return get_pipeline().providers()[signal]


# ---- UNSET -> BUILDING -> READY: a worker's set-up -------------------------------------------------------------


def _pulls_metrics() -> bool:
    return "prometheus" in os.environ.get(_providers.SIGNAL_ENV["metrics"], "").lower()


def start_building(delay_seconds: float = 0.0, wanted: Callable[[], bool] | None = None) -> bool:
    """Build the pipeline in a daemon thread (a worker's ``install()``): ``True`` if that thread started.

    With ``delay_seconds``, the thread first waits until the pipeline is needed -- asked for (a placeholder's
    first use, :func:`wait_built`), ``wanted()`` (polled: what is buffered outgrew the hand-over), or the delay is
    over. A worker whose agent sends what it leaves behind (its start span, its final words) defers so: the build's
    CPU, which runs under the GIL beside the script's own imports, is then paid neither by a worker that ends early
    nor during its start-up.

    Not with a Prometheus exporter (its endpoint must be serving once ``install()`` returns), nor where no thread
    can start while the interpreter exits (CPython 3.12.0-3.12.1, ``_compat.threads_start_at_exit``: a worker
    exiting mid-build could not start its exporters): built at once, in the caller's thread, there.
    """
    with state.lock:
        if state.phase is not Phase.UNSET or sdk_disabled():
            return False
        for signal in _SIGNALS:  # also where it is built at once: an application may still set its own later
            _compat.replace_global_provider(signal, None, _placeholders.BuildOnUse(signal, _provider_of))
        if _pulls_metrics() or not _compat.threads_start_at_exit():
            _ready(_build())
            return False
        builder = threading.Thread(
            target=_build_in_background, args=(delay_seconds, wanted), name="torchelastic-otel-setup", daemon=True
        )
        state.builder = builder
        state.go = threading.Event()
        state.enter(Phase.BUILDING, None)
        builder.start()
    _notify(Phase.BUILDING)
    return True


#: How often a deferred build looks whether it is wanted meanwhile (``wanted()``).
NEED_POLL_SECONDS = 0.1


def _build_in_background(delay_seconds: float = 0.0, wanted: Callable[[], bool] | None = None) -> None:
    if _await_need(state.go, delay_seconds, wanted) == "due":
        if delay_seconds > 0:  # deferred (a worker of a bridged agent): its agent sends what it leaves behind
            _await_imports(state.go, DEFERRED_IMPORT_WAIT_SECONDS, IMPORT_SETTLE_SECONDS, wanted)
        else:
            _await_imports(state.go, IMPORT_WAIT_SECONDS)
    with state.lock:
        if state.phase is not Phase.BUILDING or state.builder is not threading.current_thread():
            return  # abandoned, or setup() / shutdown() came first: nothing to build
    with _yielding():
        pipeline = _build()
    with state.lock:
        if state.phase is not Phase.BUILDING or state.builder is not threading.current_thread():
            return  # setup() or shutdown() came first: theirs stands
        state.builder = None
        _ready(pipeline)


#: The GIL switch interval while a background build runs (CPython's default: 5 ms).
BUILD_SWITCH_INTERVAL = 0.0005


@contextlib.contextmanager
def _yielding() -> Iterator[None]:
    """Let the build hand the GIL back often (``sys.setswitchinterval``) while it runs.

    The build is CPU-bound Python (imports, mostly); a main thread that keeps releasing the GIL for short native
    calls -- ``init_process_group``'s store round trips, a data loader's reads -- waits up to one switch interval
    for it after each call: with CPython's default a build beside a worker's ``init_process_group`` slows it
    markedly, with ``BUILD_SWITCH_INTERVAL`` not measurably (docs/performance.md). The interval is the process's: it
    is restored afterwards, unless someone else changed it meanwhile."""
    previous = sys.getswitchinterval()
    if previous <= BUILD_SWITCH_INTERVAL:
        yield
        return
    sys.setswitchinterval(BUILD_SWITCH_INTERVAL)
    try:
        yield
    finally:
        if abs(sys.getswitchinterval() - BUILD_SWITCH_INTERVAL) < 1e-7:  # stored in whole microseconds
            sys.setswitchinterval(previous)


def _await_need(go: threading.Event, delay_seconds: float, wanted: Callable[[], bool] | None) -> str:
    """Return once ``go`` is set (``"asked"``), ``wanted()`` holds or fails (``"wanted"``) or ``delay_seconds`` have
    passed (``"due"``)."""
    deadline = time.monotonic() + delay_seconds
    while not go.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return "due"
        try:
            if wanted is not None and wanted():
                return "wanted"
        except Exception:
            return "wanted"
        go.wait(min(NEED_POLL_SECONDS, left))
    return "asked"


#: How long a build that is due waits for the main thread to finish the imports it is in; how often it looks.
IMPORT_WAIT_SECONDS = 5.0
IMPORT_POLL_SECONDS = 0.05
#: How long a deferred build that waited for the main thread's imports waits after them (an import meanwhile starts
#: it again), and how long it waits for both at most: an ``import torch`` that outlasts ``IMPORT_WAIT_SECONDS``
#: (a loaded machine, a slow file system, CUDA's libraries) would otherwise get the build beside it. What the
#: worker records that its agent could not send for it starts the build at once all the same (``wanted``).
IMPORT_SETTLE_SECONDS = 2.0
DEFERRED_IMPORT_WAIT_SECONDS = 30.0


def _await_imports(
    go: threading.Event,
    timeout_seconds: float,
    settle_seconds: float = 0.0,
    wanted: Callable[[], bool] | None = None,
) -> None:
    """Wait while the main thread is importing -- and, where it was, ``settle_seconds`` more without an import --
    until ``go`` is set, ``wanted()`` holds (or fails) or ``timeout_seconds`` have passed.

    Imports are CPU-bound Python, as the build is: side by side under one GIL, each hands it to the other at every
    file read, and both take longer than one after the other (docs/performance.md, "Costs that shape the code"). A
    script's imports are followed by the rest of its start-up -- its model, CUDA's and the process group's
    initialisation, its first steps: Python on the main thread, on the way to the first step -- so a deferred build
    waits ``settle_seconds`` more: then a rank mostly waits in native code (collectives, the GPU, data loading), which
    leaves the GIL to the build; and a rank that ends or fails within them builds nothing (its agent sends what it
    leaves behind). A script that does all its work inside an import (its training loop at a module's top level) gets
    its build after ``timeout_seconds`` all the same."""
    deadline = time.monotonic() + timeout_seconds
    quiet_from: float | None = None  # since when the main thread was seen out of imports, having been in one
    seen = False
    while not go.is_set():
        now = time.monotonic()
        if now >= deadline:
            return
        try:
            if wanted is not None and wanted():
                return
        except Exception:
            return
        if _main_thread_importing():
            seen, quiet_from = True, None
        elif not seen:
            return  # not importing when the build became due: it starts now
        elif quiet_from is None:
            quiet_from = now
        if quiet_from is not None and now - quiet_from >= settle_seconds:
            return
        go.wait(min(IMPORT_POLL_SECONDS, deadline - now))


def _main_thread_importing() -> bool:
    """Whether the main thread is inside an import (a frame of ``importlib._bootstrap`` on its stack)."""
    main = threading.main_thread().ident
    frame = _compat.thread_frames().get(main) if main is not None else None
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def wait_built(timeout_seconds: float) -> bool:
    """Wait (bounded) for a build in progress -- starting a deferred one -- and what waited for it (``_ready``);
    ``True`` unless it is still going on. Not for the final words."""
    state.go.set()
    return state.built.wait(max(0.0, timeout_seconds))


def abandon_build(lock_timeout: float | None = None) -> bool:
    """BUILDING -> UNSET at exit, when nothing waits for the pipeline: the build goes on in its daemon thread, but
    nobody waits for it and its result is not used. ``True`` if a build was abandoned. With ``lock_timeout`` (a
    signal's final words: the interrupted thread may hold the lock), ``False`` if the lock is not had by then."""
    if not state.lock.acquire(timeout=-1 if lock_timeout is None else lock_timeout):
        return False
    try:
        if state.phase is not Phase.BUILDING:
            return False
        if state.builder is not None:
            state.abandoned.add(state.builder.ident)
        state.builder = None
        state.on_ready.clear()
        state.enter(Phase.UNSET, None)
    finally:
        state.lock.release()
    _notify(Phase.UNSET)
    return True


# ---- READY -> FORKED -> READY: a forked child --------------------------------------------------------------------


def after_fork_in_child() -> bool:
    """A forked child exports its own telemetry, never its parent's again; ``True`` if it is FORKED now.

    The providers the bridge built are the parent's copies: their metric storage holds the parent's cumulative
    values, their resource names the parent's pid, their exporters' connections are the parent's. They are replaced
    by placeholders that rebuild on first use (nothing is built in the fork handler, where other modules' handlers
    have not run yet, and a child that records nothing -- a DataLoader worker -- builds nothing). Providers the
    application set or gave to ``setup()`` are the application's to handle.
    """
    state.after_fork_in_child()
    current = state.current
    if state.phase is not Phase.READY or current is None or not any(current.owned.values()):
        return False
    for signal, provider in current.providers().items():
        if current.owned.get(signal):
            _compat.replace_global_provider(
                signal, provider, _placeholders.RebuildOnUse(signal, _provider_of, provider)
            )
    state.enter(Phase.FORKED, current)
    return True


def _rebuild_for_child(current: Pipeline) -> Pipeline:
    """Fresh providers, exporters and resource (``process.pid``) in the child for what the bridge built.

    In the child the parent's exporters do nothing (``_export.counting``); tracers, meters and loggers obtained from
    them before the fork stay theirs, so a child gets its own after the fork. Prometheus readers are not rebuilt: the
    parent serves that port. A failure gives the child a no-op pipeline (counted): the job goes on.
    """
    try:
        resource = _providers.resource()
        builders: dict[str, Callable[[], object]] = {
            "traces": lambda: _providers.build_tracer_provider(resource),
            "metrics": lambda: _providers.build_meter_provider(resource, pull=False),
            "logs": lambda: _providers.build_logger_provider(resource),
        }
        providers, owned = current.providers(), dict(current.owned)
        for signal, old in list(providers.items()):
            if not owned.get(signal):
                continue
            placeholder = _compat.global_provider(signal)
            if not (isinstance(placeholder, _placeholders.RebuildOnUse) and placeholder.parent_provider is old):
                owned[signal] = False  # no longer the global provider: leave it alone
                continue
            new = builders[signal]()
            _compat.replace_global_provider(signal, placeholder, new)
            providers[signal] = new
        return Pipeline(providers["traces"], providers["metrics"], providers["logs"], owned=owned, resource=resource)
    except Exception as exc:
        _logger.warning("torchelastic_otel: could not set up telemetry in a forked child: %s", exc)
        selftelemetry.count(selftelemetry.DROPPED, "all", "pipeline_unavailable")
        return _noop_pipeline()


def forked() -> bool:
    """A forked child whose pipeline is still the parent's copy."""
    return state.phase is Phase.FORKED


# ---- the public calls ----------------------------------------------------------------------------------------------


def setup(
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
    logger_provider: _logs.LoggerProvider | None = None,
) -> Pipeline:
    """Use these providers explicitly (``None``: the global one, or one built from ``OTEL_*`` if none is set).

    Call it before the first event or metric. It replaces the bridge's pipeline, never the global providers the
    application set; providers given here are the caller's to shut down.
    """
    if state.phase is Phase.FORKED:
        get_pipeline()  # a forked child: the bridge's own providers first become the child's
    base = _from_environment() if None in (tracer_provider, meter_provider, logger_provider) else None
    # base is read only for a provider not given, and then it was built (the ignores: mypy cannot see that)
    return _ready(
        Pipeline(
            tracer_provider if tracer_provider is not None else base.tracer_provider,  # type: ignore[union-attr]
            meter_provider if meter_provider is not None else base.meter_provider,  # type: ignore[union-attr]
            logger_provider if logger_provider is not None else base.logger_provider,  # type: ignore[union-attr]
            owned={} if base is None else dict(base.owned),
            resource=None if base is None else base.resource,
        )
    )


def prepare() -> None:
    """Make the bridge's providers the global ones now, before the application starts spans: build the pipeline,
    unless a build is in progress (placeholders already stand in for the global providers)."""
    if state.phase is not Phase.BUILDING:
        get_pipeline()


def flush(timeout_millis: int = 5000) -> bool:
    """Export everything recorded so far (drains the bridge's buffers first); never raises. ``True`` on success.

    A build in progress is waited for (half of the time at most); a forked child that recorded nothing of its own,
    or a process that never built a pipeline and buffered nothing, has nothing to deliver.
    """
    timeout_millis = max(0, timeout_millis)
    deadline = time.monotonic() + timeout_millis / 1000
    if state.phase is Phase.BUILDING:
        state.built.wait(timeout_millis / 2000)
    if state.phase in (Phase.FORKED, Phase.UNSET):
        _drainer.drain_all(time.monotonic() + timeout_millis / 2000)  # something recorded builds the pipeline
        if state.phase is not Phase.READY:
            return True
    current = ready()
    if current is None:
        return False  # still being built: nothing could be delivered in time
    return current.flush(max(0, int((deadline - time.monotonic()) * 1000)))


def shutdown() -> None:
    """Flush and shut down the providers the bridge built; the next event builds a fresh pipeline."""
    if state.phase is Phase.FORKED:
        _drainer.drain_all()
    with state.lock:
        current = state.current if state.phase is Phase.READY else None
        state.builder = None
        state.enter(Phase.UNSET, None)
    _notify(Phase.UNSET)
    if current is not None:
        current.shutdown()


def renew() -> None:
    """Flush and shut down the providers the bridge built, and let the next use build fresh ones from the
    environment as it is then: a launcher's next run in the same process (``run.main`` called again) gets a
    resource with its own run id. Unlike :func:`shutdown`, the bridge's providers stop being the global ones
    (placeholders that build on use stand in again), so the next build sets its own rather than reusing them."""
    abandon_build()
    flush()  # what the bridge buffered of the run before goes out with that run's resource
    with state.lock:
        current = state.current if state.phase is Phase.READY else None
        if current is not None:
            for signal, provider in current.providers().items():
                if current.owned.get(signal):
                    _compat.replace_global_provider(signal, provider, _placeholders.BuildOnUse(signal, _provider_of))
    shutdown()


def _reset_for_tests() -> None:
    """Forget the pipeline without touching providers (tests install their own), and any placeholders; what the
    buffers hold goes to that pipeline first, as ``forget`` flushes first: drained later, it would build a pipeline
    of its own from the environment (OTLP to localhost:4317 by default), whose exit flush waits out its timeout."""
    _drainer.drain_all()
    with state.lock:
        for signal in _SIGNALS:
            current = _compat.global_provider(signal)
            if isinstance(current, _placeholders.Placeholder):
                _compat.replace_global_provider(signal, current, None)
        state.builder = None
        state.on_ready.clear()
        state.enter(Phase.UNSET, None)
