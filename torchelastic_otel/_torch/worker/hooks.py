"""Worker-process side of the bridge: join the agent's trace, and flush before the process dies.

A torchrun worker is recognised by ``RANK`` and ``TORCHELASTIC_RUN_ID`` in its environment. Its resource already
carries the run, role and ranks (``torchelastic_otel.resource``). Here:

- the agent's ``TRACEPARENT`` (the attempt span) becomes the current context, so the worker's spans and logs are
  children of the agent's span for that attempt; a short ``torchelastic.worker.start`` span marks the worker in
  the trace even if it records nothing itself;
- SIGTERM (how the agent stops workers) exports a ``torchelastic.worker.terminated`` record with the Python stack
  of every thread and flushes before the process ends -- also when the rank is blocked in native code (a
  collective, ``init_process_group``), where a Python handler would not run before the agent's SIGKILL
  (``_process.signals``); the process then dies of SIGTERM as it would without the bridge. While ``import torch``
  loads torch's C++ libraries, when no Python can run, the stacks are written from C and the agent sends the record
  (``_stop_in_c_while_torch_loads``);
- an uncaught exception is exported as a ``torchelastic.worker.exception`` event (ERROR, with the traceback) and
  flushed at once: after gloo use the interpreter may abort at exit before ``atexit`` would run; a CUDA
  out-of-memory error's carries the allocator's figures for its device (``memory.oom_figures``);
- Python ``logging`` records become log records (``worker_logging``). The worker's stdout and stderr are captured
  earlier, at interpreter start-up (``output``, from the bootstrap ``sitecustomize``): not here, because
  ``install()`` may run in a process that is no torchrun worker process of its own (tests, a launcher).
"""

from __future__ import annotations

import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context

from torchelastic_otel import _names as names
from torchelastic_otel import pipeline
from torchelastic_otel._export import attributes as _attributes
from torchelastic_otel._export import drainer as _drainer
from torchelastic_otel._process import runtime
from torchelastic_otel._process import stacks as _stacks
from torchelastic_otel._process.start import process_start_ns as _process_start_ns
from torchelastic_otel._torch import final_words, imports, root_cause
from torchelastic_otel._torch.patches import Patches
from torchelastic_otel._torch.worker import log_records as worker_logging
from torchelastic_otel._torch.worker import memory as worker_memory
from torchelastic_otel._torch.worker import training
from torchelastic_otel._torch.worker_env import agent_context, is_torchrun_worker, worker_metadata
from torchelastic_otel.events import _otel as event_adapter
from torchelastic_otel.events.api import Event, EventSource
from torchelastic_otel.version import __version__

#: How long a dying worker may spend flushing (the agent SIGKILLs after its shutdown timeout, 30 s by default).
FLUSH_TIMEOUT_MILLIS = pipeline.EXIT_TIMEOUT_MILLIS


__all__ = ["install", "is_torchrun_worker", "attempt_context"]


class _Worker:
    """What this worker keeps for its final words, in one place: the attempt it joined, the logger they write to
    (at hand before a signal lands: they obtain nothing), what else they carry, and what they emitted that is not
    yet known to have gone out."""

    def __init__(self) -> None:
        self.attempt: object = None
        self.final_logger: Any = None
        self.final_extras: list[Any] = []  # the training telemetry's collectives summary (``add_final_metadata``)
        self.emitted: list[str] = []  # final words emitted and kept for the agent
        self.start_span: tuple[str, int | None, int, dict[str, Any]] | None = None  # name, start, end, attributes
        self.span = _SpanOwner()


class _SpanOwner:
    """Who sends the worker's start span: the pipeline once READY, unless a native stop's file holds it.

    While ``import torch`` runs with SIGTERM handled in C (:func:`_stop_in_c_while_torch_loads`), the file the agent
    would turn into the terminated record carries the start span too. A pipeline that becomes READY in that stretch
    (another thread of the script asked for it) then leaves the span to the file until the stretch ends: a stop in
    C has the agent send it, else it goes out through the pipeline once the import is over -- once either way."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held = False
        self._deferred: list[Callable[[], object]] = []

    def hold(self) -> None:
        with self._lock:
            self._held = True

    def send(self, send: Callable[[], object]) -> None:
        """``send()`` now, or when :meth:`release` ends the hold."""
        with self._lock:
            if self._held:
                self._deferred.append(send)
                return
        send()

    def release(self) -> None:
        """End the hold; what waited for it goes out now (in the caller's thread)."""
        with self._lock:
            self._held = False
            deferred, self._deferred = self._deferred, []
        for send in deferred:
            try:
                send()
            except Exception:
                pass  # as a failed READY callback: the span is lost, the worker goes on


_worker = _Worker()


def attempt_context() -> object:
    """The context of the agent's attempt span this worker joined (``None`` if it joined none)."""
    return _worker.attempt


def add_final_metadata(source: object) -> object:
    """Let ``source()`` add attributes to the final records; returns how to take it back (``patches.on_restore``)."""
    _worker.final_extras.append(source)
    return lambda: _worker.final_extras.remove(source) if source in _worker.final_extras else None


def _final_metadata() -> dict[str, object]:
    metadata = worker_metadata()
    for source in list(_worker.final_extras):
        try:
            metadata.update(source())
        except Exception:
            pass  # the final records go out without it
    return metadata


def _join_agent_trace(patches: Patches) -> None:
    ctx = agent_context()
    if ctx is None:
        return
    start_ns, end_ns = _process_start_ns(), time.time_ns()
    attributes = {f"torchelastic.{k}": str(v) for k, v in worker_metadata().items() if v is not None}

    def start_span() -> None:
        tracer = pipeline.get_pipeline().tracer_provider.get_tracer("torchelastic_otel", __version__)
        tracer.start_span(names.WORKER_START, context=ctx, start_time=start_ns, attributes=attributes).end(
            end_time=end_ns
        )

    def hand_to_agent() -> bool:
        """An exit before the pipeline was built: the agent sends the span (``final_words``), if there is one."""
        return final_words.write_span(names.WORKER_START, start_ns, end_ns, attributes, ctx) is not None

    def hand_records_to_agent() -> bool:
        """The events and log records buffered for the pipeline, kept for the agent the same way."""
        return _drainer.hand_over_all(lambda fields, record_ctx: final_words.write(fields, record_ctx or ctx))

    _worker.start_span = (names.WORKER_START, start_ns, end_ns, attributes)
    pipeline.when_ready(lambda: _worker.span.send(start_span))  # built beside the worker's start-up (``pipeline``)
    if final_words.has_agent():  # else an exit waits for the build: nobody would send what it handed over
        runtime.add_unbuilt_exit_hook(hand_to_agent)
        runtime.add_unbuilt_exit_hook(hand_records_to_agent)
        patches.on_restore(lambda: runtime.remove_unbuilt_exit_hook(hand_to_agent))
        patches.on_restore(lambda: runtime.remove_unbuilt_exit_hook(hand_records_to_agent))
    token = otel_context.attach(ctx)
    _worker.attempt = ctx

    def leave() -> None:
        _worker.attempt = None
        otel_context.detach(token)

    patches.on_restore(leave)


def _keep_final_logger(_phase: object = None) -> None:
    """Whenever a pipeline becomes READY, the logger the final words write to is at hand: they obtain nothing."""
    current = pipeline.ready()
    _worker.final_logger = (
        None if current is None else current.logger_provider.get_logger("torchelastic_otel.worker", __version__)
    )


def _final_words(event: Event, extra: dict[str, Any] | None = None) -> str | None:
    """Keep ``event`` for the agent (``final_words``), then emit it straight to the SDK if the pipeline is READY
    (not through the buffers, whose drain lock the interrupted thread may hold); the kept file's path.

    Never builds, imports or waits for the pipeline: a rank may be stopped while its pipeline is being built.
    Where there is nowhere to keep it (a worker of an agent that is not bridged), a build in progress is waited
    for, within half of the exit bound.
    """
    fields = event_adapter.to_log_fields(event)
    fields["attributes"].update(_attributes.encodable_attributes(extra, "logs") if extra else {})  # code.file.path
    ctx = _worker.attempt
    path = final_words.write(fields, ctx)
    if path is None:
        pipeline.wait_built(FLUSH_TIMEOUT_MILLIS / 2000)  # at once unless a build (or its READY callbacks) goes on
    logger = _worker.final_logger
    if pipeline.ready() is None or logger is None:
        return path
    try:
        logger.emit(context=ctx, **fields)
        if path is not None:
            _worker.emitted.append(path)
    except Exception:
        from torchelastic_otel import _selftelemetry as selftelemetry

        selftelemetry.count(selftelemetry.DROPPED, "logs", "final_words_error")
    return path


def _confirm() -> Any:
    """Call before a final flush; what to call with its outcome: every record emitted before it went out if it
    succeeded, so the agent does not send them again (whichever of the final flushes -- excepthook, SIGTERM --
    gets through)."""
    before = list(_worker.emitted)

    def confirm(delivered: bool) -> None:
        if delivered:
            for path in before:
                final_words.delivered(path)
                if path in _worker.emitted:
                    _worker.emitted.remove(path)

    return confirm


def _terminated_record(signum: int, stacks: _stacks.Stacks) -> object:
    """Where the rank was when it was stopped: every thread's stack, main thread first, and the line of the user's
    code the main thread was in (``code.*``: for a rank blocked in ``all_reduce``, the line that called it)."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = str(signum)
    metadata = {**_final_metadata(), "state": "TERMINATED", "signal": name}
    if stacks.text:
        metadata.update(stack=stacks.text, stack_threads=stacks.threads)
    frame = stacks.user_frame
    code = {}
    if frame is not None:
        code = {"code.file.path": frame.path, "code.line.number": frame.line, "code.function.name": frame.function}
    _final_words(Event(names.WORKER_TERMINATED, EventSource.WORKER, metadata=metadata), code)
    return _confirm()


def _install_sigterm(patches: Patches) -> None:
    """The terminated record and a flush on SIGTERM, then death by SIGTERM (``runtime.on_signal``)."""
    runtime.add_signal_hook(_terminated_record)
    patches.on_restore(lambda: runtime.remove_signal_hook(_terminated_record))
    if runtime.handle_sigterm():
        patches.on_restore(runtime.uninstall_sigterm)


def _stop_in_c_while_torch_loads(patches: Patches) -> None:
    """While ``import torch`` runs, a SIGTERM is handled in C (``runtime.sigterm_in_c``): torch's import loads its
    C++ libraries holding the GIL (docs/performance.md), during which no Python runs -- the watcher's final words
    would wait for the load to end, and the rank die that much later than under plain torchrun. So for the import, the
    stacks go to a file the agent turns into the terminated record (with the start span: ``final_words``), and the
    process dies at once. Only for a worker of a bridged agent (someone reads the file) that has nothing of its own
    to flush when the import begins (no pipeline READY, nothing buffered); before and after the import, the watcher
    handles it."""
    if not final_words.has_agent():
        return
    held: list[tuple[str, object]] = []

    def before() -> None:
        metadata = {**_final_metadata(), "state": "TERMINATED", "signal": "SIGTERM"}
        threads = {thread.ident: thread.name for thread in threading.enumerate() if thread.ident is not None}
        _worker.span.hold()  # before the check of sigterm_in_c: a pipeline READY after it leaves the span to the file
        entered = False
        try:
            opened = final_words.open_for_native_stop(metadata, _worker.attempt, _worker.start_span, threads)
            if opened is not None:
                entered = runtime.sigterm_in_c(opened[1])
                if entered:
                    held.append(opened)
                else:
                    _discard(opened)
        finally:
            if not entered:
                _worker.span.release()

    def after() -> None:
        if not held:
            return
        _worker.span.release()  # sent while SIGTERM still ends the process in C: a stop now has the file send it
        runtime.sigterm_in_python()
        while held:
            _discard(held.pop())

    if imports.around("torch", before, after):
        patches.on_restore(lambda: imports.cancel_around("torch", before))


def _discard(opened: tuple[str, Any]) -> None:
    path, fh = opened
    try:
        fh.close()
    except Exception:
        pass
    final_words.delivered(path)


def _install_excepthook(patches: Patches) -> None:
    previous = sys.excepthook

    def excepthook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        try:
            if not issubclass(exc_type, KeyboardInterrupt):
                cuda_memory = worker_memory.oom_figures(exc)  # a CUDA OOM's allocator figures, else None
                root_cause.write_failure(exc_type, exc, tb, cuda_memory)  # first: the agent ranks the failures by it
                text = "".join(traceback.format_exception(exc_type, exc, tb))
                metadata = {**_final_metadata(), "state": "FAILED", "raw_error": text}
                oom = worker_memory.oom_attributes(cuda_memory)
                _final_words(Event(names.WORKER_EXCEPTION, EventSource.WORKER, metadata=metadata), oom or None)
                confirm = _confirm()
                confirm(runtime.final_flush(FLUSH_TIMEOUT_MILLIS))
        except Exception:
            pass
        previous(exc_type, exc, tb)

    sys.excepthook = excepthook
    patches.on_restore(lambda: setattr(sys, "excepthook", previous) if sys.excepthook is excepthook else None)


def install(patches: Patches) -> None:
    """Set up a torchrun worker (no-op in other processes)."""
    if not is_torchrun_worker():
        return
    _join_agent_trace(patches)
    pipeline.add_listener(_keep_final_logger)
    patches.on_restore(lambda: pipeline.remove_listener(_keep_final_logger))
    _keep_final_logger()
    _install_sigterm(patches)
    _stop_in_c_while_torch_loads(patches)
    _install_excepthook(patches)
    worker_logging.install(patches, attempt_context)
    training.install(patches, add_final_metadata)  # steps, stragglers, stalls; the final records carry its summary
