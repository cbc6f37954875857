"""Checkpoints of a worker: every save and load becomes a span in the attempt's trace, with no code change.

What is wrapped (``install``: once the script imports torch / ``torch.distributed.checkpoint``, post-import hooks
of ``imports``; installing imports no torch; ``uninstall()`` puts torch's functions back):

- ``torch.distributed.checkpoint``: ``save``, ``async_save``, ``load`` and the deprecated ``save_state_dict`` /
  ``load_state_dict``, where the package and its ``state_dict_saver`` / ``state_dict_loader`` modules hold them;
- ``torch.save`` / ``torch.load`` when the file is a path (``str``, ``os.PathLike``) or a file object with a name
  (``open(...)``, a named temporary file): the path Hugging Face's ``Trainer`` takes. Never an in-memory buffer
  (``io.BytesIO``): torch and DCP serialise through those all the time;
- Lightning's ``TorchCheckpointIO.save_checkpoint`` / ``load_checkpoint`` (``lightning.fabric`` and the standalone
  ``lightning_fabric``): ``ModelCheckpoint`` and ``Trainer.save_checkpoint`` serialise with ``torch.save`` into an
  ``io.BytesIO`` and write its bytes with fsspec, which the ``torch.save`` wrapper never sees as a file. Calls on the
  main thread only (``AsyncCheckpointIO`` writes from a thread of its own, while the training loop goes on).

Only the outermost call of a thread counts (DCP's own ``torch.save`` calls inside a ``save`` are part of it), and so
do not calls torch makes itself off the main thread (DCP's writer threads, ``async_save``'s background ``save``):
they are the inside of a checkpoint already counted. Inside a compiled region (``torch.compiler.is_compiling()``)
the call goes straight to torch's.

Each counted call is a span ``torchelastic.checkpoint.save`` / ``.load`` in the agent's attempt trace (or the
current span, where it belongs to that trace), from the call to its return, with ``torchelastic.checkpoint.api``
(``torch.distributed.checkpoint.save``, ``torch.save``...), ``.step`` (the steps this rank had ended when the call
began, ``steps``), ``.bytes`` where cheap to know (``torch.save`` / ``torch.load``: the file's size or the bytes
written to the file object; DCP: the files of the checkpoint's directory, all ranks' together) and, for a save,
``.async``. An exception sets the span's status to ERROR and is raised unchanged. Histogram
``torchelastic.checkpoint.duration`` (s, ``operation`` = save | load) records every call (for ``async_save``: the part
that blocks the training loop) and gauge ``torchelastic.worker.checkpoint.step`` the step of the last completed save
(``async_save``: when its future completes successfully).

The anatomy of a step (``anatomy``) hears of the blocking part (``checkpoint_enter`` / ``checkpoint_exit``) and of a
save that is durably complete (``checkpoint_committed``: right after a save returns; for ``async_save``, when its
future completes successfully).

Cost, on the calling thread: a few microseconds, and a ``stat`` or a directory listing once torch's call returned
(the checkpoint's size, taken then: a later save may replace it). The span, the step and the metrics are made on the
drainer's thread (``_export.drainer``: within 0.5 s, before a metric collection, at every flush and at exit), so a
checkpoint never waits for the pipeline or the step buffer's lock. Nothing of the bridge's ever raises into the job
(counted: ``torchelastic_otel.dropped``).
"""

from __future__ import annotations

import bisect
import functools
import io
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from torchelastic_otel import _compat
from torchelastic_otel import _names as names
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._export import drainer as _drainer
from torchelastic_otel._export.meters import PerPipeline
from torchelastic_otel._torch import tracebacks, worker_env
from torchelastic_otel._torch.patches import Patches
from torchelastic_otel._torch.worker import anatomy

__all__ = ["install", "SAVE", "LOAD", "DCP", "DCP_SAVER", "DCP_LOADER"]


SAVE, LOAD = "save", "load"
DCP = "torch.distributed.checkpoint"
#: Where torch defines DCP's functions (the package re-exports them); torch internals, see ``_dcp_modules``.
DCP_SAVER = DCP + ".state_dict_saver"
DCP_LOADER = DCP + ".state_dict_loader"
#: The files and directories listed at most to size a DCP checkpoint's directory (else no ``bytes``).
MAX_DIR_ENTRIES = 10_000
#: Checkpoint calls buffered between two drains before new ones are turned away (and counted).
MAX_PENDING = 1024
#: Lightning's checkpoint IO modules (``lightning`` and the standalone ``lightning_fabric``): ``TorchCheckpointIO``.
LIGHTNING_IO = ("lightning.fabric.plugins.io.torch_io", "lightning_fabric.plugins.io.torch_io")
#: The semantic-conventions attribute of a failed call on the duration histogram.
ERROR_TYPE = "error.type"

_local = threading.local()  # .depth: a counted call of this thread is under way


# ---- installing --------------------------------------------------------------------------------------------------


def install(patches: Patches) -> None:
    """Wrap torch's checkpoint functions once the script imports them (see the module's docstring)."""
    from torchelastic_otel._torch import imports

    def on_torch(module: object) -> None:
        _patch_torch(patches, module)

    def on_dcp(module: object) -> None:
        _patch_dcp(patches, module)

    def on_lightning(module: object) -> None:
        _patch_lightning(patches, module)

    imports.when_imported("torch", on_torch)
    imports.when_imported(DCP, on_dcp)
    for name in LIGHTNING_IO:
        imports.when_imported(name, on_lightning)

    def undo() -> None:
        imports.cancel("torch", on_torch)
        imports.cancel(DCP, on_dcp)
        for name in LIGHTNING_IO:
            imports.cancel(name, on_lightning)

    patches.on_restore(undo)


def _patch_torch(patches: Patches, torch: object) -> None:
    """``torch.save`` / ``torch.load``, and the same functions in ``torch.serialization``, where they are defined: a
    wrapper is pickled by its name there (``ProcessPoolExecutor.submit(torch.save, ...)``), which must be it."""
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    serialization = sys.modules.get("torch.serialization")
    for attribute, kind, target in (("save", SAVE, _torch_save_target), ("load", LOAD, _torch_load_target)):
        original = getattr(torch, attribute, None)
        if original is None or getattr(original, "__torchelastic_otel__", False):
            continue
        wrapper = _wrap(original, kind, f"torch.{attribute}", target, is_compiling, files_only=True)
        patches.set(torch, attribute, wrapper)
        if serialization is not None and serialization.__dict__.get(attribute) is original:
            patches.set(serialization, attribute, wrapper)


def _patch_dcp(patches: Patches, package: object) -> None:
    torch = sys.modules.get("torch")
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    owners = [package, *_dcp_modules()]
    wrappers: dict[int, object] = {}
    for attribute, kind, is_async, target in (
        ("save", SAVE, False, _dcp_target("checkpoint_id", "storage_writer", None)),
        ("async_save", SAVE, True, _dcp_target("checkpoint_id", "storage_writer", None)),
        ("save_state_dict", SAVE, False, _dcp_target(None, "storage_writer", 1)),
        ("load", LOAD, False, _dcp_target("checkpoint_id", "storage_reader", None)),
        ("load_state_dict", LOAD, False, _dcp_target(None, "storage_reader", 1)),
    ):
        found = False
        for owner in owners:
            original = owner.__dict__.get(attribute)
            if original is None:
                continue
            found = True
            if getattr(original, "__torchelastic_otel__", False):
                continue
            wrapper = wrappers.get(id(original))
            if wrapper is None:
                wrapper = _wrap(original, kind, f"{DCP}.{attribute}", target, is_compiling, is_async=is_async)
                wrappers[id(original)] = wrapper
            patches.set(owner, attribute, wrapper)
        if not found:
            _compat.fallback(f"torch {DCP}.{attribute}", "not defined")


def _patch_lightning(patches: Patches, module: Any) -> None:
    """Lightning's ``TorchCheckpointIO.save_checkpoint`` / ``load_checkpoint``: the checkpoint is the file at ``path``
    (the ``torch.save`` inside, to an in-memory buffer, is part of it)."""
    cls = getattr(module, "TorchCheckpointIO", None)
    if cls is None:
        _compat.fallback(f"{module.__name__}.TorchCheckpointIO", "not defined")
        return
    torch = sys.modules.get("torch")
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    for attribute, kind, target in (
        ("save_checkpoint", SAVE, _lightning_target(2)),
        ("load_checkpoint", LOAD, _lightning_target(1)),
    ):
        original = cls.__dict__.get(attribute)
        if original is None:
            _compat.fallback(f"{module.__name__}.TorchCheckpointIO.{attribute}", "not defined")
            continue
        if getattr(original, "__torchelastic_otel__", False):
            continue
        api = f"lightning.TorchCheckpointIO.{attribute}"
        patches.set(cls, attribute, _wrap(original, kind, api, target, is_compiling, files_only=True))


def _dcp_modules() -> list[Any]:
    """torch's modules that define DCP's functions (users import them from there too); the ones missing (a torch
    release moved them) are counted, and only the package's names are wrapped."""
    found = []
    for name in (DCP_SAVER, DCP_LOADER):
        module = sys.modules.get(name)
        if module is None:
            _compat.fallback(f"torch {name}", "not imported with the package")
        else:
            found.append(module)
    return found


# ---- where a checkpoint is -----------------------------------------------------------------------------------------


def _torch_save_target(args: tuple, kwargs: dict) -> object:
    return args[1] if len(args) > 1 else kwargs.get("f")


def _torch_load_target(args: tuple, kwargs: dict) -> object:
    return args[0] if args else kwargs.get("f")


def _dcp_target(keyword: str | None, storage: str, position: int | None) -> Callable[[tuple, dict], object]:
    """The checkpoint's path: ``checkpoint_id``, else the storage writer's / reader's ``path`` (``FileSystemWriter``,
    ``FileSystemReader``); ``None`` for a storage of another kind."""

    def target(args: tuple, kwargs: dict) -> object:
        checkpoint_id = kwargs.get(keyword) if keyword else None
        if checkpoint_id is not None:
            return checkpoint_id
        writer = kwargs.get(storage)
        if writer is None and position is not None and len(args) > position:
            writer = args[position]
        return getattr(writer, "path", None) if writer is not None else None

    return target


def _lightning_target(position: int) -> Callable[[tuple, dict], object]:
    """``save_checkpoint(self, checkpoint, path, ...)`` / ``load_checkpoint(self, path, ...)``'s ``path``; ``None``
    (not counted) off the main thread: ``AsyncCheckpointIO``'s background write, not the training loop's time."""

    def target(args: tuple, kwargs: dict) -> object:
        if threading.current_thread() is not threading.main_thread():
            return None
        return args[position] if len(args) > position else kwargs.get("path")

    return target


def _is_file(f: object) -> bool:
    """A path, or a file object with a name (not an in-memory buffer)."""
    if isinstance(f, (str, os.PathLike)):
        return True
    if f is None or isinstance(f, (io.BytesIO, io.StringIO, bytes, bytearray, memoryview)):
        return False
    try:
        name = getattr(f, "name", None)
    except Exception:
        return False
    return isinstance(name, (str, bytes)) and bool(name)


def _position(f: Any) -> int | None:
    if isinstance(f, (str, os.PathLike)):
        return None
    try:
        position = f.tell()
    except Exception:
        return None
    return position if isinstance(position, int) else None


def _file_bytes(f: object, position_before: int | None, kind: str) -> int | None:
    """The file's size (a path, or a file object's name, on a load), or the bytes written to a file object."""
    try:
        if isinstance(f, (str, os.PathLike)):
            return os.path.getsize(f)
        if kind == SAVE:
            after = _position(f)
            return after - position_before if after is not None and position_before is not None else None
        name = getattr(f, "name", None)
        return os.path.getsize(name) if isinstance(name, (str, bytes)) and os.path.isfile(name) else None
    except (OSError, TypeError, ValueError):
        return None


def _path_bytes(path: Any) -> int | None:
    """The size of a checkpoint's file, or of the files under its directory (at most ``MAX_DIR_ENTRIES``)."""
    try:
        path = os.fspath(path)
    except TypeError:
        return None
    try:
        if os.path.isfile(path):
            return os.path.getsize(path)
        if not os.path.isdir(path):
            return None
        total, seen, todo = 0, 0, [path]
        while todo:
            with os.scandir(todo.pop()) as entries:
                for entry in entries:
                    seen += 1
                    if seen > MAX_DIR_ENTRIES:
                        return None
                    if entry.is_dir(follow_symlinks=False):
                        todo.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
        return total
    except OSError:
        return None


# ---- the calls -----------------------------------------------------------------------------------------------------


class _Call:
    """One counted checkpoint call, from its start to its span."""

    __slots__ = ("kind", "api", "is_async", "target", "start_ns", "end_ns", "context", "position", "error", "bytes")

    def __init__(self, kind: str, api: str, is_async: bool, target: object) -> None:
        self.kind, self.api, self.is_async, self.target = kind, api, is_async, target
        self.start_ns = time.time_ns()
        self.end_ns = self.start_ns
        self.context: object = None
        self.position: int | None = None
        self.error: BaseException | None = None
        self.bytes: int | None = None


def _wrap(
    original: Callable[..., object],
    kind: str,
    api: str,
    target: Callable[[tuple, dict], object],
    is_compiling: Callable[[], bool] | None,
    *,
    is_async: bool = False,
    files_only: bool = False,
) -> Callable[..., object]:
    """``original`` with a span around its outermost calls (see the module's docstring); what it raises is raised
    without the wrapper's frame (``tracebacks``)."""

    @functools.wraps(original)
    def wrapper(*args: object, **kwargs: object) -> object:
        if getattr(_local, "depth", 0) or _straight_through(is_compiling, files_only, target, args, kwargs):
            try:
                return original(*args, **kwargs)
            except BaseException as exc:
                tracebacks.drop_own_frame(exc)
                raise
        call = _begin(kind, api, is_async, target, args, kwargs)
        _local.depth = 1
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            _local.depth = 0
            _end(kind, call, exc, None)
            tracebacks.drop_own_frame(exc)
            raise
        _local.depth = 0
        _end(kind, call, None, result)
        return result

    wrapper.__torchelastic_otel__ = True  # type: ignore[attr-defined]
    return wrapper


def _straight_through(
    is_compiling: Callable[[], bool] | None,
    files_only: bool,
    target: Callable[[tuple, dict], object],
    args: tuple,
    kwargs: dict,
) -> bool:
    """A call not counted: inside a compiled region, to an in-memory buffer, or torch's own off the main thread."""
    try:
        if is_compiling is not None and is_compiling():
            return True
        if files_only and not _is_file(target(args, kwargs)):
            return True
        return _torch_call_off_main_thread()
    except Exception:
        selftelemetry.count(selftelemetry.DROPPED, "traces", "checkpoint_error")
        return True


def _torch_call_off_main_thread() -> bool:
    """Whether the wrapper's caller is torch's own code on a thread other than the main one (DCP's writer threads,
    ``async_save``'s background ``save``): the inside of a checkpoint counted already. The caller's module comes
    from its frame (``_compat.caller_module``; where there is none, counted, and never torch's)."""
    if threading.current_thread() is threading.main_thread():
        return False
    module = _compat.caller_module(3)  # 0: here, 1: _straight_through, 2: wrapper, 3: the caller
    return module is not None and (module == "torch" or module.startswith("torch."))


def _begin(
    kind: str, api: str, is_async: bool, target: Callable[[tuple, dict], object], args: tuple, kwargs: dict
) -> Any:
    call = None
    try:
        call = _Call(kind, api, is_async, target(args, kwargs))
        call.context = worker_env.span_parent()
        call.position = _position(call.target) if api == "torch.save" else None
    except Exception as exc:
        _dropped(exc)
    _tell_anatomy(anatomy.checkpoint_enter, kind)
    return call


def _end(kind: str, call: _Call | None, error: BaseException | None, result: object) -> None:
    end_ns = time.time_ns()
    _tell_anatomy(anatomy.checkpoint_exit, kind)
    if call is None:
        return
    try:
        call.end_ns, call.error = end_ns, error
        if error is None and not call.is_async:
            call.bytes = _bytes(call)  # now: a later save may replace the file, a rotation delete it
            if call.kind == SAVE:
                _tell_anatomy(anatomy.checkpoint_committed)
        elif error is None:
            _when_done(call, result)
        _buffer.put(call)
    except Exception as exc:
        _dropped(exc)


def _bytes(call: _Call) -> int | None:
    if call.target is None:
        return None
    if call.api.startswith(DCP):
        return _path_bytes(call.target)
    return _file_bytes(call.target, call.position, call.kind)


def _when_done(call: _Call, result: object) -> None:
    """``async_save``'s future (torch 2.9+: an ``AsyncSaveResponse``, whose ``upload_completion`` it is): once it
    completes successfully the save is committed."""
    future = getattr(result, "upload_completion", result)
    add_done_callback = getattr(future, "add_done_callback", None)
    if add_done_callback is None:
        return

    def done(completed: Any) -> None:
        try:
            if completed.cancelled() or completed.exception() is not None:
                return
            _tell_anatomy(anatomy.checkpoint_committed)
            _buffer.put(_Committed(call.start_ns))
        except Exception as exc:
            _dropped(exc)

    add_done_callback(done)


# ---- telemetry -----------------------------------------------------------------------------------------------------


def _step_at(start_ns: int) -> int:
    """The steps this rank had ended at ``start_ns`` (the marks since then are taken off the count)."""
    from torchelastic_otel._torch.worker import steps

    steps.drain()
    count, _ = steps.progress()
    marks = steps.recent_marks()
    return max(0, count - (len(marks) - bisect.bisect_right(marks, start_ns)))


def _emit(call: _Call) -> None:
    from opentelemetry.trace import SpanKind, Status, StatusCode

    from torchelastic_otel import pipeline
    from torchelastic_otel.version import __version__

    step = _step_at(call.start_ns)
    attributes: dict[str, object] = {names.CHECKPOINT_API: call.api, names.CHECKPOINT_STEP: step}
    if call.kind == SAVE:
        attributes[names.CHECKPOINT_ASYNC] = call.is_async
    if call.bytes is not None:
        attributes[names.CHECKPOINT_BYTES] = call.bytes
    tracer = pipeline.get_pipeline().tracer_provider.get_tracer("torchelastic_otel", __version__)
    name = names.CHECKPOINT_SAVE if call.kind == SAVE else names.CHECKPOINT_LOAD
    span = tracer.start_span(
        name, context=call.context, kind=SpanKind.INTERNAL, start_time=call.start_ns, attributes=attributes
    )
    metric_attributes = {names.OPERATION: call.kind}
    if call.error is not None:
        error = call.error
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        span.record_exception(error, escaped=True)
        metric_attributes[ERROR_TYPE] = type(error).__qualname__
        call.error = None  # the exception's frames are not kept
    span.end(end_time=call.end_ns)
    meters = instruments()
    meters.duration.record(max(0, call.end_ns - call.start_ns) / 1e9, metric_attributes)
    if call.kind == SAVE and not call.is_async and ERROR_TYPE not in metric_attributes:
        meters.step.set(step)


class _Committed:
    """An ``async_save`` whose future completed successfully: the gauge's new step."""

    __slots__ = ("start_ns",)

    def __init__(self, start_ns: int) -> None:
        self.start_ns = start_ns


def _export(item: _Call | _Committed) -> None:
    if isinstance(item, _Committed):
        instruments().step.set(_step_at(item.start_ns))
    else:
        _emit(item)


def _dropped(exc: BaseException) -> None:
    selftelemetry.count_exception("traces", "checkpoint_error", exc)


#: Checkpoint calls on their way to the SDK, exported by the drainer's thread (``_export.drainer``: before each
#: metric collection too, so the histogram and the gauge are up to date): the training thread only appends.
_buffer = _drainer.ItemBuffer(MAX_PENDING, "metrics", _export, _dropped)
drain = _buffer.drain_now  # export the checkpoint calls buffered so far now (the drainer does it on its own)


class Instruments:
    """The checkpoint instruments, on one pipeline's meter."""

    def __init__(self, meter: Any) -> None:
        from torchelastic_otel.metrics.rules import DURATION_BUCKETS_S

        self.duration = meter.create_histogram(
            names.CHECKPOINT_DURATION,
            unit="s",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
            description="Time a checkpoint save or load blocked this rank (async_save: until it returned)",
        )
        self.step = meter.create_gauge(
            names.WORKER_CHECKPOINT_STEP,
            unit="{step}",
            description="The steps this rank had ended when its last completed checkpoint save began",
        )


def _made(pipeline: Any) -> Instruments:
    from torchelastic_otel.version import __version__

    return Instruments(pipeline.meter_provider.get_meter("torchelastic_otel", __version__))


_instruments = PerPipeline(_made)


def instruments() -> Instruments:
    return _instruments.get()


# ---- never raising -------------------------------------------------------------------------------------------------


def _tell_anatomy(function: Callable[..., None], *args: object) -> None:
    """``function(*args)``, one of ``anatomy``'s checkpoint marks (the anatomy of a step and goodput: where this
    rank's time goes); never raises."""
    try:
        function(*args)
    except Exception as exc:
        _dropped(exc)
