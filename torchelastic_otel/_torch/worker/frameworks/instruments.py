"""What the framework adapters (``hf``, ``lightning``) share: logged scalars as gauges, phases as spans.

The adapters run on the training thread and only append (a dict copy and a deque append per log call, a few
attribute reads per phase): the gauges and spans are made on the drainer's thread (``_export.drainer``: every
0.5 s, before each metric collection, at every flush and at exit), as ``checkpoints`` does, so a log call never
waits for the pipeline.

Scalars: one gauge per logged key, ``torchelastic.framework.<key>`` (the key sanitized: characters other than
letters, digits, ``_`` and ``.`` become ``_``), attributes ``framework`` (``hf`` | ``lightning``) and ``split``; the
rank, restart and run come from the worker's resource. At most :data:`MAX_KEYS` distinct keys a process (users log
arbitrary keys): values of further keys are dropped and counted (``torchelastic_otel.dropped``
``framework_key_limit``); so are values that are not real numbers (``framework_non_scalar``) or not finite
(``framework_non_finite``). Gauge ``torchelastic.framework.step`` holds the framework's global step of its last log.

Spans: :func:`begin` / :func:`end` around a phase; the parent is the phase begun before it on the same thread and
still open (an evaluation inside training), else the agent's attempt (``checkpoints._parent_context``).
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from torchelastic_otel import _names as names
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._export import drainer as _drainer
from torchelastic_otel._torch import tracebacks

__all__ = ["record", "begin", "end", "drain", "unit_of", "metric_name", "MAX_KEYS"]

_logger = logging.getLogger("torchelastic_otel")

#: Distinct logged keys a process turns into gauges; values of further keys are dropped and counted.
MAX_KEYS = 100
#: Log calls and span events buffered between two drains before new ones are turned away (and counted).
MAX_PENDING = 4096
#: A sanitized key is cut to this many characters (OpenTelemetry's instrument names: at most 255 in all).
MAX_KEY_LENGTH = 120
_UNSAFE = re.compile(r"[^A-Za-z0-9_.]+")
#: Keys a framework uses for the step itself, not a value (Lightning's ``step``): they set the step gauge.
STEP_KEYS = frozenset({"step", "global_step"})

_local = threading.local()  # .stack: the tokens of this thread's open phases, innermost last
_tokens = itertools.count(1)


# ---- the training thread's side -------------------------------------------------------------------------------------


def record(framework: str, values: Mapping[str, Any], step: int | None, split: str | None = None) -> None:
    """Buffer one log call's values (``split``: where the framework knows it; else ``hf``'s key prefixes)."""
    try:
        _buffer.put(("log", framework, dict(values), step, split))
    except Exception as exc:
        _dropped(exc)


def begin(name: str, attributes: dict[str, Any]) -> int:
    """Open a phase span ``name`` now; returns its token for :func:`end` (``0``: nothing was opened)."""
    try:
        from torchelastic_otel._torch.worker.checkpoints import _parent_context

        token = next(_tokens)
        stack = _stack()
        parent = stack[-1] if stack else 0
        context = None if parent else _parent_context()
        stack.append(token)
        _buffer.put(("begin", token, name, attributes, time.time_ns(), parent, context))
        return token
    except Exception as exc:
        _dropped(exc)
        return 0


def end(token: int, error: BaseException | None = None) -> None:
    """Close the phase of ``token`` now, and every phase opened inside it and still open (an exception left
    them), with ``error`` as their status."""
    if not token:
        return
    try:
        stack = _stack()
        if token not in stack:
            return
        now = time.time_ns()
        status = None if error is None else f"{type(error).__name__}: {error}"[:1024]
        while stack:
            top = stack.pop()
            _buffer._pending.append(("end", top, now, status))  # never turned away: an open span would leak
            if top == token:
                break
    except Exception as exc:
        _dropped(exc)


def open_tokens() -> list[int]:
    """The tokens of this thread's open phases, outermost first."""
    return list(_stack())


def _stack() -> list[int]:
    stack: list[int] | None = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


# ---- names and units ------------------------------------------------------------------------------------------------


def metric_name(key: str) -> str | None:
    """``torchelastic.framework.<key>``, the key sanitized; ``None`` for a key with nothing left."""
    cleaned = _UNSAFE.sub("_", key).strip("_.")[:MAX_KEY_LENGTH]
    if not cleaned:
        return None
    if not cleaned[0].isalpha():
        cleaned = "k_" + cleaned
    return names.FRAMEWORK_METRIC_PREFIX + cleaned


def unit_of(key: str) -> str:
    """The unit of a logged key, from the frameworks' naming: ``*_runtime`` seconds, ``epoch``, ``total_flos``;
    rates and everything else (loss, learning rate, gradient norm, user keys) without one, so that the Prometheus
    name is the key itself (``torchelastic_framework_loss``)."""
    if key.endswith("runtime"):
        return "s"
    if key == "epoch":
        return "{epoch}"
    if key.endswith("total_flos"):
        return "{flop}"
    return ""


def hf_split(key: str) -> str:
    """The split of a Hugging Face ``Trainer`` log key: its prefix (``eval_``, ``test_``), else ``train``."""
    for prefix in ("eval", "test"):
        if key.startswith(prefix + "_"):
            return prefix
    return "train"


def scalar(value: Any) -> float | None:
    """A real number as a float; ``None`` for anything else (strings, lists, tensors of more than one value)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", 0) == 0:
        try:
            found = item()
        except Exception:
            return None
        return float(found) if isinstance(found, (int, float)) and not isinstance(found, bool) else None
    return None


# ---- the drainer's side -------------------------------------------------------------------------------------------


class _Gauges:
    """The gauges by key, on the current pipeline's meter provider (recreated after a rebuild)."""

    def __init__(self) -> None:
        self.generation = -1
        self.meter: Any = None
        self.by_key: dict[str, Any] = {}
        self.step: Any = None

    def meter_now(self) -> Any:
        """The meter of the current pipeline (asked once a drained log call; cheap when it has not changed)."""
        pipeline = _pipeline()
        generation = pipeline._generation[0]
        if self.meter is None or generation != self.generation:
            from torchelastic_otel.version import __version__

            self.meter = pipeline.get_pipeline().meter_provider.get_meter("torchelastic_otel", __version__)
            self.by_key, self.step = {}, None
            self.generation = generation
        return self.meter

    def step_gauge(self) -> Any:
        if self.step is None:
            self.step = self.meter.create_gauge(
                names.FRAMEWORK_STEP, unit="{step}", description="The framework's global step at its last log"
            )
        return self.step

    def gauge(self, key: str) -> Any:
        """The gauge of ``key`` on the meter :meth:`meter_now` returned last (``None``: dropped, counted)."""
        found = self.by_key.get(key)
        if found is not None:
            return found
        name = metric_name(key)
        if name is None:
            selftelemetry.count(selftelemetry.DROPPED, "metrics", "framework_bad_key")
            return None
        if len(self.by_key) >= MAX_KEYS:
            selftelemetry.count(selftelemetry.DROPPED, "metrics", "framework_key_limit")
            return None
        found = self.meter.create_gauge(
            name, unit=unit_of(key), description="A value the framework logged (its key is in the name)"
        )
        self.by_key[key] = found
        return found


_gauges = _Gauges()


def _pipeline() -> Any:
    """``torchelastic_otel.pipeline``, imported on the drainer's first use (not at the worker's start-up)."""
    if not _modules:
        from torchelastic_otel import pipeline

        _modules.append(pipeline)
    return _modules[0]


_modules: list[Any] = []


def _emit_log(framework: str, values: dict[str, Any], step: int | None, split: str | None) -> None:
    _gauges.meter_now()
    for key, raw in values.items():
        if not isinstance(key, str):
            selftelemetry.count(selftelemetry.DROPPED, "metrics", "framework_bad_key")
            continue
        value = scalar(raw)
        if key in STEP_KEYS:
            if step is None and value is not None and math.isfinite(value):
                step = int(value)
            continue
        if value is None:
            selftelemetry.count(selftelemetry.DROPPED, "metrics", "framework_non_scalar")
            continue
        if not math.isfinite(value):
            selftelemetry.count(selftelemetry.DROPPED, "metrics", "framework_non_finite")
            continue
        gauge = _gauges.gauge(key)
        if gauge is not None:
            gauge.set(value, {names.FRAMEWORK: framework, names.SPLIT: split or hf_split(key)})
    if step is not None:
        _gauges.step_gauge().set(int(step), {names.FRAMEWORK: framework})


class _Spans:
    """The spans begun and not yet ended, by token (the drainer's thread only)."""

    def __init__(self) -> None:
        self.open: dict[int, Any] = {}

    def begin(self, token: int, name: str, attributes: dict[str, Any], start: int, parent: int, context: Any) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind

        from torchelastic_otel import pipeline
        from torchelastic_otel.version import __version__

        parent_span = self.open.get(parent) if parent else None
        if parent_span is not None:
            context = trace.set_span_in_context(parent_span)
        tracer = pipeline.get_pipeline().tracer_provider.get_tracer("torchelastic_otel", __version__)
        self.open[token] = tracer.start_span(
            name, context=context, kind=SpanKind.INTERNAL, start_time=start, attributes=attributes
        )

    def end(self, token: int, end_ns: int, status: str | None) -> None:
        from opentelemetry.trace import Status, StatusCode

        span = self.open.pop(token, None)
        if span is None:
            return
        if status is not None:
            span.set_status(Status(StatusCode.ERROR, status))
        span.end(end_time=end_ns)


_spans = _Spans()


class _FrameworkBuffer(_drainer.ItemBuffer):
    """Log calls and phase events on their way to the SDK, in the order they happened."""

    signal = "metrics"  # drained completely before a metric collection: the gauges are up to date

    def __init__(self) -> None:
        super().__init__(MAX_PENDING)
        _drainer.register(self)

    def export(self, item: tuple[Any, ...]) -> None:
        if item[0] == "log":
            _emit_log(*item[1:])
        elif item[0] == "begin":
            _spans.begin(*item[1:])
        else:
            _spans.end(*item[1:])

    def failed(self, exc: Exception) -> None:
        _dropped(exc)


_buffer = _FrameworkBuffer()


def drain() -> None:
    """Export what is buffered now (the drainer does it on its own every 0.5 s)."""
    try:
        _buffer.drain()
    except Exception as exc:
        _dropped(exc)


def _dropped(exc: BaseException) -> None:
    try:
        selftelemetry.count(selftelemetry.DROPPED, "metrics", "framework_error")
        _logger.debug("torchelastic_otel: framework telemetry dropped: %s", exc, exc_info=True)
    except Exception:
        pass


# ---- wrapping a framework's method in a phase span -----------------------------------------------------------------


def phase_method(
    original: Callable[..., Any], name: str, attributes: Callable[[Any, tuple, dict], dict[str, Any]]
) -> Callable[..., Any]:
    """``original`` (a method) inside a phase span ``name`` with ``attributes(self, args, kwargs)``; an exception
    ends the span with status ERROR and is raised unchanged, without the wrapper's frame (``tracebacks``)."""

    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            token = begin(name, attributes(self, args, kwargs))
        except Exception as exc:
            _dropped(exc)
            token = 0
        try:
            result = original(self, *args, **kwargs)
        except BaseException as exc:
            end(token, exc)
            tracebacks.drop_own_frame(exc)
            raise
        end(token)
        return result

    wrapper.__torchelastic_otel__ = True  # type: ignore[attr-defined]
    return wrapper
