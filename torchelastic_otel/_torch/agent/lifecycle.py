"""The agent's lifecycle as a trace: one span per run, attempt, rendezvous round, worker-group start, detected
failure, restart and stop -- never one per monitor tick.

Span tree of a run with one restart::

    torchelastic.run                      (SimpleElasticAgent.run; trace id derived from the run id)
    ├── torchelastic.attempt #0           (from rendezvous until the attempt's workers are stopped)
    │   ├── torchelastic.rendezvous       (rendezvous events as span events)
    │   ├── torchelastic.workers.start    (TRACEPARENT of the attempt goes to the workers)
    │   │   worker spans / logs ........ children of the attempt, carried by TRACEPARENT
    │   └── torchelastic.workers.failure  (status ERROR; one span event per failed rank)
    ├── torchelastic.restart #1           (span + "torchelastic.restart" event, restart count)
    │   ├── torchelastic.workers.stop
    │   └── torchelastic.attempt #1 ...
    └── torchelastic.agent.shutdown

All agents of a run (one per node) derive the same trace id from the run id, so a multi-node job is one trace:
their run spans hang under a synthetic remote parent whose ids are a hash of the run id (a run id of ``none``,
torchrun's default, is not unique, so such runs get a fresh trace id). When the launching code already has a
current span, the run nests under it instead.

Goodput: the agent counts the seconds when its ranks have no worker process in ``torchelastic.goodput.time``
{``cause``}: ``rendezvous`` (each rendezvous round) and ``restart`` (a failure detected, or a restart begun, to the
next attempt's workers starting, less the rendezvous round inside), each times its local workers (rank-seconds).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from torchelastic_otel import _compat, pipeline
from torchelastic_otel import _names as names
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._export import attributes as _attributes
from torchelastic_otel._process.start import process_start_ns
from torchelastic_otel._torch import final_words, root_cause, tracebacks
from torchelastic_otel._torch.patches import Patches
from torchelastic_otel.events import _otel as event_adapter
from torchelastic_otel.events.api import Event, EventSource
from torchelastic_otel.metrics.api import MetricData
from torchelastic_otel.version import __version__

SCOPE = "torchelastic_otel"
_propagator = TraceContextTextMapPropagator()


def _tracer() -> trace.Tracer:
    return pipeline.get_pipeline().tracer_provider.get_tracer(SCOPE, __version__)


def run_parent_context(run_id: str) -> otel_context.Context | None:
    """The context the run span starts in: the caller's span if any, else a parent derived from ``run_id``."""
    if trace.get_current_span().get_span_context().is_valid:
        return None
    if not run_id or run_id == "none":
        return None
    digest = hashlib.sha256(f"torchelastic-otel/run/{run_id}".encode()).digest()
    trace_id = int.from_bytes(digest[:16], "big") or 1
    span_id = int.from_bytes(digest[16:24], "big") or 1
    parent = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return trace.set_span_in_context(NonRecordingSpan(parent))


class _AgentState:
    """Per-agent tracing state (kept on the agent instance)."""

    __slots__ = ("run", "attempt", "last_state", "failure_seen", "run_attributes", "restart_from", "restart_rdzv")

    def __init__(self) -> None:
        self.run: trace.Span | None = None
        self.attempt: trace.Span | None = None
        self.last_state = ""
        self.failure_seen = False
        self.run_attributes: dict[str, Any] = {}
        #: goodput: when the restart under way began (a failure detected, else the restart's start; monotonic
        #: seconds, ``None`` when none is), and the seconds of rendezvous rounds since (counted as rendezvous).
        self.restart_from: float | None = None
        self.restart_rdzv = 0.0


def _state(agent: object) -> _AgentState:
    state = agent.__dict__.get("_torchelastic_otel_state")
    if state is None:
        state = _AgentState()
        agent.__dict__["_torchelastic_otel_state"] = state
    return state


def _spec(agent: object) -> Any:
    return _compat.agent_spec(agent)


def _remaining_restarts(agent: object) -> int:
    """Restarts left (0 where torch no longer says: counted by ``_compat``)."""
    return _compat.agent_remaining_restarts(agent) or 0


def _restart_count(agent: object) -> int:
    """This attempt's restart number: ``max_restarts`` minus the restarts left (0 where either is unknown)."""
    spec, remaining = _spec(agent), _compat.agent_remaining_restarts(agent)
    if spec is None or remaining is None:
        return 0
    try:
        return int(spec.max_restarts - remaining)
    except (TypeError, ValueError):
        return 0


def _safe(fn: Callable[..., object], *args: object) -> Any:
    """Run a telemetry step; a failure is counted, never raised into the agent."""
    try:
        return fn(*args)
    except Exception:
        selftelemetry.count(selftelemetry.DROPPED, "traces", "lifecycle_error")
        return None


def _end_attempt(state: _AgentState) -> None:
    attempt, state.attempt = state.attempt, None
    if attempt is not None:
        attempt.end()


def _run_attributes(agent: object) -> dict[str, object]:
    spec = _spec(agent)
    rdzv = spec.rdzv_handler
    attributes = {
        names.RUN_ID: str(rdzv.get_run_id()),
        names.ROLE: str(spec.role),
        names.RDZV_BACKEND: str(rdzv.get_backend()),
        names.MAX_RESTARTS: int(spec.max_restarts),
        names.LOCAL_WORLD_SIZE: int(spec.local_world_size),
        names.ENTRYPOINT: str(spec.get_entrypoint_name()),
    }
    return _attributes.encodable_attributes(attributes, "traces")  # a run id or argv may hold lone surrogates


def _record_event(name: str, metadata: dict[str, object]) -> None:
    """Export an agent-side event (log record + span event on the current span)."""
    event_adapter.export_event(Event(name, EventSource.AGENT, metadata=metadata))


# ---- goodput: where the ranks' time goes while no worker runs ----------------------------------------------------

_GOODPUT_DESCRIPTION = (
    "Seconds of each rank by cause (rank-seconds: the agent's causes are counted once per local worker). The "
    "agent counts rendezvous (each rendezvous round) and restart (a failure detected, or a restart begun, to the "
    "next attempt's workers starting, without the rendezvous round inside); the workers count the rest"
)


#: The causes the agent counts.
_AGENT_CAUSES = ("rendezvous", "restart")


def _goodput_counter() -> Any:
    return (
        pipeline.get_pipeline()
        .meter_provider.get_meter(SCOPE, __version__)
        .create_counter(names.GOODPUT_TIME, unit="s", description=_GOODPUT_DESCRIPTION)
    )


def _goodput_start() -> None:
    """The agent's causes at 0 from the run's start: a scrape sees the series before its first seconds, so that a
    rate over a window (the recording rule) counts them -- Prometheus cannot count a series' first value."""
    counter = _goodput_counter()
    for cause in _AGENT_CAUSES:
        counter.add(0, {names.CAUSE: cause})


def _goodput_add(agent: object, cause: str, seconds: float) -> None:
    """Add ``seconds`` of the agent's time, times its local workers, to ``torchelastic.goodput.time`` {cause}."""
    workers = int(_spec(agent).local_world_size)
    if seconds <= 0 or workers <= 0:
        return
    _goodput_counter().add(seconds * workers, {names.CAUSE: cause})


def _restart_begins(state: _AgentState) -> None:
    """A failure is detected or a restart begins: the restart's time runs from the first of them."""
    if state.restart_from is None:
        state.restart_from = time.monotonic()
        state.restart_rdzv = 0.0


def _rendezvous_done(agent: object, seconds: float) -> None:
    state = _state(agent)
    if state.restart_from is not None:
        state.restart_rdzv += seconds
    _goodput_add(agent, "rendezvous", seconds)


def _workers_starting(agent: object) -> None:
    """The next attempt's workers start: the restart under way, if any, ends here (their own counters take over
    from their process's start)."""
    state = _state(agent)
    began, state.restart_from = state.restart_from, None
    if began is not None:
        _goodput_add(agent, "restart", time.monotonic() - began - state.restart_rdzv)


# ---- when a run begins ----------------------------------------------------------------------------------------

#: The launchers whose command is the run: ``python -m torch.distributed.run`` / ``torchrun`` and the bridge's own.
_LAUNCHER_MODULES = ("torch.distributed.run", "torchelastic_otel.run")
_LAUNCHER_SCRIPTS = ("torchrun", "torchelastic-otel")
_first_run = [True]


def _run_start_ns() -> int | None:
    """When the run span begins: with its process, for the first run of a launcher's command (``torchrun``,
    ``torchelastic-otel run``, also under ``opentelemetry-instrument``) -- the command's start-up (the interpreter,
    torch's import: a second or more) is the job's wall time too, and its goodput counts it; ``None`` (now) for a
    launch from a longer-lived process (a notebook, a custom launcher) and for a process's later runs."""
    first, _first_run[0] = _first_run[0], False
    if not first:
        return None
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    command = getattr(spec, "name", None) in _LAUNCHER_MODULES
    command = command or os.path.basename(sys.argv[0] if sys.argv else "") in _LAUNCHER_SCRIPTS
    return process_start_ns() if command else None


# ---- wrappers -----------------------------------------------------------------------------------------------


def _wrap_run(orig: Callable[..., object], metric_emit: Callable[[MetricData], None]) -> Callable[..., object]:
    @functools.wraps(orig)
    def run(self: object, *args: object, **kwargs: object) -> object:
        state = _state(self)
        attributes = _safe(_run_attributes, self) or {}
        state.run_attributes = attributes
        parent = _safe(run_parent_context, attributes.get(names.RUN_ID, ""))
        span = _tracer().start_span(names.RUN, context=parent, attributes=attributes, start_time=_run_start_ns())
        state.run = span
        _safe_goodput(_goodput_start)
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            result = orig(self, *args, **kwargs)
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, _attributes.encodable(f"{type(exc).__name__}: {exc}", "traces")))
            tracebacks.drop_own_frame(exc)  # the console's traceback is torch's (_torch.tracebacks)
            raise
        else:
            _safe(_finish_run, span, result)
            return result
        finally:
            _end_attempt(state)
            otel_context.detach(token)
            span.set_attribute(names.RESTART_COUNT, _restart_count(self))
            span.end()
            pipeline.flush(timeout_millis=pipeline.EXIT_TIMEOUT_MILLIS)

    return run


def _finish_run(span: trace.Span, result: Any) -> None:
    if result is None:
        return
    span.set_attribute(names.RUN_STATE, str(getattr(result.state, "name", result.state)))
    if result.is_failed():
        ranks = sorted(int(r) for r in result.failures)
        span.set_attribute(names.FAILED_RANKS, ranks)
        span.set_status(Status(StatusCode.ERROR, f"worker group failed (ranks {ranks})"))


def _wrap_initialize(orig: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(orig)
    def _initialize_workers(self: object, worker_group: object, *args: object, **kwargs: object) -> object:
        state = _state(self)
        _end_attempt(state)
        state.failure_seen = False
        restart_count = _restart_count(self)
        attempt = _tracer().start_span(
            names.ATTEMPT,
            attributes={**state.run_attributes, names.RESTART_COUNT: restart_count},
        )
        state.attempt = attempt
        with trace.use_span(attempt, end_on_exit=False, record_exception=False):
            try:
                return orig(self, worker_group, *args, **kwargs)
            except BaseException as exc:
                attempt.record_exception(exc)
                attempt.set_status(
                    Status(StatusCode.ERROR, _attributes.encodable(f"{type(exc).__name__}: {exc}", "traces"))
                )
                _end_attempt(state)
                tracebacks.drop_own_frame(exc)
                raise

    return _initialize_workers


def _wrap_span(
    name: str, orig: Callable[..., object], after: Callable[[object, float], None] | None = None
) -> Callable[..., object]:
    """A span around the call, recording an exception as the span's error; then, the span ended and whether the
    call returned or raised, ``after(agent, seconds of the call)``."""

    @functools.wraps(orig)
    def wrapper(self: object, *args: object, **kwargs: object) -> object:
        began = time.monotonic()
        try:
            state = _state(self)
            attributes = {names.RESTART_COUNT: _restart_count(self)}
            if names.RUN_ID in state.run_attributes:
                attributes[names.RUN_ID] = state.run_attributes[names.RUN_ID]
            with _tracer().start_as_current_span(name, attributes=attributes):
                return orig(self, *args, **kwargs)
        except BaseException as exc:
            tracebacks.drop_own_frame(exc)
            raise
        finally:
            if after is not None:
                after(self, time.monotonic() - began)

    return wrapper


def _rendezvous_ended(agent: object, seconds: float) -> None:
    """A rendezvous round's seconds (finished or failed) counted as goodput cause ``rendezvous``."""
    _safe_goodput(_rendezvous_done, agent, seconds)


def _safe_goodput(fn: Callable[..., object], *args: object) -> None:
    """A goodput step: a failure is counted (``torchelastic_otel.dropped`` {metrics, goodput_error}), never raised."""
    try:
        fn(*args)
    except Exception:
        selftelemetry.count(selftelemetry.DROPPED, "metrics", "goodput_error")


def _wrap_start(orig: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(orig)
    def _start_workers(self: object, worker_group: object, *args: object, **kwargs: object) -> object:
        state = _state(self)
        _safe_goodput(_workers_starting, self)
        with _tracer().start_as_current_span(
            names.WORKERS_START,
            attributes={names.RESTART_COUNT: _restart_count(self)},
        ) as span:
            parent = state.attempt if state.attempt is not None else span
            with _environ_for_workers(_safe(_worker_env, parent) or {}):
                try:
                    result = orig(self, worker_group, *args, **kwargs)
                except BaseException as exc:
                    tracebacks.drop_own_frame(exc)
                    raise
            if isinstance(result, dict):
                span.set_attribute(names.WORKER_PIDS, [int(p) for p in result.values() if _is_int(p)])
            return result

    return _start_workers


def _worker_env(parent: trace.Span) -> dict[str, str | None]:
    """What the workers starting now get in their environment (``None``: not set for them): the attempt's trace
    context, where to write their failures, and what ``install()`` hands down (the bootstrap on ``PYTHONPATH``)."""
    from torchelastic_otel._torch.worker_env import worker_environ

    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=trace.set_span_in_context(parent))
    return {
        **worker_environ(),
        root_cause.FAILURE_DIR_ENV: root_cause.agent_failure_dir(),
        "TRACEPARENT": carrier.get("traceparent", ""),
        "TRACESTATE": carrier.get("tracestate") or None,
    }


#: One agent at a time gives its workers their environment (agents may run in threads of one process).
_environ_lock = threading.Lock()


def _new_environ_lock() -> None:
    """A forked worker may be held by its parent's lock (fork while starting workers): it gets a free one."""
    global _environ_lock
    _environ_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_environ_lock)


@contextlib.contextmanager
def _environ_for_workers(env: dict[str, str | None]) -> Iterator[None]:
    """``env`` in ``os.environ`` while the workers start, then exactly what was there before.

    A worker inherits its environment when it starts -- a script's subprocess, and a function's spawned or forked
    process alike -- and a spawned interpreter reads ``PYTHONPATH`` before torch passes it anything, so the
    environment of the start is where these go; they are never left in the launching process's ``os.environ``.
    """
    with _environ_lock:
        saved = {key: os.environ.get(key) for key in env}
        try:
            _put(env)
            yield
        finally:
            _put(saved)


def _put(env: dict[str, str | None]) -> None:
    """``env`` into ``os.environ``: a ``None`` value unsets its variable."""
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _is_int(value: Any) -> bool:
    try:
        int(value)
        return True
    except (TypeError, ValueError):
        return False


def _wrap_monitor(orig: Callable[..., Any]) -> Callable[..., object]:
    @functools.wraps(orig)
    def _monitor_workers(self: object, worker_group: object, *args: object, **kwargs: object) -> object:
        try:
            result = orig(self, worker_group, *args, **kwargs)
        except BaseException as exc:
            tracebacks.drop_own_frame(exc)
            raise
        _safe(_observe_monitor, self, worker_group, result)
        if str(getattr(result.state, "name", result.state)) in ("FAILED", "SUCCEEDED"):
            _safe(_deliver_final_words)
        return result

    return _monitor_workers


def _deliver_final_words() -> None:
    """What stopped or failed workers could not send themselves (``final_words``), sent now that they are gone."""
    final_words.deliver(root_cause.failure_dir(), pipeline.get_pipeline())


def _observe_monitor(agent: object, worker_group: object, result: Any) -> None:
    state = _state(agent)
    name = str(getattr(result.state, "name", result.state))
    state.last_state = name
    if name not in ("FAILED", "UNHEALTHY") or state.failure_seen:
        return
    state.failure_seen = True
    _safe_goodput(_restart_begins, state)
    parent = state.attempt
    ctx = trace.set_span_in_context(parent) if parent is not None else None
    failures = getattr(result, "failures", {}) or {}
    ranks = sorted(int(r) for r in failures)
    span = _tracer().start_span(
        names.WORKERS_FAILURE,
        context=ctx,
        attributes={
            names.STATE: name,
            names.FAILED_RANKS: ranks,
            names.RESTART_COUNT: _restart_count(agent),
            names.REMAINING_RESTARTS: _remaining_restarts(agent),
        },
    )
    with trace.use_span(span, end_on_exit=True):
        for rank, failure in sorted(failures.items()):
            error_data = getattr(failure, "error_file_data", None)
            _record_event(
                names.WORKER_FAILURE,
                {
                    "state": "FAILED",
                    "run_id": state.run_attributes.get(names.RUN_ID),
                    "role": state.run_attributes.get(names.ROLE),
                    "global_rank": int(rank),
                    "local_rank": getattr(failure, "local_rank", None),
                    "exit_code": getattr(failure, "exitcode", None),
                    "worker_pid": getattr(failure, "pid", None),
                    "signal": _signal_name(failure),
                    "raw_error": _raw_error(failure, error_data),
                    "restart_count": _restart_count(agent),
                },
            )
        _safe(_report_root_cause, agent, state, worker_group, failures)
        span.set_status(Status(StatusCode.ERROR, f"{name}: ranks {ranks}"))
    if parent is not None:
        parent.set_status(Status(StatusCode.ERROR, f"worker group {name.lower()}"))


def _report_root_cause(agent: object, state: _AgentState, worker_group: object, failures: dict[int, object]) -> None:
    """The attempt's first failure (``root_cause``): a ``torchelastic.root_cause`` record (ERROR, timestamped when
    the rank failed), the same attributes on the attempt and run spans, and the ``torchelastic.root_cause.time``
    gauge, whose lowest value over every agent of a run names the job's first failure (one PromQL query)."""
    failed = {int(rank) for rank in failures}
    running = {int(w.global_rank): w for w in getattr(worker_group, "workers", ()) if int(w.global_rank) not in failed}
    cause = root_cause.find(failures, sorted(running), root_cause.failure_dir(), running)
    if cause is None:
        return
    host = _attributes.encodable(socket.gethostname(), "traces")  # as OTel's host.name (getfqdn may say localhost)
    # The exception's message and traceback come back from the worker's file and may hold lone surrogates.
    attributes = _attributes.encodable_attributes({**root_cause.attributes(cause), "host.name": host}, "traces")
    restart_count = _restart_count(agent)
    metadata = {
        "state": "FAILED",
        "run_id": state.run_attributes.get(names.RUN_ID),
        "role": state.run_attributes.get(names.ROLE),
        "restart_count": restart_count,
    }
    event = Event(names.ROOT_CAUSE, EventSource.AGENT, cause.time_unix_nano // 1_000_000, metadata)
    event_adapter.export_event(event, attributes)
    for span in (state.attempt, state.run):
        if span is not None:
            span.set_attributes(attributes)
    gauge = (
        pipeline.get_pipeline()
        .meter_provider.get_meter(SCOPE, __version__)
        .create_gauge(names.ROOT_CAUSE_TIME, unit="s", description="When the first failed rank of an attempt failed")
    )
    gauge.set(
        cause.time_unix_nano / 1e9,
        {
            names.RUN_ID: str(metadata["run_id"] or ""),
            names.ROLE: str(metadata["role"] or ""),
            names.RESTART_COUNT: restart_count,
            names.ROOT_CAUSE_RANK: cause.rank,
            names.ROOT_CAUSE_REASON: cause.reason,
            "host.name": host,
        },
    )


def _signal_name(failure: Any) -> str | None:
    try:
        name = failure.signal_name()
        return None if name in ("", "<N/A>") else name
    except Exception:
        return None


def _raw_error(failure: object, error_data: object) -> str | None:
    import json

    if isinstance(error_data, dict) and error_data:
        return json.dumps(error_data)
    message = getattr(failure, "message", None)
    return str(message) if message else None


def _wrap_restart(orig: Callable[..., object], metric_emit: Callable[[MetricData], None]) -> Callable[..., object]:
    @functools.wraps(orig)
    def _restart_workers(self: object, worker_group: object, *args: object, **kwargs: object) -> object:
        state = _state(self)
        _safe_goodput(_restart_begins, state)
        restart_count = _restart_count(self)
        reason = "failure" if state.last_state in ("FAILED", "UNHEALTHY") else "membership_change"
        role = str(getattr(_spec(self), "role", "default"))
        attributes: dict[str, str | int] = {
            names.RESTART_COUNT: restart_count,
            names.RESTART_REASON: reason,
            names.REMAINING_RESTARTS: _remaining_restarts(self),
        }
        with _tracer().start_as_current_span(names.RESTART, attributes=attributes):
            _safe(
                _record_event,
                names.RESTART,
                {
                    "state": "RESTART",
                    "run_id": state.run_attributes.get(names.RUN_ID),
                    "role": role,
                    "restart_count": restart_count,
                    "reason": reason,
                    "remaining_restarts": attributes[names.REMAINING_RESTARTS],
                },
            )
            _safe(metric_emit, MetricData(time.time(), "torchelastic", f"workers.{role}.restarts", 1))
            try:
                return orig(self, worker_group, *args, **kwargs)
            except BaseException as exc:
                tracebacks.drop_own_frame(exc)
                raise

    return _restart_workers


def _workers_stopped(agent: object, seconds: float) -> None:
    """What the stopped workers could not send themselves is sent (``final_words``); the attempt ends."""
    _safe(_deliver_final_words)
    _end_attempt(_state(agent))


def _agent_shut_down(agent: object, seconds: float) -> None:
    """What the last workers could not send themselves is sent (``final_words``)."""
    _safe(_deliver_final_words)


def install(patches: Patches, metric_emit: Callable[[MetricData], None]) -> None:
    """Wrap the agent methods (on the classes that define them) with the lifecycle spans."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    def wrap(cls: type, name: str, make: Callable[[Callable[..., object]], Callable[..., object]]) -> None:
        original = _compat.agent_method(cls, name)
        if original is None or getattr(original, "__torchelastic_otel__", False):
            return
        wrapped = make(original)
        wrapped.__torchelastic_otel__ = True  # type: ignore[attr-defined]
        patches.set(cls, name, wrapped)

    patches.on_restore(root_cause.discard_failure_dir)  # made when the first workers start (``_worker_env``)
    wrap(SimpleElasticAgent, "run", lambda f: _wrap_run(f, metric_emit))
    wrap(SimpleElasticAgent, "_initialize_workers", _wrap_initialize)
    wrap(SimpleElasticAgent, "_rendezvous", lambda f: _wrap_span(names.RENDEZVOUS, f, _rendezvous_ended))
    wrap(SimpleElasticAgent, "_restart_workers", lambda f: _wrap_restart(f, metric_emit))
    wrap(LocalElasticAgent, "_start_workers", _wrap_start)
    wrap(LocalElasticAgent, "_monitor_workers", _wrap_monitor)
    wrap(LocalElasticAgent, "_stop_workers", lambda f: _wrap_span(names.WORKERS_STOP, f, _workers_stopped))
    wrap(LocalElasticAgent, "_shutdown", lambda f: _wrap_span(names.AGENT_SHUTDOWN, f, _agent_shut_down))
