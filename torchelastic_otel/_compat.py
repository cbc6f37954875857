"""Every use of a private (underscore) or platform-specific internal of CPython, OpenTelemetry or torch.

A release of any of them may change these. Each function here has a fallback that keeps the job running and is
counted (``torchelastic_otel.fallbacks`` ``{reason}``, logged once), never a silent downgrade; each is pinned by a
test in ``tests/unit/test_compat.py`` that fails when a release changes it.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any, Literal

from torchelastic_otel import _selftelemetry as selftelemetry

_logger = logging.getLogger("torchelastic_otel")


def _fallback(reason: str, detail: object = "") -> None:
    selftelemetry.count(selftelemetry.FALLBACK, "all", reason)
    if selftelemetry.total(selftelemetry.FALLBACK, reason=reason) == 1:
        _logger.warning("torchelastic_otel: %s unavailable (%s); using a fallback", reason, detail)


def fallback(reason: str, detail: object = "") -> None:
    """Count (and log once) a fallback taken elsewhere: a torch or framework internal a patch needs is not there."""
    _fallback(reason, detail)


# ---- CPython -----------------------------------------------------------------------------------------------------


def caller_module(depth: int) -> str | None:
    """The ``__name__`` of the module whose code is ``depth`` frames above the caller (``sys._getframe``,
    CPython); ``None`` past the stack's top, and (counted) where there is no ``sys._getframe``."""
    getframe = getattr(sys, "_getframe", None)
    if getframe is None:
        _fallback("sys._getframe", "not in this Python")
        return None
    try:
        name = getframe(depth + 1).f_globals.get("__name__")
    except ValueError:
        return None
    return name if isinstance(name, str) else None


def thread_frames() -> dict[int, FrameType]:
    """The current frame of every thread (``sys._current_frames``, CPython); ``{}`` where there is none."""
    current_frames = getattr(sys, "_current_frames", None)
    if current_frames is None:
        _fallback("sys._current_frames", "not in this Python")
        return {}
    try:
        return dict(current_frames())
    except Exception as exc:
        _fallback("sys._current_frames", exc)
        return {}


def caller_frame(depth: int) -> FrameType | None:
    """The frame ``depth`` frames above the caller (``sys._getframe``, CPython); ``None`` past the stack's top, and
    (counted) where there is no ``sys._getframe``."""
    getframe = getattr(sys, "_getframe", None)
    if getframe is None:
        _fallback("sys._getframe", "not in this Python")
        return None
    try:
        frame: FrameType = getframe(depth + 1)
        return frame
    except ValueError:
        return None


_set_exc_info: Any = None


def reraised_traceback(exc: BaseException, tb: TracebackType | None) -> bool:
    """In the ``except`` block handling ``exc`` on Python 3.10: make ``tb`` the traceback its bare ``raise``
    re-raises ``exc`` with (3.10 re-raises the one saved when the block was entered, not ``exc.__traceback__``),
    through CPython's ``PyErr_SetExcInfo`` (its C API, by ctypes), which sets the exception being handled. ``False``
    (counted) where it cannot be done: the bare ``raise`` then re-raises the saved traceback."""
    global _set_exc_info
    try:
        if _set_exc_info is None:
            import ctypes

            incref, set_exc_info = ctypes.pythonapi.Py_IncRef, ctypes.pythonapi.PyErr_SetExcInfo
            incref.argtypes, incref.restype = [ctypes.py_object], None
            set_exc_info.argtypes, set_exc_info.restype = [ctypes.py_object] * 3, None

            def handled(kind: type, value: BaseException, traceback: TracebackType | None) -> None:
                for item in (kind, value, traceback):  # PyErr_SetExcInfo steals a reference to each
                    incref(item)
                set_exc_info(kind, value, traceback)

            _set_exc_info = handled
        _set_exc_info(type(exc), exc, tb)
        return True
    except Exception as error:
        _fallback("PyErr_SetExcInfo", error)
        return False


_libc_signal: Any = None


def default_disposition(signum: int) -> bool:
    """Set ``signum``'s disposition to the default action from any thread (``signal.signal`` only works in the main
    thread): libc's ``signal(signum, SIG_DFL)`` through ctypes. CPython keeps its own table of Python handlers, which
    the kernel never reads, so this only changes what the kernel does with the next ``signum``. ``False`` if it
    could not be done (no ctypes or libc here): the caller then ends the process another way."""
    global _libc_signal
    try:
        if _libc_signal is None:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            function = libc.signal
            function.restype = ctypes.c_void_p
            function.argtypes = [ctypes.c_int, ctypes.c_void_p]
            _libc_signal = function
        sig_err = (1 << (8 * _pointer_size())) - 1  # SIG_ERR is (void *) -1
        return _libc_signal(signum, None) != sig_err
    except Exception as exc:
        _fallback("libc.signal", exc)
        return False


def _pointer_size() -> int:
    import ctypes

    return ctypes.sizeof(ctypes.c_void_p)


def exit_as_if_signalled(signum: int) -> None:
    """The fallback of a death by ``signum``: the shell's convention for it, ``128 + signum``."""
    _fallback("death_by_signal", f"exit status {128 + signum} instead of signal {signum}")
    os._exit(128 + signum)


# ---- torch ---------------------------------------------------------------------------------------------------------


def torch_event_destinations() -> dict[str, Any] | None:
    """torch's table of event destinations (``events.handlers._log_handlers``): the bridge adds "otel" to it, so
    that ``torchrun --event-log-handler otel`` and ``record(event, "otel")`` work, and joins every other
    destination. ``None`` (counted) if the table moved: torch's events then reach only the destinations torch has.
    """
    try:
        import torch.distributed.elastic.events.handlers as handlers

        table = handlers._log_handlers  # noqa: SLF001 - torch's table of event destinations, no public accessor
    except (ImportError, AttributeError) as exc:
        _fallback("torch events.handlers._log_handlers", exc)
        return None
    if not isinstance(table, dict):
        _fallback("torch events.handlers._log_handlers", f"a {type(table).__name__}, not a dict")
        return None
    return table


def torch_event_logger(destination: str) -> logging.Logger:
    """The logger torch's ``events.record`` writes ``destination``'s events to (``events._get_or_create_logger``).
    Fallback (counted): the logger of that name, ``torchelastic-events-<destination>``, as torch 2.x names it."""
    try:
        import torch.distributed.elastic.events as events

        return events._get_or_create_logger(destination)  # noqa: SLF001 - torch's per-destination loggers
    except AttributeError as exc:
        _fallback("torch events._get_or_create_logger", exc)
        return logging.getLogger(f"torchelastic-events-{destination}")


def rdzv_method_name(original: Any) -> Callable[..., str] | None:
    """An equal of torch's ``dynamic_rendezvous.get_method_name(depth=2)`` that reads the name from the frame.

    torch's rendezvous names each of its events after the method that records it: ``inspect.stack()[depth].function``,
    building ``inspect.stack()`` twice -- every frame's source lines read from disk, every loaded module scanned for
    every frame: milliseconds a call on the agent's main thread, several calls a rendezvous round and one every
    keep-alive, paid even where torch then drops the event (docs/performance.md, "Costs that shape the code"). This
    returns the same name (``sys._getframe(depth).f_code.co_name``: the frame ``inspect.stack()`` wraps) at the
    cost of one frame lookup.

    ``None`` (counted) where torch's function is not the one known here -- its parameters or what it calls changed
    -- or this Python has no ``sys._getframe``: torch's is then kept, and the names stay torch's.
    """
    code = getattr(original, "__code__", None)
    known = (
        code is not None
        and code.co_varnames[: code.co_argcount] == ("depth",)
        and getattr(original, "__defaults__", None) == (2,)
        and {"inspect", "stack", "function"} <= set(code.co_names)
    )
    getframe = getattr(sys, "_getframe", None)
    if not known or getframe is None:
        _fallback("torch dynamic_rendezvous.get_method_name", "not the known function" if getframe else "no frames")
        return None

    def get_method_name(depth: int = 2) -> str:
        """torch's ``get_method_name``: the name of the function ``depth`` frames up (0: this one)."""
        if depth < 0:
            return original(depth)  # inspect.stack()'s negative index: torch's own walk
        try:
            return getframe(depth).f_code.co_name  # 0: this frame, as in ``inspect.stack()``
        except ValueError:  # the stack is not that deep
            return "no_method_name"

    get_method_name.__torchelastic_otel__ = True  # type: ignore[attr-defined]
    return get_method_name


def agent_method(cls: type, name: str) -> Any:
    """The function ``cls`` itself defines as ``name`` (one of the agent's ``_``-methods the bridge wraps into
    spans); ``None`` (counted) if a torch release renamed or removed it: that span is then missing."""
    function = cls.__dict__.get(name)
    if function is None:
        _fallback(f"torch {cls.__name__}.{name}", "not defined")
    return function


def agent_spec(agent: object) -> Any:
    """The ``WorkerSpec`` of a ``SimpleElasticAgent`` (``agent._worker_group.spec``); ``None`` (counted) if not
    there: the run's attributes (role, max restarts, local world size, entrypoint) are then missing."""
    spec = getattr(getattr(agent, "_worker_group", None), "spec", None)
    if spec is None:
        _fallback("torch SimpleElasticAgent._worker_group.spec", type(agent).__name__)
    return spec


def agent_remaining_restarts(agent: object) -> int | None:
    """``agent._remaining_restarts`` (torch keeps no public count); ``None`` (counted) if not there: the restart
    count on spans and records is then missing."""
    remaining = getattr(agent, "_remaining_restarts", None)
    if not isinstance(remaining, int):
        _fallback("torch SimpleElasticAgent._remaining_restarts", type(agent).__name__)
        return None
    return remaining


# ---- OpenTelemetry SDK ---------------------------------------------------------------------------------------------


class BatchQueue:
    """What an SDK batch processor's queue holds (``length``), its capacity and whether it is shut down."""

    __slots__ = ("length", "limit", "shut_down")

    def __init__(self, length: int, limit: int, shut_down: bool) -> None:
        self.length, self.limit, self.shut_down = length, limit, shut_down


def batch_queue(processor: object) -> BatchQueue | None:
    """The queue of ``BatchSpanProcessor`` / ``BatchLogRecordProcessor`` (SDK >= 1.31: an internal
    ``_batch_processor`` with ``_queue``, ``_max_queue_size``, ``_shutdown``); ``None`` (counted) if the layout is
    not that: the processor then logs and drops by itself, uncounted by the bridge."""
    batch = getattr(processor, "_batch_processor", None)
    queue = getattr(batch, "_queue", None)
    limit = getattr(batch, "_max_queue_size", None)
    if queue is None or not isinstance(limit, int):
        _fallback("BatchProcessor._queue", type(processor).__name__)
        return None
    return BatchQueue(len(queue), limit, getattr(batch, "_shutdown", False) is True)


# ---- OpenTelemetry SDK configuration -------------------------------------------------------------------------------

#: ``OTEL_EXPORTER_OTLP_PROTOCOL`` values -> the exporter entry point name of the ``otlp`` exporter.
_OTLP_PROTOCOLS = {"grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"}

#: The signals in the order of ``_import_exporters``'s arguments and result.
_SIGNALS: tuple[Literal["traces"], Literal["metrics"], Literal["logs"]] = ("traces", "metrics", "logs")


def sdk_exporter_classes(signal: str, name: str) -> dict[str, type]:
    """The exporter (or metric reader) class the SDK's autoconfigure resolves for one ``OTEL_<SIGNAL>_EXPORTER``
    name (``sdk._configuration``'s ``_get_exporter_entry_point`` + ``_import_exporters``: ``otlp`` becomes the
    protocol-specific entry point). Fallback (counted): the same through ``importlib.metadata`` entry points.
    Raises for a name that cannot be resolved (the caller counts and skips it)."""
    try:
        from opentelemetry.sdk._configuration import _get_exporter_entry_point, _import_exporters
    except ImportError as exc:
        _fallback("opentelemetry.sdk._configuration exporters", exc)
        return {name: _exporter_entry_point(signal, name)}
    args: list[list[str]] = [[], [], []]
    index = _SIGNALS.index(signal)
    args[index] = [_get_exporter_entry_point(name, _SIGNALS[index])]
    return dict(_import_exporters(*args)[index])


def _exporter_entry_point(signal: str, name: str) -> type:
    from importlib.metadata import entry_points

    if name == "otlp":
        protocol = os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL") or os.environ.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"
        )
        name = _OTLP_PROTOCOLS.get(protocol.strip(), "")
        if not name:
            raise ValueError(f"unsupported OTLP protocol {protocol!r}")
    found = list(entry_points(group=f"opentelemetry_{signal}_exporter", name=name))
    if not found:
        raise ValueError(f"no {signal} exporter named {name!r}")
    return found[0].load()


def sdk_sampler() -> Any:
    """The sampler ``OTEL_TRACES_SAMPLER`` names, as the SDK's autoconfigure builds it; ``None`` (counted) where
    its helpers moved: the SDK's ``TracerProvider`` then reads the same variable itself."""
    try:
        from opentelemetry.sdk._configuration import _get_sampler, _import_sampler
    except ImportError as exc:
        _fallback("opentelemetry.sdk._configuration sampler", exc)
        return None
    return _import_sampler(_get_sampler())


def sdk_id_generator() -> Any:
    """The id generator ``OTEL_PYTHON_ID_GENERATOR`` names (autoconfigure's helpers); ``None`` (counted) where they
    moved: the SDK's random id generator is then used."""
    try:
        from opentelemetry.sdk._configuration import _get_id_generator, _import_id_generator
    except ImportError as exc:
        _fallback("opentelemetry.sdk._configuration id generator", exc)
        return None
    return _import_id_generator(_get_id_generator())


def provider_processors(provider: object, signal: str) -> list[Any]:
    """The span / log record processors an SDK ``TracerProvider`` / ``LoggerProvider`` built elsewhere (by
    ``opentelemetry-configuration`` from ``OTEL_CONFIG_FILE``) holds (``_active_span_processor._span_processors``,
    ``_multi_log_record_processor._log_record_processors``). Empty (counted) where they moved: the bridge then cannot
    count what a timed-out shutdown leaves behind, nor send a worker's final words with the worker's resource."""
    holder, attribute = (
        ("_active_span_processor", "_span_processors")
        if signal == "traces"
        else ("_multi_log_record_processor", "_log_record_processors")
    )
    processors = getattr(getattr(provider, holder, None), attribute, None)
    if not isinstance(processors, (tuple, list)):
        _fallback(f"{type(provider).__name__}.{holder}.{attribute}", "not found")
        return []
    return list(processors)


def declarative_load(path: str) -> Any:
    """``opentelemetry-configuration``'s ``load_config_file`` without its check of the package's own schema against
    the JSON Schema metaschema, which ``jsonschema.validate`` repeats at every call: nearly all of a load's CPU
    (docs/performance.md), in every process of a job. The same steps otherwise, with the
    loader's own pieces (``file._loader``: ``_parse_config_content`` with its ``${VAR}`` substitution, the
    package's schema, ``_validate_file_format``, ``_dict_to_model``) and the same errors. Fallback (counted): the
    public ``load_config_file``."""
    from opentelemetry.configuration import ConfigurationError, load_config_file

    try:
        import jsonschema
        from opentelemetry.configuration.file import _loader

        # The loader's own steps, less its metaschema check (see the docstring): it has no public form of them.
        parse, schema = _loader._parse_config_content, _loader._get_schema  # noqa: SLF001 - see above
        check_format, to_model = _loader._validate_file_format, _loader._dict_to_model  # noqa: SLF001 - see above
    except (ImportError, AttributeError) as exc:
        _fallback("opentelemetry.configuration.file._loader", exc)
        return load_config_file(path)
    from pathlib import Path

    file = Path(path)
    suffix = file.suffix.lower()
    if not file.is_file() or suffix not in (".yaml", ".yml", ".json"):
        return load_config_file(path)  # its own error for a missing file, a directory, an unknown suffix
    try:
        content = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"Failed to read configuration file: {path} ({exc})") from exc
    data = parse(content, suffix, path)
    if data is None:
        raise ConfigurationError("Configuration file is empty")
    if not isinstance(data, dict):
        raise ConfigurationError(f"Configuration must be a mapping/object, got {type(data).__name__}")
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema()).iter_errors(data))
    if error is not None:
        where = f" (at {' -> '.join(str(p) for p in error.absolute_path)})" if error.absolute_path else ""
        raise ConfigurationError(f"Configuration does not match schema: {error.message}{where}")
    check_format(data)
    try:
        return to_model(data)
    except Exception as exc:
        raise ConfigurationError(f"Failed to validate configuration: {exc}") from exc


def auto_instrumentation_loaders() -> tuple[Callable[[], Any], Callable[[], Any]] | None:
    """``opentelemetry-instrumentation``'s ``_load_distro`` and ``_load_configurators`` (the private
    ``auto_instrumentation._load``): how ``opentelemetry-instrument`` picks the distro and the configurator
    (``opentelemetry_distro`` / ``opentelemetry_configurator`` entry points, ``OTEL_PYTHON_DISTRO`` /
    ``OTEL_PYTHON_CONFIGURATOR``). ``None`` where the package is not installed (nothing to do), or (counted) where
    they moved: the bridge's processes then do not run a distro of their own."""
    try:
        import opentelemetry.instrumentation  # noqa: F401
    except ImportError:
        return None
    try:
        from opentelemetry.instrumentation.auto_instrumentation._load import _load_configurators, _load_distro
    except ImportError as exc:
        _fallback("opentelemetry.instrumentation.auto_instrumentation._load", exc)
        return None
    return _load_distro, _load_configurators


# ---- OpenTelemetry OTLP exporters ----------------------------------------------------------------------------------

#: How the OTLP exporters (gRPC and HTTP) start the warning they log before they wait to retry an export.
_RETRY_LOG_PREFIX = "Transient error"


def is_export_retry_log(record: logging.LogRecord) -> bool:
    """Whether an OTLP exporter's log record says an export failed and will be retried after a back-off (the
    exporters expose no hook for it). If a release rewords it, retries are not noticed and the bridge tells a
    down backend by the export stall timer instead (``TORCHELASTIC_OTEL_EXPORT_STALL_MILLIS``)."""
    message = record.msg
    return isinstance(message, str) and message.startswith(_RETRY_LOG_PREFIX)


# ---- OpenTelemetry API -------------------------------------------------------------------------------------------

#: Where the API keeps each global provider (set once per process through ``set_*_provider``).
_GLOBAL_PROVIDERS = {
    "traces": ("opentelemetry.trace", "_TRACER_PROVIDER"),
    "metrics": ("opentelemetry.metrics._internal", "_METER_PROVIDER"),
    "logs": ("opentelemetry._logs._internal", "_LOGGER_PROVIDER"),
}


def global_provider(signal: str) -> Any:
    """The global provider of ``signal`` as the API holds it (``None``: none set), without creating a proxy."""
    module_name, attribute = _GLOBAL_PROVIDERS[signal]
    module = sys.modules.get(module_name)
    if module is None or not hasattr(module, attribute):
        _fallback(f"{module_name}.{attribute}", "not found")
        return None
    return getattr(module, attribute)


def replace_global_provider(signal: str, old: object, new: object) -> bool:
    """Make ``new`` the global provider of ``signal`` where ``old`` is (``None``: where none is set).

    The API sets a global provider once per process and a forked child inherits its parent's; the bridge replaces
    only the placeholders and providers of its own, in the API's module globals. ``False`` (counted) if they are
    not there: the bridge then sets up at once instead of deferring, and a forked child goes on with what it
    inherited.
    """
    module_name, attribute = _GLOBAL_PROVIDERS[signal]
    module = sys.modules.get(module_name)
    if module is None or not hasattr(module, attribute):
        _fallback(f"{module_name}.{attribute}", "not found")
        return False
    if getattr(module, attribute) is not old:
        return False
    setattr(module, attribute, new)
    return True


def is_proxy_provider(provider: object) -> bool:
    """The API's stand-in while no global provider is set (``ProxyTracerProvider`` and its kin)."""
    from opentelemetry.trace import ProxyTracerProvider

    if isinstance(provider, ProxyTracerProvider):
        return True
    try:
        from opentelemetry._logs._internal import ProxyLoggerProvider
        from opentelemetry.metrics._internal import _ProxyMeterProvider
    except ImportError as exc:  # moved in a release: fall back to the class names
        _fallback("opentelemetry proxy provider classes", exc)
        return type(provider).__name__.startswith(("Proxy", "_Proxy"))
    return isinstance(provider, (_ProxyMeterProvider, ProxyLoggerProvider))


def _is_sdk_meter_provider(provider: object) -> bool:
    try:
        from opentelemetry.sdk.metrics import MeterProvider
    except ImportError:
        return False
    return isinstance(provider, MeterProvider)


def metric_readers(meter_provider: object) -> list[Any] | None:
    """The readers of an SDK ``MeterProvider`` that the bridge did not build (``_metric_readers``; older SDKs:
    ``_sdk_config.metric_readers``); ``None`` if it is not one, or their place changed (counted: the provider's
    own ``force_flush`` is then used, which also collects pull readers such as Prometheus')."""
    readers = getattr(meter_provider, "_metric_readers", None)
    if readers is None:
        readers = getattr(getattr(meter_provider, "_sdk_config", None), "metric_readers", None)
    if readers is None and _is_sdk_meter_provider(meter_provider):
        _fallback("MeterProvider._metric_readers", type(meter_provider).__name__)
    return list(readers) if readers is not None else None


# ---- differences between releases --------------------------------------------------------------------------------

_THREADS_AT_EXIT: list[bool] = []


def threads_start_at_exit() -> bool:
    """Whether this Python starts a thread while the interpreter exits (``atexit`` handlers, ``threading``'s exit
    hooks). CPython 3.12.0 and 3.12.1 refuse ("can't create new thread at interpreter shutdown", gh-113964; fixed in
    3.12.2). ``False`` there (counted once): a worker then sets its pipeline up at once instead of deferring it,
    since a deferred one could not be built at exit, and exit flushes run on a thread started beforehand."""
    if not _THREADS_AT_EXIT:
        refused = sys.implementation.name == "cpython" and sys.version_info[:3] in ((3, 12, 0), (3, 12, 1))
        if refused:
            # Counted, not logged: a known limit of two Python releases, and a warning would add a line to every
            # worker's console there (the bridge changes nothing but the telemetry).
            selftelemetry.count(selftelemetry.FALLBACK, "all", "threads_at_exit")
        _THREADS_AT_EXIT.append(not refused)
    return _THREADS_AT_EXIT[0]


def register_before_thread_shutdown(hook: Callable[[], Any]) -> bool:
    """Run ``hook()`` among ``threading``'s own exit hooks (``threading._register_atexit``): before the interpreter
    stops thread pools and, on Python 3.12+, refuses new threads -- which ``atexit`` handlers are too late for.
    They run last-registered first, so ``concurrent.futures`` (whose hook stops its pools) is imported before.
    ``False`` (counted) where that function is missing: a build in progress at exit is then waited for in the
    ``atexit`` handler, where it may no longer start its exporters' threads."""
    register = getattr(threading, "_register_atexit", None)
    if register is None:
        _fallback("threading._register_atexit", "not in this Python")
        return False
    import concurrent.futures.thread  # noqa: F401 - its exit hook is registered before ours

    try:
        register(hook)
    except RuntimeError:  # already shutting down
        return False
    return True


# ---- torch: the Flight Recorder (a worker's collectives) -----------------------------------------------------------


def flight_recorder(include_collectives: bool) -> dict[str, Any] | None:
    """What torch's Flight Recorder holds in this process: ``pg_status`` (per process group name, the sequence
    numbers of the last collective enqueued, started and completed) and, with ``include_collectives``, ``entries``
    (the recent collectives: ``collective_seq_id``, ``profiling_name``, ``process_group`` = [name, description],
    ``time_created_ns``...). ``torch._C._distributed_c10d._dump_fr_trace`` without stack traces (pickle: several times
    faster than its JSON twin, docs/performance.md); fallback (counted): ``_dump_fr_trace_json``; ``None`` (counted)
    when neither exists or the dump fails: the stall records then carry no collectives and stragglers are not measured.
    The caller makes sure ``torch.distributed`` is imported and initialised."""
    try:
        from torch._C import _distributed_c10d as c10d
    except ImportError as exc:
        _fallback("torch _distributed_c10d", exc)
        return None
    dump = getattr(c10d, "_dump_fr_trace", None)
    if dump is not None:
        try:
            import pickle

            data = pickle.loads(dump(includeCollectives=include_collectives, includeStackTraces=False))
            return data if isinstance(data, dict) else None
        except Exception as exc:
            _fallback("torch _dump_fr_trace", exc)
    else:
        _fallback("torch _dump_fr_trace", "not defined")
    dump_json = getattr(c10d, "_dump_fr_trace_json", None)
    if dump_json is None:
        _fallback("torch _dump_fr_trace_json", "not defined")
        return None
    try:
        import json

        data = json.loads(dump_json(includeCollectives=include_collectives))
        return data if isinstance(data, dict) else None
    except Exception as exc:
        _fallback("torch _dump_fr_trace_json", exc)
        return None


# ---- torch: the DataLoader's iterators (the input phase of a step) -------------------------------------------------


def dataloader_iter_class(module: object) -> type | None:
    """The base class of every ``DataLoader`` iterator, ``torch.utils.data.dataloader._BaseDataLoaderIter``, whose
    ``__next__`` both the single- and the multi-process iterator inherit (``anatomy``'s input phase). ``None``
    (counted) where it is gone or no longer defines ``__next__``: steps then have no input phase."""
    cls = getattr(module, "_BaseDataLoaderIter", None)
    if not isinstance(cls, type) or "__next__" not in cls.__dict__:
        _fallback("torch dataloader._BaseDataLoaderIter.__next__", "not defined")
        return None
    return cls


# ---- torch: CUDA events (a step on the GPU's clock) -----------------------------------------------------------------


def cuda_event_factory(torch: object) -> Callable[[], Any] | None:
    """What makes the timeline's CUDA events: ``torch.Event(device="cuda", enable_timing=True)`` (the device-generic
    event, torch 2.4+: its ``record()`` takes the current stream in C; ``torch.cuda.Event.record`` builds a Python
    stream object first, several times the cost). Bound to a device at its first ``record()``. ``None`` (counted)
    where there is no such class or it cannot make one: the job's steps then stay on the host's clock."""
    event = getattr(torch, "Event", None) if torch is not None else None
    if not callable(event):
        _fallback("torch.Event", "not defined")
        return None

    def factory() -> Any:
        return event(device="cuda", enable_timing=True)

    try:
        factory()
    except Exception as exc:
        _fallback("torch.Event(device='cuda', enable_timing=True)", exc)
        return None
    return factory


# ---- Hugging Face transformers and Lightning: private methods the framework integrations wrap ---------------------


def framework_method(cls: object, name: str) -> Any:
    """``cls.name`` where ``cls`` itself defines it as a function: a private method of a framework the bridge wraps
    (``transformers.Trainer._save_checkpoint``, Lightning's ``_LoggerConnector.log_metrics``, ``frameworks``).
    ``None`` (counted) where a release removed or renamed it: that part of the integration is then left out."""
    function = getattr(cls, "__dict__", {}).get(name)
    if not callable(function):
        _fallback(f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', cls)}.{name}", "not defined")
        return None
    return function
