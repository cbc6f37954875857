"""Metric streams, mirroring ``torch.distributed.elastic.metrics.api`` name for name.

Same classes, signatures and results as torch's; the default handler discards. Configure
:class:`~torchelastic_otel.metrics.OtelMetricHandler` for a group (or as the default) to export to OpenTelemetry.
``put_metric`` skips torch's per-call ``MetricStream`` allocation while ``getStream`` and
``MetricStream.add_value`` are this module's own; once either is replaced (torch's tests patch
``metrics.api.getStream``; a user may wrap it), every value goes through the replacement, as in torch.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import time
import warnings
from collections import namedtuple
from collections.abc import Iterator
from functools import wraps

from torchelastic_otel import _selftelemetry as selftelemetry

__all__ = [
    "MetricsConfig",
    "MetricHandler",
    "ConsoleMetricHandler",
    "NullMetricHandler",
    "MetricStream",
    "configure",
    "getStream",
    "prof",
    "profile",
    "put_metric",
    "publish_metric",
    "get_elapsed_time_ms",
    "MetricData",
]

MetricData = namedtuple("MetricData", ["timestamp", "group_name", "name", "value"])


class MetricsConfig:
    """Configuration parameters handed to ``initialize_metrics`` (unused by the default implementation)."""

    __slots__ = ["params"]

    def __init__(self, params: dict[str, str] | None = None):
        self.params = params
        if self.params is None:
            self.params = {}


class MetricHandler(abc.ABC):
    """Receives every metric value of the groups it is configured for."""

    @abc.abstractmethod
    def emit(self, metric_data: MetricData):
        pass


class ConsoleMetricHandler(MetricHandler):
    """Prints ``[timestamp][group]: name=value``, as torch's does."""

    def emit(self, metric_data: MetricData):
        print(f"[{metric_data.timestamp}][{metric_data.group_name}]: {metric_data.name}={metric_data.value}")


class NullMetricHandler(MetricHandler):
    """Discards every value (the default)."""

    def emit(self, metric_data: MetricData):
        pass


class MetricStream:
    """A group's handle for adding values."""

    def __init__(self, group_name: str, handler: MetricHandler):
        self.group_name = group_name
        self.handler = handler

    def add_value(self, metric_name: str, metric_value: int):
        _emit(self.handler, MetricData(time.time(), self.group_name, metric_name, metric_value))


_metrics_map: dict[str, MetricHandler] = {}
_default_metrics_handler: MetricHandler = NullMetricHandler()


def _emit(handler: MetricHandler, data: MetricData) -> None:
    """Call a handler; a failing one is counted and logged, never raised into the job."""
    try:
        handler.emit(data)
    except Exception as exc:
        _handler_failed(exc)


def _handler_failed(exc: Exception) -> None:
    selftelemetry.count(selftelemetry.DROPPED, "metrics", "handler_error")
    logging.getLogger("torchelastic_otel").debug("metric handler failed: %s", exc, exc_info=True)


#: ``MetricData(...)`` without the namedtuple's Python-level ``__new__`` (same object; put_metric's hot path).
_new_tuple = tuple.__new__


def configure(handler: MetricHandler, group: str | None = None):
    """Send ``group``'s values to ``handler``; ``group=None`` sets the handler of every unconfigured group."""
    if group is None:
        global _default_metrics_handler
        _default_metrics_handler = handler
    else:
        _metrics_map[group] = handler


def getStream(group: str):
    """The stream of ``group``, bound to its handler as configured now."""
    handler = _metrics_map.get(group, _default_metrics_handler)
    return MetricStream(group, handler)


_own_get_stream = getStream
_own_add_value = MetricStream.add_value


def _get_metric_name(fn):
    """``Class.method`` for methods, ``module_leaf.function`` for functions (torch's naming for ``@prof``)."""
    qualname = fn.__qualname__
    split = qualname.split(".")
    if len(split) == 1:
        module = fn.__module__
        if module:
            return module.split(".")[-1] + "." + split[0]
        else:
            return split[0]
    else:
        return qualname


def prof(fn=None, group: str = "torchelastic"):
    r"""
    @profile decorator publishes duration.ms, count, success, failure metrics for the function that it decorates.

    The metric name defaults to the qualified name (``class_name.def_name``) of the function.
    If the function does not belong to a class, it uses the leaf module name instead.

    Usage

    ::

     @metrics.prof
     def x():
         pass


     @metrics.prof(group="agent")
     def y():
         pass
    """

    def wrap(f):
        @wraps(f)
        def wrapper(*args, **kwargs):
            key = _get_metric_name(f)
            try:
                start = time.time()
                result = f(*args, **kwargs)
                put_metric(f"{key}.success", 1, group)
            except Exception:
                put_metric(f"{key}.failure", 1, group)
                raise
            finally:
                put_metric(f"{key}.duration.ms", get_elapsed_time_ms(start), group)
            return result

        return wrapper

    if fn:
        return wrap(fn)
    else:
        return wrap


def profile(group=None):
    """
    @profile decorator adds latency and success/failure metrics to any given function (deprecated: use ``@prof``).

    Usage

    ::

     @metrics.profile("my_metric_group")
     def some_function(<arguments>):
    """
    warnings.warn("Deprecated, use `@prof` instead", FutureWarning, stacklevel=2)

    def wrap(func):
        @wraps(func)
        def wrapper(*args, **kwargs):
            try:
                start_time = time.time()
                result = func(*args, **kwargs)
                _publish(group, f"{func.__name__}.success", 1)
            except Exception:
                _publish(group, f"{func.__name__}.failure", 1)
                raise
            finally:
                _publish(group, f"{func.__name__}.duration.ms", get_elapsed_time_ms(start_time))
            return result

        return wrapper

    return wrap


def put_metric(metric_name: str, metric_value: int, metric_group: str = "torchelastic"):
    """
    Publish a metric data point.

    Usage

    ::

     put_metric("metric_name", 1)
     put_metric("metric_name", 1, "metric_group_name")
    """
    if getStream is not _own_get_stream or MetricStream.add_value is not _own_add_value:
        _put_through_stream(metric_name, metric_value, metric_group)
        return
    handler = _metrics_map.get(metric_group, _default_metrics_handler)
    try:
        handler.emit(_new_tuple(MetricData, (time.time(), metric_group, metric_name, metric_value)))
    except Exception as exc:
        _handler_failed(exc)


def _put_through_stream(metric_name: str, metric_value: int, metric_group: str) -> None:
    """torch's own path, ``getStream(group).add_value(name, value)``: taken when either was replaced, so that a
    patch or wrapper sees every value (``@prof`` included); a replacement that raises is counted, never raised."""
    try:
        getStream(metric_group).add_value(metric_name, metric_value)
    except Exception as exc:
        _handler_failed(exc)


def _publish(metric_group: str, metric_name: str, metric_value: int) -> None:
    getStream(metric_group).add_value(metric_name, metric_value)


def publish_metric(metric_group: str, metric_name: str, metric_value: int):
    """Deprecated: use ``put_metric(metric_name, metric_value, metric_group)``."""
    warnings.warn(
        "Deprecated, use `put_metric(metric_group)(metric_name, metric_value)` instead", FutureWarning, stacklevel=2
    )
    _publish(metric_group, metric_name, metric_value)


def get_elapsed_time_ms(start_time_in_seconds: float):
    """Return the elapsed time in millis from the given start time."""
    end_time = time.time()
    return int((end_time - start_time_in_seconds) * 1000)


@contextlib.contextmanager
def _state_restored() -> Iterator[None]:
    """Run a block (a test) and put the metric groups' handlers and the default handler back as they were (the
    module keeps torch's names for them: ``_metrics_map``, ``_default_metrics_handler``)."""
    global _default_metrics_handler
    saved, saved_default = dict(_metrics_map), _default_metrics_handler
    try:
        yield
    finally:
        _metrics_map.clear()
        _metrics_map.update(saved)
        _default_metrics_handler = saved_default
