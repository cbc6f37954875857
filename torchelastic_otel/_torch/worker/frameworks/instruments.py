"""What the framework adapters (``hf``, ``lightning``) share: logged scalars as gauges, phases as spans, and how
they hook into a framework (:class:`Integration`, :func:`wrap_init`, :func:`phase_method`).

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
still open (an evaluation inside training), else the agent's attempt (``worker_env.span_parent``).
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from torchelastic_otel import _compat
from torchelastic_otel import _names as names
from torchelastic_otel import _selftelemetry as selftelemetry
from torchelastic_otel._export import drainer as _drainer
from torchelastic_otel._export.meters import PerPipeline
from torchelastic_otel._torch import tracebacks
from torchelastic_otel._torch.patches import Patches

__all__ = [
    "record",
    "begin",
    "end",
    "drain",
    "unit_of",
    "metric_name",
    "Integration",
    "wrap_init",
    "phase_method",
    "MAX_KEYS",
]


#: Distinct logged keys a process turns into gauges; values of further keys are dropped and counted.
MAX_KEYS = 100
#: Log calls and span events buffered between two drains before new ones are turned away (and counted).
MAX_PENDING = 4096
#: A sanitized key is cut to this many characters (OpenTelemetry's instrument names: at most 255 in all).
MAX_KEY_LENGTH = 120
_UNSAFE = re.compile(r"[^A-Za-z0-9_.]+")
#: Keys a framework uses for the step itself, not a value (Lightning's ``step``): they set the step gauge.
STEP_KEYS = frozenset({"step", "global_step"})

#: What a phase span's attributes are made of: ``(trainer, args, kwargs)`` of the call.
Attributes = Callable[[object, tuple, dict], dict[str, object]]

_local = threading.local()  # .stack: the tokens of this thread's open phases, innermost last
_tokens = itertools.count(1)


# ---- the training thread's side -------------------------------------------------------------------------------------


def record(framework: str, values: Mapping[str, object], step: int | None, split: str | None = None) -> None:
    """Buffer one log call's values (``split``: where the framework knows it; else ``hf``'s key prefixes)."""
    try:
        _buffer.put(("log", framework, dict(values), step, split))
    except Exception as exc:
        dropped(exc)


def begin(name: str, attributes: dict[str, object]) -> int:
    """Open a phase span ``name`` now; returns its token for :func:`end` (``0``: nothing was opened)."""
    try:
        from torchelastic_otel._torch.worker_env import span_parent

        token = next(_tokens)
        stack = _stack()
        parent = stack[-1] if stack else 0
        context = None if parent else span_parent()
        stack.append(token)
        _buffer.put(("begin", token, name, attributes, time.time_ns(), parent, context))
        return token
    except Exception as exc:
        dropped(exc)
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
            _buffer.put_always(("end", top, now, status))  # never turned away: an open span would leak
            if top == token:
                break
    except Exception as exc:
        dropped(exc)


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


def scalar(value: object) -> float | None:
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
        self.meter: Any = None
        self.by_key: dict[str, object] = {}
        self.step: object = None

    def meter_now(self) -> object:
        """The meter of the current pipeline (asked once a drained log call; cheap when it has not changed)."""
        meter = _meter.get()
        if meter is not self.meter:
            self.meter = meter
            self.by_key, self.step = {}, None
        return meter

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


def _make_meter(pipeline: Any) -> object:
    from torchelastic_otel.version import __version__

    return pipeline.meter_provider.get_meter("torchelastic_otel", __version__)


_meter: PerPipeline[object] = PerPipeline(_make_meter)


def _emit_log(framework: str, values: dict[str, object], step: int | None, split: str | None) -> None:
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

    def begin(
        self, token: int, name: str, attributes: dict[str, object], start: int, parent: int, context: object
    ) -> None:
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


def _export(item: tuple[Any, ...]) -> None:
    if item[0] == "log":
        _emit_log(*item[1:])
    elif item[0] == "begin":
        _spans.begin(*item[1:])
    else:
        _spans.end(*item[1:])


def dropped(exc: BaseException) -> None:
    selftelemetry.count_exception("metrics", "framework_error", exc)


#: Log calls and phase events on their way to the SDK, in the order they happened (drained completely before a
#: metric collection: the gauges are up to date).
_buffer = _drainer.ItemBuffer(MAX_PENDING, "metrics", _export, dropped)
drain = _buffer.drain_now  # export what is buffered now (the drainer does it on its own)


# ---- wrapping a framework's method in a phase span -----------------------------------------------------------------


def phase_method(original: Callable[..., object], name: str, attributes: Attributes) -> Callable[..., object]:
    """``original`` (a method) inside a phase span ``name`` with ``attributes(self, args, kwargs)``; an exception
    ends the span with status ERROR and is raised unchanged, without the wrapper's frame (``tracebacks``)."""

    @functools.wraps(original)
    def wrapper(self: object, *args: object, **kwargs: object) -> object:
        try:
            token = begin(name, attributes(self, args, kwargs))
        except Exception as exc:
            dropped(exc)
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


# ---- hooking into a framework ----------------------------------------------------------------------------------------


class Integration:
    """A framework's integration: its modules patched once the script imports them (``_torch.imports``), and
    whether it is installed -- a callback or logger of a trainer built before ``uninstall()`` then records
    nothing."""

    def __init__(self) -> None:
        self.installed = False

    def install(self, patches: Patches, hooks: dict[str, Callable[[object], None]]) -> None:
        """Run ``hooks[name](module)`` once module ``name`` is imported (at once if it is); ``patches.restore()``
        cancels the hooks that have not run and stops the integration."""
        from torchelastic_otel._torch import imports

        for name, hook in hooks.items():
            imports.when_imported(name, hook)

        def undo() -> None:
            for name, hook in hooks.items():
                imports.cancel(name, hook)
            self.installed = False

        patches.on_restore(undo)

    def patch_trainer(
        self,
        patches: Patches,
        cls: type,
        owner: str,
        attach: Callable[[object], None],
        phases: tuple[tuple[str, str, Attributes], ...],
    ) -> bool:
        """Wrap a trainer class: its ``__init__`` to ``attach`` the bridge's callback or logger (:func:`wrap_init`),
        and each method ``phases`` names (``(method, span name, attributes)``) in its phase span
        (:func:`phase_method`; one the class does not define is counted as ``<owner>.<method>``). ``False``
        (nothing done) where its ``__init__`` is wrapped already."""
        init = cls.__dict__.get("__init__")
        if init is None or getattr(init, "__torchelastic_otel__", False):
            return False
        self.installed = True
        patches.set(cls, "__init__", wrap_init(init, attach))
        for attribute, name, attributes in phases:
            original = cls.__dict__.get(attribute)
            if original is None:
                _compat.fallback(f"{owner}.{attribute}", "not defined")
                continue
            patches.set(cls, attribute, phase_method(original, name, attributes))
        return True


def wrap_init(original: Callable[..., None], attach: Callable[[object], None]) -> Callable[..., None]:
    """A trainer's ``__init__`` that runs ``original``, then ``attach(trainer)`` (the bridge's callback or logger;
    a failure is counted, never raised); an exception of ``original`` is raised unchanged, without the wrapper's
    frame (``tracebacks``)."""

    @functools.wraps(original)
    def __init__(self: object, *args: object, **kwargs: object) -> None:
        try:
            original(self, *args, **kwargs)
        except BaseException as exc:
            tracebacks.drop_own_frame(exc)
            raise
        try:
            attach(self)
        except Exception as exc:
            dropped(exc)

    __init__.__torchelastic_otel__ = True  # type: ignore[attr-defined]
    return __init__
